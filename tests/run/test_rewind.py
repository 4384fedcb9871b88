"""Rewinds that stay rewound (issue 35, defect 2), through the CLI on the tiny model, with kill -9 at each point: a
resume from a checkpoint before the folder's newest is refused without --rewind; --rewind sets the later
checkpoints, replay records and log lines aside (kept); retention never deletes the running branch; a save killed
between its renames is moved into place at the next start instead of deleted for its `.tmp-` name."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.run.checkpoints import list_checkpoints, verify_checkpoint

from helpers import ROOT, cli, read_jsonl, stable, wait_for

TINY = str(ROOT / "recipes/ci-tiny.yaml")
GATE_REWARD = "rewards.1.name=tests/stall_rewards.py:waits_at_gate"  # scores like digit_fraction; holds at a gate
SAVES = ("checkpoint.every_steps=1", "checkpoint.keep_last=4")
NEW_LR = ("--allow-recipe-change", "train.learning_rate=5e-4")  # the branch after the rewind learns differently
pytestmark = [pytest.mark.usefixtures("model_cache"), pytest.mark.slow]


def train(run: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli("train", TINY, "-o", str(run), GATE_REWARD, *SAVES, *args, env={**os.environ, **(env or {})})


def killed_at_rename(text: str, n: int = 1) -> dict:
    """The environment that makes the trainer SIGKILL itself at the n-th os.rename of a path holding `text`."""
    return {"PYTHONPATH": str(ROOT / "tests/crash"), "GRPO_TEST_KILL_ON_RENAME": f"{text}:{n}"}


def names(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.iterdir()), key=lambda n: (len(n), n)) if folder.is_dir() else []


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> Path:
    """6 steps, a checkpoint every step, the last 4 kept: step-3 .. step-6, replay records of steps 4-6."""
    run = tmp_path_factory.mktemp("base") / "run"
    p = train(run, "train.max_steps=6")
    assert p.returncode == 0, p.stderr[-3000:]
    assert names(run / "checkpoints") == ["step-3", "step-4", "step-5", "step-6"]
    return run


@pytest.fixture
def run(six_steps, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(six_steps, copy)
    return copy


def the_one_abandoned(run: Path) -> Path:
    (folder,) = (run / "abandoned").iterdir()
    return folder


def test_resuming_an_earlier_checkpoint_without_rewind_is_refused_and_changes_nothing(run):
    p = train(run, "--resume", str(run / "checkpoints/step-3"), "train.max_steps=8")
    assert p.returncode == 2, p.stderr[-3000:]
    assert "holds later checkpoints (step-4, step-5, step-6)" in p.stderr and "--rewind" in p.stderr
    assert "Traceback" not in p.stderr
    assert names(run / "checkpoints") == ["step-3", "step-4", "step-5", "step-6"]
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_a_rewind_sets_the_later_branch_aside_and_resume_auto_stays_on_the_new_one(run):
    old_metrics = read_jsonl(run / "metrics.jsonl")
    p = train(run, "--resume", str(run / "checkpoints/step-3"), "--rewind", *NEW_LR, "train.max_steps=5")
    assert p.returncode == 0, p.stderr[-3000:]
    aside = the_one_abandoned(run)
    assert aside.name.endswith("-rewind-to-step-3") and f"kept in {aside}" in p.stdout + p.stderr
    assert names(aside / "checkpoints") == ["step-4", "step-5", "step-6"]
    for c in (aside / "checkpoints").iterdir():
        verify_checkpoint(c)  # moved whole: their manifests still hold
    assert names(aside / "replay") == ["step-4", "step-5", "step-6"]
    assert read_jsonl(aside / "metrics.jsonl") == old_metrics[3:]  # the abandoned steps' lines, as they were
    assert json.loads((aside / "rewind.json").read_text())["done"] is True
    assert names(run / "checkpoints") == ["step-3", "step-4", "step-5"]

    # later: --resume auto continues the new branch (step-5), and retention (keep_last 4) deletes only its past
    p = train(run, "--resume", "auto", "train.learning_rate=5e-4", "train.max_steps=8")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints/step-5'}" in p.stdout + p.stderr
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert [m["learning_rate"] for m in metrics] == [1e-3] * 3 + [5e-4] * 5
    assert stable(metrics[2]) == stable(old_metrics[2])  # the shared past is untouched
    assert names(run / "checkpoints") == ["step-5", "step-6", "step-7", "step-8"]
    assert names(aside / "checkpoints") == ["step-4", "step-5", "step-6"]  # still kept


def test_a_rewind_killed_between_its_moves_is_finished_by_the_next_start(run):
    p = train(run, "--resume", str(run / "checkpoints/step-3"), "--rewind", *NEW_LR, "train.max_steps=5",
              env=killed_at_rename("checkpoints/step-", 2))  # after step-4 moved, before step-5
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    aside = the_one_abandoned(run)
    assert names(aside / "checkpoints") == ["step-4"] and not json.loads((aside / "rewind.json").read_text())["done"]
    assert names(run / "checkpoints") == ["step-3", "step-5", "step-6"]  # the kill left the old branch half moved

    p = train(run, "--resume", "auto", *NEW_LR, "train.max_steps=5")  # without --rewind: it was asked for before
    assert p.returncode == 0, p.stderr[-3000:]
    assert "finished the rewind to step 3 that was interrupted" in p.stdout + p.stderr
    assert f"resumed from {run / 'checkpoints/step-3'}" in p.stdout + p.stderr
    assert names(aside / "checkpoints") == ["step-4", "step-5", "step-6"]
    assert names(run / "checkpoints") == ["step-3", "step-4", "step-5"]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert [m["learning_rate"] for m in metrics] == [1e-3] * 3 + [5e-4] * 2
    assert [m["step"] for m in read_jsonl(aside / "metrics.jsonl")] == [4, 5, 6]


def test_a_kill_in_the_new_branch_before_its_first_save_resumes_the_new_branch(run, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    argv = [sys.executable, "-m", "grpo_cli", "train", TINY, "-o", str(run), GATE_REWARD, "--resume",
            str(run / "checkpoints/step-3"), "--rewind", *NEW_LR, "train.max_steps=5"]
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "GRPO_TEST_GATE": str(gate)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: Path(f"{gate}.reached").exists(), proc=proc)  # step 4 is being scored
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert names(run / "checkpoints") == ["step-3"]  # the rewind had finished; the new branch saved nothing yet
    p = train(run, "--resume", "auto", *NEW_LR, "train.max_steps=5")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints/step-3'}" in p.stdout + p.stderr
    assert [m["learning_rate"] for m in read_jsonl(run / "metrics.jsonl")] == [1e-3] * 3 + [5e-4] * 2


def test_a_save_killed_between_its_two_renames_is_moved_into_place(tmp_path):
    # a straight 6-step run, and one whose step-4 save is interrupted while replacing an incomplete step-4 folder
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert train(straight, "train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=null").returncode == 0
    assert train(run, "train.max_steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=null").returncode == 0
    (run / "checkpoints/step-4/trainer/manifest.json").unlink()  # step-4 lost its manifest: an interrupted copy
    p = train(run, "--resume", "auto", "train.max_steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=null",
              env=killed_at_rename(".tmp-step-4"))  # step-4 saved again: killed before its folder moves into place
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    left = names(run / "checkpoints")
    assert left[0] == "step-2" and len(left) == 3 and {n.rsplit("-", 1)[0] for n in left[1:]} == \
        {".tmp-step-4", ".tmp-old-step-4"}, left

    p = train(run, "--resume", "auto", "train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=null")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "step-4: its save was complete when the run stopped" in out, out[-3000:]
    assert f"resumed from {run / 'checkpoints/step-4'}" in out
    assert [p.name for p in list_checkpoints(run)] == ["step-2", "step-4", "step-6"]
    assert not [n for n in names(run / "checkpoints") if n.startswith(".tmp-")]  # the incomplete old copy is gone
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(run / "metrics.jsonl")
    assert [stable(m) for m in a] == [stable(m) for m in b]
