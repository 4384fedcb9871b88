"""DAPO dynamic sampling: groups without signal are replaced by newly sampled ones; the choice, the batch it
builds, and a real run (metrics, data position, exact resume)."""

import json
import math

import pytest
import torch

from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout
from grpo_cli.algo.dynamic_sampling import Round, assemble, groups_with_signal, pick_groups
from grpo_cli.train.engine import Engine
from grpo_cli.recipe.schema import load_recipe

from helpers import read_jsonl, stable

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


def _recipe(*extra):
    return load_recipe("recipes/ci-tiny.yaml", [
        "rewards=[{name: 'tests/signal_rewards.py:odd_answers_only'}]", "train.max_steps=4", "checkpoint.every_steps=2",
        "checkpoint.keep_last=null", *extra,
    ])


def _data_position(ckpt) -> dict:
    state = json.loads((ckpt / "trainer/trainer_state.json").read_text())
    return state["data"]


@pytest.mark.usefixtures("model_cache")
def test_dynamic_sampling_trains_only_on_groups_with_signal_and_resumes_exactly(tmp_path):
    Engine(_recipe(), tmp_path / "plain").fit()
    plain = read_jsonl(tmp_path / "plain/metrics.jsonl")
    assert max(m["frac_reward_zero_std"] for m in plain) > 0  # the data has groups without signal

    on = ("algorithm.dynamic_sampling.enabled=true", "algorithm.dynamic_sampling.max_rounds=8")
    Engine(_recipe(*on), tmp_path / "full").fit()
    full = read_jsonl(tmp_path / "full/metrics.jsonl")
    assert [m["frac_reward_zero_std"] for m in full] == [0.0] * 4
    assert any(m["dynamic_sampling/rounds"] > 1 for m in full)
    for m in full:  # every group sampled is trained, filtered out, or left over once B were found
        assert m["dynamic_sampling/rounds"] * 2 == 2 + m["dynamic_sampling/filtered_groups"] + m["dynamic_sampling/surplus_groups"]
    for x in read_jsonl(tmp_path / "full/rollouts.jsonl"):
        assert int(x["answer"]) % 2 == 1  # only the odd answers have signal
    # the data position counts every prompt sampled, kept or not
    rounds = [m["dynamic_sampling/rounds"] for m in full]
    assert _data_position(tmp_path / "full/checkpoints/step-4")["index"] == 2 * sum(rounds)

    cut = tmp_path / "cut"
    Engine(_recipe(*on, "train.max_steps=2"), cut).fit()
    Engine(_recipe(*on), cut, resume="auto").fit()
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in full]


@pytest.mark.usefixtures("model_cache")
def test_too_few_groups_with_signal_complete_the_batch_and_say_so(tmp_path):
    # a reward that is 0 everywhere: no group ever has signal
    r = load_recipe("recipes/ci-tiny.yaml", ["rewards=[{name: 'tests/signal_rewards.py:odd_answers_only', weight: 0.0}]",
                                             "train.max_steps=1", "checkpoint.every_steps=0",
                                             "algorithm.dynamic_sampling={enabled: true, max_rounds: 3}"])
    Engine(r, tmp_path / "run").fit()
    (m,) = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert m["dynamic_sampling/rounds"] == 3 and m["frac_reward_zero_std"] == 1.0
    assert m["dynamic_sampling/filtered_groups"] == 3 * 2 - 2 and m["dynamic_sampling/surplus_groups"] == 0
    assert len(read_jsonl(tmp_path / "run/rollouts.jsonl")) == 8  # still B*G rows trained
