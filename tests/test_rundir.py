"""The run folder: where a run starts, what --start-over deletes, recipe drift on resume, the run lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_cli.run import lock as runlock
from grpo_cli.run.checkpoints import (
    CheckpointError, list_checkpoints, load_training_state, save_checkpoint, verify_checkpoint,
)
from grpo_cli.recipe.schema import load_recipe, recipe_to_yaml
from grpo_cli.run.folder import (
    RECIPE_CHANGES, RunFolderError, apply_optimizer_changes, check_drift, recipe_changes, resumable, start_point,
)

from test_checkpoint import RECIPE, make_opt, tiny_model, tiny_tokenizer, train_step, batch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes/ci-tiny.yaml"


def save(run: Path, step: int, model, recipe_yaml: str = RECIPE) -> Path:
    return save_checkpoint(run, step, model=model, tokenizer=None, optimizer=None, scheduler=None,
                           recipe_yaml=recipe_yaml, trainer_state={"step": step}, keep_last=None)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def collect(run: Path, resume, **kw) -> tuple[Path | None, list[str]]:
    said: list[str] = []
    return start_point(run, resume, say=said.append, **kw), said


# ------------------------------------------------------------------------------------------- where to start


def test_empty_or_new_folder_starts_at_step_1(tmp_path):
    assert collect(tmp_path / "new", None) == (None, [])
    path, said = collect(tmp_path / "new", "auto")
    assert path is None and said == [f"--resume auto: no checkpoint in {tmp_path / 'new'} yet; training from step 1"]
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "metrics.jsonl").write_text("")  # a run that died before its first step logged nothing
    assert collect(tmp_path / "new", None) == (None, [])


def test_fresh_start_on_a_run_is_refused(tmp_path, model):
    save(tmp_path, 2, model)
    with pytest.raises(RunFolderError, match=r"already holds a run \(checkpoints up to step-2\): pass --resume auto.*--start-over"):
        start_point(tmp_path, None)


def test_logs_without_a_checkpoint_are_refused_not_truncated(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    for resume in (None, "auto"):
        with pytest.raises(RunFolderError, match=r"metrics\.jsonl \(2 lines\).*--start-over"):
            start_point(tmp_path, resume)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


def test_all_manifests_removed_is_refused_and_named(tmp_path, model):
    for step in (2, 4):
        (save(tmp_path, step, model) / "trainer/manifest.json").unlink()
    assert list_checkpoints(tmp_path) == []
    with pytest.raises(RunFolderError, match=r"no complete checkpoint to resume from.*step-2, step-4 without a manifest"):
        start_point(tmp_path, "auto")


def test_newest_manifest_removed_is_skipped_by_name(tmp_path, model):
    save(tmp_path, 2, model)
    (save(tmp_path, 4, model) / "trainer/manifest.json").unlink()
    path, said = collect(tmp_path, "auto")
    assert path == tmp_path / "checkpoints/step-2"
    assert said == ["--resume auto: skipping step-4 (no manifest: the save was interrupted); resuming from step-2"]


def test_corrupted_newest_is_refused_not_passed_over(tmp_path, model):
    save(tmp_path, 2, model)
    weights = save(tmp_path, 4, model) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"step-4 is corrupted: model\.safetensors"):
        start_point(tmp_path, "auto")


def test_start_over_deletes_only_the_runs_outputs(tmp_path, model):
    save(tmp_path, 2, model)
    for name in ("metrics.jsonl", "rollouts.jsonl", "recipe.yaml", RECIPE_CHANGES, "notes.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "eval").mkdir()
    path, said = collect(tmp_path, None, start_over=True)
    assert path is None
    assert said == [f"--start-over: deleted metrics.jsonl, rollouts.jsonl, checkpoints/, recipe.yaml, {RECIPE_CHANGES} "
                    f"in {tmp_path}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "notes.txt"]
    with pytest.raises(RunFolderError, match="pass one of them"):
        start_point(tmp_path, "auto", start_over=True)


# ------------------------------------------------------------------------------------------- recipe drift


def test_drift_classifies_and_lists_fields():
    old = load_recipe(TINY).model_dump(mode="json")
    new = load_recipe(TINY, ["train.learning_rate=0.01", "train.max_steps=9", "checkpoint.keep_last=5",
                             "eval={every_steps: 2}", "rewards.0.kwargs={mode: boxed}"]).model_dump(mode="json")
    changes = recipe_changes(old, new)
    assert changes["train.learning_rate"] == (1e-3, 0.01) and changes["train.max_steps"] == (4, 9)
    assert changes["rewards.0.kwargs.mode"] == ("<unset>", "boxed")
    assert {k for k in changes if resumable(k)} == {"train.max_steps", "checkpoint.keep_last"} | {
        k for k in changes if k.startswith("eval")}
    assert not resumable("train.learning_rate") and not resumable("evaluation") and resumable("eval.limit")


def test_drift_is_refused_unless_allowed(tmp_path, model):
    ckpt = save(tmp_path, 2, model, recipe_yaml=recipe_to_yaml(load_recipe(TINY)))  # as train saves it: paths absolute
    new = load_recipe(TINY, ["train.learning_rate=0.01", "algorithm.num_generations=2", "train.max_steps=8"])
    with pytest.raises(RunFolderError) as e:
        check_drift(ckpt, new.model_dump(mode="json"), allow=False)
    msg = str(e.value)
    assert "  algorithm.num_generations: 4 -> 2\n  train.learning_rate: 0.001 -> 0.01\n" in msg
    assert "train.max_steps" not in msg.split("only")[0] and "--allow-recipe-change" in msg
    allowed = check_drift(ckpt, new.model_dump(mode="json"), allow=True)
    assert set(allowed) == {"algorithm.num_generations", "train.learning_rate", "train.max_steps"}
    same = load_recipe(TINY, ["train.max_steps=8", "logging.every_steps=3"])
    assert set(check_drift(ckpt, same.model_dump(mode="json"), allow=False)) == {"train.max_steps", "logging.every_steps"}


def test_changed_optimizer_settings_reach_the_restored_optimizer(tmp_path):
    from grpo_cli.train.optim import make_scheduler

    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = make_scheduler(opt, "linear", 2, 10)
    for s in range(3):
        train_step(model, opt, sched, batch(s))
    path = save_checkpoint(tmp_path, 3, model=model, tokenizer=None, optimizer=opt, scheduler=sched,
                           recipe_yaml=RECIPE, trainer_state={"step": 3}, keep_last=None)
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, betas=(0.8, 0.9))
    sched2 = make_scheduler(opt2, "linear", 2, 10)
    load_training_state(path, optimizer=opt2, scheduler=sched2)
    assert opt2.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 1 / 8))  # the checkpoint's: old rate restored
    train = load_recipe(TINY, ["train.learning_rate=0.01", "train.weight_decay=0.1", "train.adam_beta1=0.8",
                               "train.adam_beta2=0.9"]).train
    apply_optimizer_changes(opt2, sched2, {"train.learning_rate", "train.weight_decay", "train.adam_beta1"}, train)
    g = opt2.param_groups[0]
    assert g["lr"] == pytest.approx(0.01 * (1 - 1 / 8)) and g["weight_decay"] == 0.1 and g["betas"] == (0.8, 0.9)
    train_step(model, opt2, sched2, batch(9))
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.01 * (1 - 2 / 8))  # the schedule goes on from the new rate


# ------------------------------------------------------------------------------------------- the lock


def test_lock_is_exclusive_across_processes_and_released_on_kill(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from grpo_cli.run import lock as runlock; runlock.acquire(sys.argv[1]); print('held', flush=True); "
        "time.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runlock.RunLockedError, match=rf"in use by another trainer \(pid {holder.pid} on host "
                                                         rf"{os.uname().nodename}, started .*: -c"):
            runlock.acquire(tmp_path)
        holder.kill()  # kill -9: the kernel releases the lock; the stale file does not block anyone
        holder.wait(10)
        key = runlock.acquire(tmp_path)
        assert json.loads((tmp_path / runlock.LOCK_FILE).read_text())["pid"] == os.getpid()
        assert runlock.acquire(tmp_path) == key  # re-entrant within a process
        runlock.release(key)
        assert runlock.holds(tmp_path)
        runlock.release(key)
        assert not runlock.holds(tmp_path)
    finally:
        holder.kill()
        holder.wait(10)


def test_format_1_checkpoints_still_resume(tmp_path, model):
    """Checkpoints written before the trainer/ subfolder (state and manifest at the top level)."""
    opt, sched = make_opt(model)
    train_step(model, opt, sched, batch(0))
    path = save_checkpoint(tmp_path, 1, model=model, tokenizer=tiny_tokenizer(), optimizer=opt, scheduler=sched,
                           recipe_yaml=RECIPE, trainer_state={"step": 1}, keep_last=None)
    state = path / "trainer"
    manifest = json.loads((state / "manifest.json").read_text())
    for f in state.iterdir():
        f.rename(path / f.name)
    state.rmdir()
    files = {k.removeprefix("trainer/"): v for k, v in manifest["files"].items()}
    (path / "manifest.json").write_text(json.dumps({"step": 1, "files": files, "format": 1}))
    assert list_checkpoints(tmp_path) == [path]
    verify_checkpoint(path)
    assert start_point(tmp_path, "auto", say=lambda _: None) == path
    opt2, sched2 = make_opt(tiny_model())
    assert load_training_state(path, optimizer=opt2, scheduler=sched2) == {"step": 1, "rng_restored": True}
    assert sched2.last_epoch == 1
    assert check_drift(path, {"name": "tiny", "train": {"max_steps": 3}}, allow=False) == {}
