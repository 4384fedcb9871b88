"""Non-finite steps (issue 35, defect 1): a non-finite loss or gradient norm on any process skips that optimizer
step on every process, is logged, counted and named; train.max_nonfinite_steps in a row stop the run; no checkpoint
is written with non-finite weights; the audit reads what the trainer writes. Real runs of the tiny model."""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.views.audit import audit

from helpers import ROOT, cli, read_jsonl

TINY = ROOT / "recipes/ci-tiny.yaml"
REWARDS = ROOT / "tests/nonfinite_rewards.py"
SKIPPED = "nonfinite/skipped_updates"
pytestmark = [pytest.mark.usefixtures("model_cache"), pytest.mark.slow]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def all_finite(checkpoint: Path) -> bool:
    return all(torch.isfinite(t).all() for t in weights(checkpoint).values())


@pytest.fixture(scope="module")
def blown_up(tmp_path_factory) -> tuple[Path, object]:
    """ci-tiny at a learning rate of 1e6: step 1's update leaves huge weights, whose gradient at step 2 is NaN."""
    run = tmp_path_factory.mktemp("lr") / "run"
    p = cli("train", str(TINY), "-o", str(run), "train.learning_rate=1e6", "train.max_steps=10",
            "train.max_nonfinite_steps=3", "checkpoint.every_steps=1", "checkpoint.keep_last=null")
    return run, p


def test_a_blown_up_run_skips_its_nonfinite_steps_and_stops_after_the_limit(blown_up):
    run, p = blown_up
    assert p.returncode == 1, p.stderr[-3000:]
    metrics = read_jsonl(run / "metrics.jsonl")
    # step 1 trains; steps 2-4 are each skipped (logged), and the third in a row stops the run
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [m[SKIPPED] for m in metrics] == [0, 1, 1, 1]
    assert [m["nonfinite/skipped_total"] for m in metrics] == [0, 1, 2, 3]
    assert math.isfinite(metrics[0]["grad_norm"]) and all("grad_norm" not in m for m in metrics[1:])
    for step in (2, 3, 4):  # a warning per skipped step names it and the first non-finite quantity
        line = next(x for x in p.stderr.splitlines() if x.startswith(f"step {step}: skipped"))
        assert "gradient of " in line and "model." in line, line
    assert "Traceback" not in p.stderr
    assert "3 steps in a row (steps 2-4)" in p.stderr and "train.learning_rate" in p.stderr
    # the skipped steps left the weights as step 1 made them: every checkpoint is finite, steps 2 and 3 equal step 1
    ckpts = sorted((run / "checkpoints").iterdir(), key=lambda c: int(c.name.split("-")[1]))
    assert [c.name for c in ckpts] == ["step-1", "step-2", "step-3"]  # the step that stopped the run saves nothing
    assert all(all_finite(c) for c in ckpts)
    w1 = weights(ckpts[0])
    assert all(torch.equal(w1[k], v) for c in ckpts[1:] for k, v in weights(c).items())


def test_the_audit_fails_on_the_steps_the_trainer_skipped(blown_up):
    run, _ = blown_up
    v = {v.check: v for v in audit(run)}["non-finite updates"]  # a 4-step run: judged all the same
    assert v.severity == "fail" and "non-finite" in v.finding, v
    assert any("steps 2-4" in e and "3 optimizer steps skipped" in e for e in v.evidence), v.evidence
    p = cli("audit", str(run))
    assert p.returncode == 2 and "non-finite" in p.stdout, p.stdout


def test_a_reward_of_1e30_is_named_and_no_update_is_taken(tmp_path):
    run = tmp_path / "huge"
    p = cli("train", str(TINY), "-o", str(run), f"rewards=[{{name: '{REWARDS}:huge'}}]", "algorithm.scale_rewards=none",
            "train.max_steps=3", "train.max_nonfinite_steps=5", "checkpoint.every_steps=3")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m[SKIPPED] for m in metrics] == [1, 1, 1]
    warnings = [x for x in p.stderr.splitlines() if ": skipped the optimizer step" in x]
    assert len(warnings) == 3 and all("reward 'huge'" in w and "1e+30" in w for w in warnings), warnings
    # no optimizer step was taken: the weights are the base model's, AdamW holds no state
    from grpo_cli.models.builtin import build_tiny

    build_tiny("tiny-qwen2", tmp_path / "base")
    base, ckpt = weights(tmp_path / "base"), weights(run / "checkpoints/step-3")
    assert base.keys() == ckpt.keys() and all(torch.equal(base[k], ckpt[k]) for k in base)
    optimizer = json.loads((run / "checkpoints/step-3/trainer/optimizer.json").read_text())
    assert optimizer["state"]["state"] == {}, optimizer["state"]  # AdamW made no moments: it never stepped


def test_an_infinite_reward_is_an_error_or_no_reward_and_never_reaches_the_update(tmp_path):
    args = ("train", str(TINY), "train.max_steps=3", "checkpoint.every_steps=3")
    p = cli(*args, "-o", str(tmp_path / "raise"), f"rewards=[{{name: '{REWARDS}:infinite'}}]")
    assert p.returncode == 1 and "reward 'infinite' returned inf" in p.stderr and "on_error: skip" in p.stderr
    run = tmp_path / "skip"
    p = cli(*args, "-o", str(run), f"rewards=[{{name: '{REWARDS}:infinite', on_error: skip}}]")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert sum(m.get("rewards/infinite/nonfinite", 0) for m in metrics) > 0  # counted, scored as no reward
    assert [m[SKIPPED] for m in metrics] == [0, 0, 0] and all(math.isfinite(m["grad_norm"]) for m in metrics)


def test_weights_made_non_finite_by_a_finite_update_are_never_saved(tmp_path):
    # a learning rate of 1e39 overflows float32 in AdamW's update: finite gradients, infinite weights
    run = tmp_path / "inf-weights"
    p = cli("train", str(TINY), "-o", str(run), "train.learning_rate=1e39", "train.max_steps=3",
            "checkpoint.every_steps=1")
    assert p.returncode == 1, p.stderr[-3000:]
    assert "not saving checkpoint step-1" in p.stderr and "not finite" in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    # without a save in between, the next step's sampling meets the weights: named, not torch.multinomial's trace
    p = cli("train", str(TINY), "-o", str(tmp_path / "sampling"), "train.learning_rate=1e39", "train.max_steps=3",
            "checkpoint.every_steps=0")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "sampling failed: the policy's next-token probabilities are NaN or infinite (parameter model." in p.stderr


@pytest.mark.multiprocess
def test_two_processes_skip_the_same_steps_and_stop_together(tmp_path):
    run = tmp_path / "mp"
    p = cli("train", str(TINY), "-o", str(run), "--num-processes", "2", "train.prompts_per_step=3",
            "train.micro_batch_size=3", "train.learning_rate=1e6", "train.max_steps=10", "train.max_nonfinite_steps=2",
            "checkpoint.every_steps=1", "checkpoint.keep_last=null",
            env={**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})
    assert p.returncode == 1, p.stderr[-3000:]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m[SKIPPED] for m in metrics] == [0, 1, 1]
    assert p.stderr.count("step 2: skipped the optimizer step") == 1  # the main process says it, for both
    assert p.stderr.count("2 steps in a row (steps 2-3)") >= 1
    ckpts = sorted((run / "checkpoints").iterdir())
    assert [c.name for c in ckpts] == ["step-1", "step-2"] and all(all_finite(c) for c in ckpts)
