"""train.mini_batches (issue 38 item 1): one generation batch, several optimizer steps. Each mini-batch's gradient
against a hand computation (the old policy's log-probs of every row taken once, before the first step; TRL's
normalisers), the step counts the schedule sees, and the layouts refused."""

import copy
import os
import signal
import subprocess

import pytest
import torch

from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.algo.losses import compute_loss, trained_mask
from grpo_cli.errors import SetupError
from grpo_cli.process.clock import Clock
from grpo_cli.recipe.files import load_recipe
from grpo_cli.trainer.engine import Engine
from grpo_cli.trainer.update import mini_batches

from helpers import cli, popen, read_jsonl, stable, wait_for

torch.set_num_threads(1)


def test_rows_split_in_order_into_mini_batches_of_whole_micro_batches():
    assert mini_batches(8, 1, 2) == [[slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]]
    assert mini_batches(8, 2, 2) == [[slice(0, 2), slice(2, 4)], [slice(4, 6), slice(6, 8)]]
    assert mini_batches(8, 4, 8) == [[slice(0, 2)], [slice(2, 4)], [slice(4, 6)], [slice(6, 8)]]
    assert mini_batches(3, 2, 8) == [[slice(0, 2)], [slice(2, 3)]]  # (split samples: rows not a multiple)


def _grads_per_optimizer_step(tmp_path, loss: str, k: int, mu: int = 1):
    """One PolicyUpdate of step 1's rows of ci-tiny (8 rows, micro-batches of 2) with random advantages. At each
    optimizer step: the gradient it saw, and the gradient computed by hand with a copy of the policy as it was."""
    recipe = load_recipe("recipes/ci-tiny.yaml", [f"algorithm.loss_type={loss}", f"train.mini_batches={k}",
                                                  f"algorithm.num_iterations={mu}", "train.micro_batch_size=2",
                                                  "train.learning_rate=3e-2", "checkpoint.every_steps=0"])
    eng = Engine(recipe, tmp_path)
    s = eng.rollouts.next(1, Clock(torch.device("cpu")))
    ro, mask = s.rollout, trained_mask(s.rollout, False)
    adv = torch.randn(len(ro), generator=torch.Generator().manual_seed(0))
    T = recipe.rollout.temperature

    def logps(model, sl):
        return token_logprobs(model, ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl],
                              ro.completion_mask[sl], temperature=T)[0]

    with torch.no_grad():
        old = logps(eng.policy, slice(None))  # the policy that sampled: every step's old policy
    minis, seen, drift = mini_batches(len(ro), k, 2), [], []
    step = eng.update._optimizer_step

    def checked(w):
        j = len(seen) % k
        model = copy.deepcopy(eng.policy)
        for sl in minis[j]:  # TRL: per micro-batch, its loss / accumulation steps, or over the tokens of the batch / k
            active = mask.sum() / k if loss == "dapo" else None
            lp = logps(model, sl)
            value, _ = compute_loss(eng.update.loss, lp, old[sl], adv[sl], mask[sl], num_active_tokens=active)
            (value if loss == "dapo" else value / len(minis[j])).backward()
            drift.append(((lp.detach() - old[sl]).abs() * mask[sl]).max().item())
        want = dict(model.named_parameters())
        seen.append(max((p.grad - want[n].grad).abs().max().item() for n, p in eng.policy.named_parameters()))
        return step(w)

    eng.update._optimizer_step = checked
    eng.update(ro, adv, mask)
    return seen, drift


@pytest.mark.usefixtures("model_cache")
@pytest.mark.parametrize("loss", ["dapo", "grpo"])
def test_each_mini_batch_steps_on_its_rows_against_the_old_policy_of_the_batch(tmp_path, loss):
    seen, drift = _grads_per_optimizer_step(tmp_path, loss, k=2)
    assert len(seen) == 2 and max(seen) < 1e-6, seen
    assert max(drift[2:]) > 1e-3, drift  # the second mini-batch's policy had moved: its ratio is not 1 (not vacuous)
    # mu = 2 over 2 mini-batches: 4 optimizer steps, the old policy still the sampler's
    seen, _ = _grads_per_optimizer_step(tmp_path / "mu", loss, k=2, mu=2)
    assert len(seen) == 4 and max(seen) < 1e-6, seen


@pytest.mark.usefixtures("model_cache")
def test_one_mini_batch_is_the_update_of_before(tmp_path):
    seen, drift = _grads_per_optimizer_step(tmp_path, "dapo", k=1)
    assert len(seen) == 1 and max(seen) < 1e-6 and max(drift) < 1e-6


def test_a_batch_that_does_not_split_into_mini_batches_is_refused(tmp_path):
    with pytest.raises(SetupError, match="train.mini_batches = 3"):
        Engine(load_recipe("recipes/ci-tiny.yaml", ["train.mini_batches=3", "train.micro_batch_size=2"]), tmp_path)
    with pytest.raises(SetupError, match="train.mini_batches = 16"):  # more mini-batches than rows
        Engine(load_recipe("recipes/ci-tiny.yaml", ["train.mini_batches=16"]), tmp_path / "a")
    # 24 rows in micro-batches of 8, as 2 mini-batches of 12: not whole micro-batches (as 4 of 6: one micro-batch each)
    with pytest.raises(SetupError, match="train.mini_batches = 2"):
        Engine(load_recipe("recipes/ci-tiny.yaml", ["train.prompts_per_step=6", "train.mini_batches=2",
                                                    "train.micro_batch_size=8"]), tmp_path / "b")
    Engine(load_recipe("recipes/ci-tiny.yaml", ["train.prompts_per_step=6", "train.mini_batches=4",
                                                "train.micro_batch_size=8"]), tmp_path / "c")


@pytest.mark.slow
def test_mini_batches_train_schedule_every_optimizer_step_and_resume_exactly(tmp_path):
    args = ["train.mini_batches=2", "train.micro_batch_size=2", "train.scheduler=linear", "train.learning_rate=1e-2",
            "checkpoint.every_steps=2", "train.max_steps=4", "rewards.1.name=tests/stall_rewards.py:waits_at_gate"]
    p = cli("train", "recipes/ci-tiny.yaml", "-o", tmp_path / "full", *args)
    assert p.returncode == 0, p.stderr[-3000:]
    full = read_jsonl(tmp_path / "full/metrics.jsonl")
    # a linear decay over 4 steps x 2 optimizer steps: the rate logged at each step's first optimizer step
    assert [round(m["learning_rate"] / 1e-2, 6) for m in full] == [1.0, 0.75, 0.5, 0.25]
    # killed (SIGKILL) while a later step is scored, once step 2's checkpoint is complete, then --resume auto: the
    # same steps as the straight run
    cut, gate = tmp_path / "cut", tmp_path / "gate"
    proc = popen("train", "recipes/ci-tiny.yaml", "-o", cut, *args, env={**os.environ, "GRPO_TEST_GATE": str(gate)},
                 stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cut.err", "w"))
    wait_for(lambda: (cut / "checkpoints/step-2/trainer/manifest.json").exists() or proc.poll() is not None)
    gate.touch()
    wait_for(lambda: (tmp_path / "gate.reached").exists() or proc.poll() is not None)
    proc.kill()
    assert proc.wait(60) == -signal.SIGKILL
    p = cli("train", "recipes/ci-tiny.yaml", "-o", cut, *args, "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(tmp_path / "cut/metrics.jsonl")] == [stable(m) for m in full]
