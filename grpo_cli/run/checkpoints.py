"""Checkpoints in a run folder: their layout, listing, verifying, resuming, retention, and what is set aside rather
than deleted. Writing one and reading its trainer state back: checkpoint_io.py (the state files: statefiles.py).

A checkpoint folder is a Hugging Face model folder: `vllm serve`, `grpo serve-vllm --model`, `grpo eval`
and `AutoModelForCausalLM.from_pretrained` load it unchanged (vLLM reads every top-level *.safetensors,
so nothing else may sit there). Layout of `RUN_DIR/checkpoints/step-N/` (format 2):
  config.json, generation_config.json, model*.safetensors (+ index), tokenizer files, chat template;
  with LoRA instead of the weights: the peft adapter (adapter_config.json, adapter_model.safetensors)
  and base_model.json, the identity of its base
  trainer/                                 the trainer's state, which only `--resume` reads:
    recipe.yaml                            the resolved recipe the run trained with
    optimizer.safetensors + optimizer.json torch optimizer state_dict: tensors under flat keys
                                           (`state.0.exp_avg`), the rest as JSON with tags for tensors/tuples
    scheduler.json                         lr scheduler state_dict (scheduler.safetensors only if it holds tensors)
    trainer_state.json                     the run's state by part (step, data position, the rollouts in flight,
                                           ...) and `rng_per_rank`: each process's python `random`, numpy legacy,
                                           torch CPU and CUDA RNG states (statefiles.rng_state)
    <name>.safetensors                     tensors a part keeps apart (statefiles.TensorFile): ref_model (a
                                           refreshed reference), reward_model_<i> (a reward model being trained)
    manifest.json                          written last: {"step", "files": {path from step-N/: sha256}, "format"}
Format 1 (before this layout) kept the trainer's files and the manifest at the top level; such
checkpoints are still listed, verified and resumed, as are those that kept rank 0's RNGs in
rng.safetensors + rng.json and only torch's per rank.

A save writes everything into `checkpoints/.tmp-step-N-<pid>/`, fsyncs every file, writes the manifest,
then renames the folder into place, so a crash at any point leaves the previous checkpoints untouched and
a `step-N` folder either complete (manifest present) or an interrupted copy, which is never listed.
Files are made world-readable like any other output (safetensors writes 0600). One trainer per run
folder (grpo_cli/run/lock.py): leftover `.tmp-*` folders of dead runs are deleted only by the lock holder, and only
without a manifest: a complete one (a save killed between its renames) is moved into place at the next start
(`recover_saves`). A folder with a complete manifest is never deleted for its name or its place: a step saved again
sets the old one aside in `RUN/abandoned/` (as a rewind does, grpo_cli/run/rewind.py), and retention deletes only
checkpoints older than the one just saved. Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from grpo_cli.errors import CheckpointError, UsageError

FORMAT = 2
FORMATS = (1, 2)  # what this version reads
MANIFEST = "manifest.json"
STATE_DIR = "trainer"  # the trainer's state inside a checkpoint (format 2)
RECIPE = "recipe.yaml"
CHECKPOINTS = "checkpoints"
ABANDONED = "abandoned"  # RUN/abandoned/<time>-<why>/: checkpoints and logs a rewind or a re-save set aside
_STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


# ---------------------------------------------------------------------------------------------- fsync helpers


def fsync_dir(path: str | Path) -> None:
    """Persist a folder's entries (new, renamed or removed files) on POSIX; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old content or the new one, never a torn file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_synced(tmp, text.encode("utf-8"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ listing, verifying


def step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def state_dir(checkpoint: str | Path) -> Path:
    """Where a checkpoint keeps the trainer's files: `trainer/` (format 2), or the folder itself (format 1)."""
    checkpoint = Path(checkpoint)
    return checkpoint / STATE_DIR if (checkpoint / STATE_DIR).is_dir() else checkpoint


def manifest_path(checkpoint: str | Path) -> Path:
    return state_dir(checkpoint) / MANIFEST


def recipe_path(checkpoint: str | Path) -> Path:
    """The recipe a checkpoint was trained with."""
    return state_dir(checkpoint) / RECIPE


def is_checkpoint(path: str | Path) -> bool:
    """A folder written by `grpo train` (complete or not), as opposed to a plain model or run folder."""
    path = Path(path)
    return (path / STATE_DIR).is_dir() or (path / MANIFEST).is_file() or (path / "trainer_state.json").is_file()


def _step_folders(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir()]
    return sorted(found, key=lambda p: step_of(p))  # type: ignore[arg-type, return-value]


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (a `step-N` folder with its manifest) of a run, oldest step first."""
    return [p for p in _step_folders(run_dir) if manifest_path(p).is_file()]


def incomplete_checkpoints(run_dir: str | Path) -> list[Path]:
    """`step-N` folders without a manifest: saves that were interrupted (or manifests that were lost)."""
    return [p for p in _step_folders(run_dir) if not manifest_path(p).is_file()]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def newest_if_run_folder(path: str | Path) -> Path:
    """`path` itself, or the newest complete checkpoint when `path` is a run folder (`grpo eval`, `grpo export`)."""
    path = Path(path)
    if (path / CHECKPOINTS).is_dir() and not is_checkpoint(path) and not (path / "config.json").is_file():
        newest = latest_checkpoint(path)
        if newest is None:
            skipped = ", ".join(p.name for p in incomplete_checkpoints(path))
            raise UsageError(f"{path} holds no complete checkpoint" + (f" ({skipped}: no manifest, the save was "
                                                                          "interrupted)" if skipped else ""))
        return newest
    return path


def _read_manifest(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {path}")
    manifest = manifest_path(path)
    if not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {path.name} is incomplete: {path} has no {manifest.relative_to(path)} (its save was "
            "interrupted); delete the folder, or pass another checkpoint"
        )
    try:
        doc = json.loads(manifest.read_text())
        files = doc["files"]
        if doc.get("format") not in FORMATS or not isinstance(files, dict):
            raise ValueError(f"unknown format {doc.get('format')!r}")
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint {path.name} is corrupted: {MANIFEST} cannot be read ({e}); "
            "delete the folder to resume from an older checkpoint"
        ) from None
    return doc


def verify_checkpoint(path: str | Path) -> None:
    """Recompute the sha256 of every file in the manifest; raise CheckpointError naming the first bad one."""
    path = Path(path)
    doc = _read_manifest(path)
    advice = "delete the folder to resume from an older checkpoint"
    for rel, expected in doc["files"].items():
        file = path / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(
                f"checkpoint {path.name} is corrupted: {MANIFEST} lists {rel!r} outside the folder; {advice}"
            )
        if not file.is_file():
            raise CheckpointError(
                f"checkpoint {path.name} is corrupted: {rel} is missing (listed in {MANIFEST}); {advice}"
            )
        if _sha256(file) != expected:
            raise CheckpointError(
                f"checkpoint {path.name} is corrupted: {rel} does not match its sha256 in {MANIFEST}; {advice}"
            )


def resolve_resume(run_dir: str | Path, resume: str) -> Path | None:
    """`auto` -> the newest complete checkpoint of the run (None if there is none); else a checkpoint folder.

    The chosen checkpoint is verified; a corrupted one is refused rather than silently skipped, so a run
    never quietly goes back in time.
    """
    if resume == "auto":
        path = latest_checkpoint(run_dir)
        if path is None:
            return None
    else:
        path = Path(resume)
        if not path.is_dir():
            raise CheckpointError(
                f"--resume {resume}: no such checkpoint folder (expected RUN_DIR/{CHECKPOINTS}/step-N, or `auto`)"
            )
        if not is_checkpoint(path) and _step_folders(path):
            raise CheckpointError(
                f"--resume {resume} is a run folder, not a checkpoint; "
                f"pass {latest_checkpoint(path)} or use --resume auto"
            )
    verify_checkpoint(path)
    return path


# ------------------------------------------------------------------------------- a step saved again, retention


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`. An existing complete `final` (a step saved again) is set aside, never deleted
    (`set_aside`); an interrupted copy without a manifest is renamed out of the way first and deleted once replaced.
    A crash between the two renames leaves `tmp` complete: `recover_saves` moves it into place at the next start."""
    if final.exists() and manifest_path(final).is_file():
        set_aside(final, f"replaced-{final.name}")
    aside = None
    if final.exists():
        aside = final.with_name(f"{TMP_PREFIX}old-{final.name}-{os.getpid()}")
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def set_aside(checkpoint: Path, why: str) -> Path:
    """Move a complete checkpoint out of checkpoints/ into RUN/abandoned/<time>-<why>/checkpoints/, where no resume
    or retention looks; -> where it went."""
    dest = abandoned_folder(checkpoint.parent.parent, why) / CHECKPOINTS / checkpoint.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(checkpoint, dest)
    fsync_dir(checkpoint.parent)
    return dest


def abandoned_folder(run_dir: Path, why: str) -> Path:
    """RUN/abandoned/<YYYYmmdd-HHMMSS>-<why>/ (a new one: a suffix where the name is taken)."""
    base = Path(run_dir) / ABANDONED / f"{time.strftime('%Y%m%d-%H%M%S')}-{why}"
    folder, k = base, 1
    while folder.exists():
        k += 1
        folder = base.with_name(f"{base.name}-{k}")
    return folder


def recover_saves(run_dir: str | Path, say=print) -> None:
    """Finish what a save killed between its renames began (the lock holder, at start): a complete
    `.tmp-step-N-<pid>` whose `step-N` is missing is moved into place; a complete leftover whose step exists is set
    aside. Incomplete `.tmp-*` folders are left for retention to delete."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return
    for tmp in sorted(root.glob(f"{TMP_PREFIX}*")):
        if not tmp.is_dir() or not manifest_path(tmp).is_file():
            continue
        step = _manifest_step(tmp)
        final = root / f"step-{step}"
        if step is not None and not final.exists() and not tmp.name.startswith(f"{TMP_PREFIX}old-"):
            os.rename(tmp, final)
            fsync_dir(root)
            say(f"{final.name}: its save was complete when the run stopped ({tmp.name}); moved into place")
        else:
            dest = set_aside(tmp, f"leftover-{tmp.name.lstrip('.')}")
            say(f"{tmp.name}: a complete checkpoint left by an interrupted save; kept in {dest}")


def _manifest_step(folder: Path) -> int | None:
    try:
        return int(json.loads(manifest_path(folder).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step a checkpoint was saved at: its manifest's, else its folder name's."""
    step = _manifest_step(checkpoint)
    return step if step is not None else step_of(checkpoint)


def apply_retention(run_dir: str | Path, keep_last: int | None, *, protect: Path | None = None) -> list[Path]:
    """Delete leftover `.tmp-*` folders without a manifest and all but the newest `keep_last` complete checkpoints
    of the running branch: those up to `protect` (the one just saved), which is never deleted, nor is the newest
    complete checkpoint or any later one. Incomplete `step-N` folders are left alone (they are not ours to judge),
    and so is a `.tmp-*` folder with a manifest (a complete save: `recover_saves`). Other processes' `.tmp-*`
    folders are deleted only by the holder of the run folder's lock (they are then a dead run's). Returns the
    deleted paths.
    """
    from grpo_cli.run import lock
    if keep_last is not None and keep_last < 1:
        raise CheckpointError(f"checkpoint.keep_last must be >= 1 or None (got {keep_last})")
    root = Path(run_dir) / CHECKPOINTS
    ours = lock.holds(run_dir)
    removed = [p for p in root.glob(f"{TMP_PREFIX}*") if p.is_dir() and not manifest_path(p).is_file()
               and (ours or p.name.endswith(f"-{os.getpid()}"))] if root.is_dir() else []
    if keep_last is not None:
        ckpts = list_checkpoints(run_dir)
        if protect is not None:  # a later checkpoint is not this branch's past: never a candidate
            ckpts = [p for p in ckpts if step_of(p) <= step_of(protect)]
        removed += [p for p in ckpts[: max(len(ckpts) - keep_last, 0)] if p != protect]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    if removed:
        fsync_dir(root)
    return removed


