"""The run folder: where a run starts, what --start-over deletes, recipe drift on resume, the run lock.

And what `grpo train` does with a run folder, through the CLI: Real `grpo train` processes on one run folder: the lock, interrupted saves, recipe drift, signals, a full disk.

Every test here reproduces a way the run folder lost data or changed silently before issue 9; each runs
the CLI in subprocesses on the tiny recipe (a few seconds a run), from a copy of one base run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_cli.errors import CheckpointError, RunFolderError
from grpo_cli.recipe.files import load_recipe, recipe_to_yaml
from grpo_cli.run import lock as runlock
from grpo_cli.run.checkpoint_io import load_training_state, save_checkpoint
from grpo_cli.run.checkpoints import list_checkpoints, verify_checkpoint
from grpo_cli.run.folder import (
    RECIPE_CHANGES,
    apply_optimizer_changes,
    check_drift,
    recipe_changes,
    record_resume,
    resumable,
    start_point,
)

from helpers import RECIPE, ROOT, batch, cli, make_opt, read_jsonl, tiny_model, tiny_tokenizer, train_step, wait_for

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
    for name in ("metrics.jsonl", "rollouts.jsonl", "recipe.yaml", RECIPE_CHANGES, "resumes.jsonl", "notes.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "eval").mkdir()
    path, said = collect(tmp_path, None, start_over=True)
    assert path is None
    assert said == [f"--start-over: deleted metrics.jsonl, rollouts.jsonl, checkpoints/, recipe.yaml, {RECIPE_CHANGES}, "
                    f"resumes.jsonl in {tmp_path}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "notes.txt"]
    with pytest.raises(RunFolderError, match="pass one of them"):
        start_point(tmp_path, "auto", start_over=True)


def test_each_resume_is_recorded_and_a_rewind_drops_the_later_ones(tmp_path):
    record_resume(tmp_path, tmp_path / "checkpoints" / "step-4", 5, {})
    record_resume(tmp_path, tmp_path / "checkpoints" / "step-8", 9, {"train.max_steps": (8, 12), "eval.every": (0, 4)})
    rows = read_jsonl(tmp_path / "resumes.jsonl")
    assert [(r["from_step"], Path(r["checkpoint"]).name, r["recipe_changes"]) for r in rows] == [
        (5, "step-4", []), (9, "step-8", ["eval.every", "train.max_steps"])]
    # resumed again from step 6: the run no longer went through the resume at step 9
    record_resume(tmp_path, tmp_path / "checkpoints" / "step-6", 7, {})
    assert [r["from_step"] for r in read_jsonl(tmp_path / "resumes.jsonl")] == [5, 7]


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
    assert resumable("train.stall_timeout_s")  # a stall stopped the run: raise the limit and resume


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
    from grpo_cli.trainer.setup import make_scheduler

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


pytestmark = pytest.mark.usefixtures("model_cache")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """ci-tiny, 4 steps: checkpoints step-2 and step-4."""
    run = tmp_path_factory.mktemp("base") / "run"
    with pytest.MonkeyPatch.context() as mp:  # the model cache of conftest's model_cache fixture
        mp.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "grpo-cache"))
        p = cli("train", TINY, "-o", str(run))
    assert p.returncode == 0, p.stderr
    return run


def copy_run(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst)
    return dst


def popen_train(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grpo_cli", "train", *args], cwd=ROOT, env=os.environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.slow
def test_a_second_trainer_on_a_busy_folder_exits_2_naming_the_first(tmp_path, monkeypatch):
    run, gate = tmp_path / "run", tmp_path / "gate"
    # the first trainer holds in its first reward call until the three attempts are done (it once finished its 30
    # steps before the last attempt on a loaded machine, which then found the folder free)
    gate.touch()
    monkeypatch.setenv("GRPO_TEST_GATE", str(gate))
    first = popen_train(TINY, "-o", str(run), "train.max_steps=30", "checkpoint.every_steps=5",
                        "rewards.1.name=tests/stall_rewards.py:waits_at_gate")
    try:
        wait_for(lambda: Path(f"{gate}.reached").exists(), proc=first)
        for extra in ([], ["--resume", "auto"], ["--start-over"]):
            t0 = time.monotonic()
            second = cli("train", TINY, "-o", str(run), *extra, timeout=120)
            took = time.monotonic() - t0
            print(f"second trainer {extra} refused after {took:.1f} s")
            assert second.returncode == 2, second.stderr
            assert f"run folder {run.resolve()} is in use by another trainer (pid {first.pid} on host " \
                   f"{socket.gethostname()}" in second.stderr
            assert "Traceback" not in second.stderr and took < 60
        gate.unlink()
        out, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert f"done: 30 steps in {run}" in out
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(1, 31))
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-25", "step-30"]
    for step in (25, 30):
        verify_checkpoint(run / f"checkpoints/step-{step}")


@pytest.mark.slow
def test_interrupted_saves_and_logs_are_never_silently_rewound(base_run, tmp_path):
    run = copy_run(base_run, tmp_path / "run")
    (run / "checkpoints/step-4/trainer/manifest.json").unlink()  # the newest save was interrupted
    p = cli("train", TINY, "-o", str(run), "--resume", "auto", "train.max_steps=5")
    assert p.returncode == 0, p.stderr
    assert "--resume auto: skipping step-4 (no manifest: the save was interrupted); resuming from step-2" in p.stdout
    assert "metrics.jsonl: dropped 2 lines of steps after 2" in p.stdout
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]

    for manifest in run.glob("checkpoints/step-*/trainer/manifest.json"):  # now no complete checkpoint at all
        manifest.unlink()
    before = (run / "metrics.jsonl").read_text()
    p = cli("train", TINY, "-o", str(run), "--resume", "auto")  # a fresh start is refused alike (test_rundir.py)
    assert p.returncode == 2, p.stderr
    assert "--resume auto: " in p.stderr and "holds no complete checkpoint to resume from" in p.stderr
    assert "metrics.jsonl (5 lines)" in p.stderr and "step-4, step-5 without a manifest" in p.stderr
    assert "--start-over" in p.stderr and "Traceback" not in p.stderr
    assert (run / "metrics.jsonl").read_text() == before  # nothing truncated, nothing trained

    p = cli("train", TINY, "-o", str(run), "--start-over", "train.max_steps=2")
    assert p.returncode == 0, p.stderr
    assert "--start-over: deleted metrics.jsonl, rollouts.jsonl, checkpoints/, recipe.yaml" in p.stdout
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2]


@pytest.mark.slow
def test_recipe_drift_on_resume_is_refused_or_applied_and_recorded(base_run, tmp_path):
    run = copy_run(base_run, tmp_path / "run")
    before = (run / "metrics.jsonl").read_text()
    p = cli("train", TINY, "-o", str(run), "--resume", "auto", "train.max_steps=6", "train.learning_rate=0.01",
            "algorithm.num_generations=2")
    assert p.returncode == 2, p.stderr
    assert "  algorithm.num_generations: 4 -> 2\n  train.learning_rate: 0.001 -> 0.01\n" in p.stderr
    assert "--allow-recipe-change" in p.stderr and "Traceback" not in p.stderr
    assert (run / "metrics.jsonl").read_text() == before and not (run / "recipe_changes.jsonl").exists()

    p = cli("train", TINY, "-o", str(run), "--resume", "auto", "train.max_steps=6", "train.learning_rate=0.01",
            "--allow-recipe-change")
    assert p.returncode == 0, p.stderr
    assert "resume applies from step 5 on (recorded in recipe_changes.jsonl):\n  train.max_steps: 4 -> 6" in p.stdout
    assert "applied on request from step 5 on" in p.stdout and "train.learning_rate: 0.001 -> 0.01" in p.stdout
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["learning_rate"] for m in metrics] == [1e-3] * 4 + [0.01] * 2  # the optimizer got the new rate
    [record] = read_jsonl(run / "recipe_changes.jsonl")
    assert record["from_step"] == 5 and record["checkpoint"].endswith("checkpoints/step-4")
    assert record["changes"] == {"train.learning_rate": {"old": 1e-3, "new": 0.01, "resumable": False},
                                 "train.max_steps": {"old": 4, "new": 6, "resumable": True}}
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.run.folder import check_drift

    now = load_recipe(TINY, ["train.max_steps=6", "train.learning_rate=0.01"]).model_dump(mode="json")
    assert check_drift(run / "checkpoints/step-6", now, allow=False) == {}  # step-6 holds the new recipe


@pytest.mark.slow
def test_sigint_exits_130_and_says_when_nothing_was_saved(tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\n\ndef slow(completions, **kw):\n    time.sleep(0.5)\n    return [0.0] * len(completions)\n")
    args = [TINY, "train.max_steps=50", "checkpoint.every_steps=0", f"rewards=[{{name: '{slow}:slow'}}]"]
    run = tmp_path / "once"
    p = popen_train(*args, "-o", str(run))
    wait_for(lambda: lines(run / "metrics.jsonl") >= 1, proc=p)
    p.send_signal(signal.SIGINT)  # one Ctrl-C: finish the step, save, exit 130 as a shell expects
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    saved = sorted(x.name for x in (run / "checkpoints").iterdir())
    assert len(saved) == 1 and "stopped by signal after step" in err
    verify_checkpoint(run / "checkpoints" / saved[0])

    run = tmp_path / "twice"
    p = popen_train(*args, "-o", str(run))
    wait_for(lambda: lines(run / "metrics.jsonl") >= 1, proc=p)
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)
    p.send_signal(signal.SIGINT)  # a second one while the step's reward still runs: leave at once
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted before the first checkpoint: nothing to resume (start again with --start-over)" in err
    assert "intact" not in err and "Traceback" not in err
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


def _mount_tmpfs(path: Path, size_kib: int) -> None:
    path.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip() or out.returncode}); needs root or CAP_SYS_ADMIN")


@pytest.mark.slow
def test_full_disk_is_a_message_and_the_last_checkpoint_stays_intact(base_run, tmp_path):
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    ckpt_kib = sum(f.stat().st_size for f in (base_run / "checkpoints/step-2").rglob("*") if f.is_file()) // 1024
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, ckpt_kib * 3 // 2 + 256)  # room for one checkpoint and the logs, not for two
    try:
        run = disk / "run"
        p = cli("train", TINY, "-o", str(run), "checkpoint.keep_last=null")
        assert p.returncode == 1, p.stderr
        assert f"error: could not save checkpoint step-4 to {run}/checkpoints: " in p.stderr
        assert "No space left on device" in p.stderr and "MiB free on that file system" in p.stderr
        assert "the previous checkpoints are untouched" in p.stderr and "Traceback" not in p.stderr
        assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step-2"]  # no half-written save left
        verify_checkpoint(run / "checkpoints/step-2")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_eval_and_export_verify_the_manifest(base_run, tmp_path):
    from grpo_cli.errors import CheckpointError
    from grpo_cli.eval.targets import resolve_target
    from grpo_cli.models.export import export_checkpoint

    run = copy_run(base_run, tmp_path / "run")
    weights = run / "checkpoints/step-4/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    flipped = "checkpoint step-4 is corrupted: model.safetensors does not match its sha256"
    p = cli("eval", str(run / "checkpoints/step-4"), "--limit", "2", "-o", str(tmp_path / "ev"))
    assert p.returncode == 1 and flipped in p.stderr and "Traceback" not in p.stderr, p.stderr
    for check in (lambda: resolve_target(str(run), None),  # a run folder: its newest checkpoint
                  lambda: export_checkpoint(run / "checkpoints/step-4", tmp_path / "out")):
        with pytest.raises(CheckpointError, match=flipped):
            check()
    (run / "checkpoints/step-2/trainer/manifest.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint step-2 is incomplete"):
        resolve_target(str(run / "checkpoints/step-2"), None)


@pytest.mark.slow
def test_a_checkpoint_is_a_model_folder(base_run):
    ckpt = base_run / "checkpoints/step-4"
    top = sorted(p.name for p in ckpt.iterdir())
    assert top == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                   "tokenizer.json", "tokenizer_config.json", "trainer"], top
    assert sorted(p.name for p in (ckpt / "trainer").iterdir()) == [
        "manifest.json", "optimizer.json", "optimizer.safetensors", "recipe.yaml", "scheduler.json", "trainer_state.json"]
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.relative_to(ckpt).as_posix(): p.stat().st_mode & 0o777 for p in ckpt.rglob("*")}
    assert all(m == (0o777 if (ckpt / k).is_dir() else 0o666) & ~umask for k, m in modes.items()), modes
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert AutoTokenizer.from_pretrained(ckpt)("1 + 2")["input_ids"] and model.config.model_type == "qwen2"
    state = json.loads((ckpt / "trainer/trainer_state.json").read_text())
    assert state["step"] == 4


@pytest.mark.slow
def test_a_run_ends_with_what_it_learned_and_what_to_run_next(base_run, tmp_path):
    # issue 22: it ended with "done: 4 steps in RUN"; re-running a finished run loaded the model and recorded a
    # recipe change that never trained
    run = copy_run(base_run, tmp_path / "run")
    metrics = read_jsonl(run / "metrics.jsonl")
    before = (run / "metrics.jsonl").read_text()
    p = cli("train", TINY, "-o", str(run), "--resume", "auto", "train.threads=auto", "checkpoint.keep_last=3")
    assert p.returncode == 0, p.stderr
    assert f"{run} has finished: step 4 of train.max_steps 4" in p.stdout
    assert "policy:" not in p.stdout + p.stderr  # no model loaded
    assert (run / "metrics.jsonl").read_text() == before and not (run / "recipe_changes.jsonl").exists()
    # the summary: first vs last reward (a quarter of a 4-step run each: steps 1 and 4), where the run is, what next
    first, last = metrics[0]["reward"], metrics[-1]["reward"]
    assert f"done: 4 steps in {run}\n  reward {first:.3f} (step 1) -> {last:.3f} (step 4)" in p.stdout
    assert f"  checkpoint {run / 'checkpoints/step-4'}" in p.stdout
    # eval names the run, whose checkpoint holds the recipe it trained with (overrides included), not the file
    for command in (f"grpo eval base {run}    #", f"grpo inspect-rollouts {run}", f"grpo report {run}",
                    f"grpo export {run} --merge models/run"):
        assert command in p.stdout, p.stdout
    assert "--recipe" not in p.stdout


def test_the_summary_of_metrics_by_hand(tmp_path):
    from grpo_cli.views.summary import end_of_run, reward_change

    rows = [{"step": s, "reward": s / 40} for s in range(1, 41)]
    rows[19]["eval/accuracy"], rows[39]["eval/accuracy"] = 0.75, 0.5
    assert reward_change(rows) == f"reward {sum(range(1, 11)) / 400:.3f} (steps 1-10) -> " \
                                  f"{sum(range(31, 41)) / 400:.3f} (steps 31-40)"
    assert reward_change(rows[:1]) == "reward 0.025 (step 1)" and reward_change([{"step": 1}]) is None
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = end_of_run(tmp_path, 1, None)
    assert text.startswith(f"done: 1 step in {tmp_path}\n")  # "1 step", not "1 steps"
    assert "eval accuracy 0.750 (step 20), 0.500 (step 40)" in text and "--recipe" not in text
    # no checkpoint: nothing to evaluate or export
    assert "grpo eval" not in text and "grpo export" not in text and f"grpo report {tmp_path}" in text
    assert f"grpo eval base {tmp_path}    #" in end_of_run(tmp_path, 1, tmp_path / "checkpoints" / "step-1")


def test_next_commands_name_grpo_as_this_shell_reaches_it(tmp_path):
    # issue 22's walk: after `make demo` the README's user has .venv/bin/grpo, not grpo on PATH, and the summary's
    # "grpo eval base runs/quickstart" answered "command not found"
    from grpo_cli.views.summary import grpo_command

    bin_dir = tmp_path / "proj" / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "grpo").write_text("#!/bin/sh\n")
    (bin_dir / "python").write_text("")
    script, python = str(bin_dir / "grpo"), str(bin_dir / "python")
    proj = tmp_path / "proj"
    # the script on PATH: plain `grpo`
    assert grpo_command(script, python, proj, which=lambda name: script) == "grpo"
    # not on PATH (or another grpo first): the path that reaches this one, relative to the working directory
    assert grpo_command(script, python, proj, which=lambda name: None) == ".venv/bin/grpo"
    assert grpo_command(script, python, proj, which=lambda name: "/usr/bin/grpo") == ".venv/bin/grpo"
    assert grpo_command(script, python, tmp_path / "elsewhere", which=lambda name: None) == script
    # python -m grpo_cli: the grpo script beside that interpreter
    assert grpo_command(str(ROOT / "grpo_cli/__main__.py"), python, proj, which=lambda name: None) == ".venv/bin/grpo"
    # no script anywhere: the module through this interpreter
    (bin_dir / "grpo").unlink()
    assert grpo_command("-c", python, proj, which=lambda name: None) == ".venv/bin/python -m grpo_cli"
    assert grpo_command("/x/__main__.py", "/usr/bin/python3", proj, which=lambda name: None) == \
        "/usr/bin/python3 -m grpo_cli"
