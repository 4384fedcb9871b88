"""DAPO dynamic sampling: groups without signal are replaced by newly sampled ones; the choice, the batch it
builds, and a real run (metrics, data position, exact resume)."""

import math

import torch

from grpo_cli.algo.advantages import groups_with_signal
from grpo_cli.algo.dynamic_sampling import Round, assemble, pick_groups
from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout

torch.set_num_threads(1)


def test_groups_with_signal_ignore_missing_rewards():
    nan = math.nan
    total = torch.tensor([1.0, 1.0, 0.0, 1.0, nan, 2.0, nan, nan])
    assert groups_with_signal(total, 2) == [False, True, False, False]  # one value or none: no spread


def test_pick_groups_takes_signal_in_generation_order_then_completes_earliest_first():
    assert pick_groups([[False, True, False], [True, True, True]], 3) == [(0, 1), (1, 0), (1, 1)]
    assert pick_groups([[False, True], [False, False]], 2) == [(0, 1), (0, 0)]  # short: completed, earliest first
    assert pick_groups([[True, True]], 2) == [(0, 0), (0, 1)]


def _round(prompt_len: int, T: int, base: int, errors: int) -> Round:
    N, G = 4, 2
    prompt_ids = torch.arange(N * prompt_len).view(N, prompt_len) + 100 * base
    rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids),
                      completion_ids=torch.arange(N * T).view(N, T) + 100 * base, completion_mask=torch.ones(N, T, dtype=torch.long),
                      truncated=torch.tensor([False, True, False, False]), prompts=[f"p{base}{i // G}" for i in range(N)],
                      completions=[f"c{base}{i}" for i in range(N)], sampling_logps=torch.full((N, T), -float(base)))
    rewards = RewardResult(total=[float(base + i) for i in range(N)], per_function={"f": [float(base + i) for i in range(N)]},
                           errors={"f": errors})
    batch = PromptBatch(texts=[f"p{base}0", f"p{base}1"], input_ids=[[1], [2]], columns={"answer": [f"a{base}0", f"a{base}1"]},
                        indices=[10 * base, 10 * base + 1])
    return Round(batch=batch, rollout=rollout, rewards=rewards, total=torch.tensor(rewards.total))


def test_assemble_puts_the_picked_groups_in_pick_order_and_repads():
    rounds = [_round(prompt_len=3, T=2, base=0, errors=1), _round(prompt_len=5, T=4, base=1, errors=2)]
    out = assemble(rounds, [(1, 1), (0, 0)], group_size=2, pad_id=7)
    assert out.batch.texts == ["p11", "p00"] and out.batch.indices == [11, 0] and out.batch.columns == {"answer": ["a11", "a00"]}
    assert out.rollout.completions == ["c12", "c13", "c00", "c01"]
    assert out.total.tolist() == [3.0, 4.0, 0.0, 1.0] and out.rewards.per_function == {"f": [3.0, 4.0, 0.0, 1.0]}
    assert out.rewards.errors == {"f": 3}  # every round's scoring calls
    assert out.rollout.prompt_ids.shape == (4, 5) and out.rollout.completion_ids.shape == (4, 4)
    # round 0's prompts padded on the left, its completions on the right, masks and log-probs alike
    assert out.rollout.prompt_ids[2].tolist() == [7, 7, 0, 1, 2] and out.rollout.prompt_mask[2].tolist() == [0, 0, 1, 1, 1]
    assert out.rollout.completion_ids[3].tolist() == [2, 3, 7, 7] and out.rollout.completion_mask[3].tolist() == [1, 1, 0, 0]
    assert out.rollout.sampling_logps[0].tolist() == [-1.0] * 4 and out.rollout.sampling_logps[2].tolist() == [0, 0, 0, 0]
    assert out.rollout.truncated.tolist() == [False, False, False, True]
