"""Checkpoints: save / list / verify / resume / retention, atomic and without pickle (the state files inside are
statefiles.py's).

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
folder (grpo_cli/run/lock.py): leftover `.tmp-*` folders of dead runs are deleted only by the lock holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from grpo_cli.errors import CheckpointError, UsageError, first_line
from grpo_cli.run.statefiles import (
    decode_parts, encode_parts, load_state, require, restore_rng, rng_state, save_optimizer, save_scheduler, save_state,
)

FORMAT = 2
FORMATS = (1, 2)  # what this version reads
MANIFEST = "manifest.json"
STATE_DIR = "trainer"  # the trainer's state inside a checkpoint (format 2)
RECIPE = "recipe.yaml"
CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


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


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old content or the new one, never a torn file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write_synced(tmp, text.encode("utf-8"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _sha256_and_fsync(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
        os.fsync(f.fileno())
    return h.hexdigest()


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


# ----------------------------------------------------------------------------------------------- save / load


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def make_readable(folder: Path) -> None:
    """Files 0666 and folders 0777 minus the umask, as `open()` and `mkdir` would make them (safetensors
    writes 0600, and a checkpoint is meant to be served, copied and evaluated by others)."""
    umask = _umask()
    for p in [folder, *folder.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _write_manifest(folder: Path, step: int) -> None:
    """sha256 (and fsync) every file, then write trainer/manifest.json last: its presence marks a complete save."""
    files: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(folder).as_posix()] = _sha256_and_fsync(p)
    for d in sorted({p.parent for p in folder.rglob("*")} | {folder}, reverse=True):
        fsync_dir(d)
    doc = {"step": step, "files": files, "format": FORMAT}
    _write_synced(folder / STATE_DIR / MANIFEST, json.dumps(doc, indent=1).encode("utf-8"))
    os.chmod(folder / STATE_DIR / MANIFEST, 0o666 & ~_umask())
    fsync_dir(folder / STATE_DIR)


def _write_contents(
    folder: Path, *, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any, recipe_yaml: str, trainer_state: dict,
    extra_json: dict[str, dict] | None = None, state_dict: dict | None = None, optimizer_state: dict | None = None,
    scheduler_state: dict | None = None,
) -> None:
    # one process's own RNGs unless the caller gathered every process's; TensorFiles go to trainer/<name>.safetensors
    parts, tensors = encode_parts({"rng_per_rank": [rng_state()], **trainer_state})
    # the model folder: what from_pretrained and vLLM read. state_dict / optimizer_state: gathered by the
    # caller when the live ones are sharded (FSDP, ZeRO-3)
    model.save_pretrained(str(folder), safe_serialization=True, **({"state_dict": state_dict} if state_dict else {}))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    for name, doc in (extra_json or {}).items():  # e.g. base_model.json of a LoRA adapter
        (folder / name).write_text(json.dumps(doc, indent=1))
    state = folder / STATE_DIR  # the trainer's own files, out of vLLM's sight
    state.mkdir()
    (state / RECIPE).write_text(recipe_yaml)
    if optimizer_state is not None:
        save_state(state, "optimizer", optimizer_state, tensor_file=True)
    elif optimizer is not None:
        save_optimizer(state, optimizer)
    if scheduler_state is not None:
        save_state(state, "scheduler", scheduler_state, tensor_file=False)
    elif scheduler is not None:
        save_scheduler(state, scheduler)
    for name, file_tensors in tensors.items():  # e.g. a refreshed reference model's weights
        save_file(file_tensors, str(state / f"{name}.safetensors"))
    (state / "trainer_state.json").write_text(json.dumps(parts, indent=1))
    make_readable(folder)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is renamed aside first and deleted once replaced."""
    aside = None
    if final.exists():
        aside = final.with_name(f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}")
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def apply_retention(run_dir: str | Path, keep_last: int | None, *, protect: Path | None = None) -> list[Path]:
    """Delete leftover `.tmp-*` folders and all but the newest `keep_last` complete checkpoints.

    The newest complete checkpoint and `protect` (the one just saved) are never deleted; incomplete
    `step-N` folders are left alone (they are not ours to judge). Other processes' `.tmp-*` folders are
    deleted only by the holder of the run folder's lock (they are then a dead run's). Returns the deleted paths.
    """
    from grpo_cli.run import lock
    if keep_last is not None and keep_last < 1:
        raise CheckpointError(f"checkpoint.keep_last must be >= 1 or None (got {keep_last})")
    root = Path(run_dir) / CHECKPOINTS
    ours = lock.holds(run_dir)
    removed = [p for p in root.glob(f"{_TMP_PREFIX}*")
               if p.is_dir() and (ours or p.name.endswith(f"-{os.getpid()}"))] if root.is_dir() else []
    if keep_last is not None:
        ckpts = list_checkpoints(run_dir)
        removed += [p for p in ckpts[: max(len(ckpts) - keep_last, 0)] if p != protect]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    if removed:
        fsync_dir(root)
    return removed


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    recipe_yaml: str,
    trainer_state: dict,
    keep_last: int | None,
    extra_json: dict[str, dict] | None = None,
    state_dict: dict | None = None,
    optimizer_state: dict | None = None,
    scheduler_state: dict | None = None,
) -> Path:
    """Save `RUN_DIR/checkpoints/step-N/` atomically, then apply retention. Returns the checkpoint folder.
    `trainer_state`: the run's state by part name, JSON values with tensors anywhere (see `encode_parts`)."""
    if keep_last is not None and keep_last < 1:
        raise CheckpointError(f"checkpoint.keep_last must be >= 1 or None (got {keep_last})")
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step-{int(step)}"
    tmp = root / f"{_TMP_PREFIX}step-{int(step)}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_contents(
            tmp, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
            recipe_yaml=recipe_yaml, trainer_state=trainer_state, extra_json=extra_json, state_dict=state_dict,
            optimizer_state=optimizer_state, scheduler_state=scheduler_state,
        )
        _write_manifest(tmp, int(step))
        _move_into_place(tmp, final)
    except CheckpointError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (OSError, SafetensorError, RuntimeError) as e:  # a full disk is a SafetensorError from safetensors
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"could not save checkpoint step-{step} to {root}: {first_line(e) or type(e).__name__} "
            f"({_free_space(root)}); free disk space or check permissions (the previous checkpoints are untouched)"
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    apply_retention(run_dir, keep_last, protect=final)
    return final


def _free_space(path: Path) -> str:
    """"12.3 MiB free on that file system" for the nearest existing folder of `path`."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB free on that file system"
    except OSError:
        return "free space unknown"


def load_training_state(path: str | Path, *, optimizer: Any, scheduler: Any, load_optimizer: Any = None,
                        rank: int = 0, world: int = 1) -> dict:
    """Restore optimizer, scheduler and this process's RNG states (process `rank` of `world`) from a checkpoint;
    return its trainer_state dict, RNGs replaced by "rng_restored" (False: none saved for `world` processes).

    Optimizer tensors are handed to `optimizer.load_state_dict`, which moves them to the device and dtype
    of the parameters (keeping `step` as saved), as torch does for its own checkpoints.
    """
    path = state_dir(path)
    if optimizer is not None:
        state = load_state(path, "optimizer")
        try:
            (load_optimizer or optimizer.load_state_dict)(state)  # load_optimizer: e.g. FSDP2's by-name loader
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(
                f"{path / 'optimizer.json'} does not fit this optimizer ({e}); the model, LoRA or optimizer "
                "settings of the recipe must match those the checkpoint was trained with"
            ) from None
    if scheduler is not None:
        scheduler.load_state_dict(load_state(path, "scheduler"))
    require(path, "trainer_state.json")
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except ValueError as e:
        raise CheckpointError(
            f"{path / 'trainer_state.json'} is not valid JSON ({e}); the checkpoint is corrupted"
        ) from None
    state = decode_parts(path, state)
    state["rng_restored"] = restore_rng(path, state.pop("rng_per_rank", None) or [], rank, world)
    return state


def load_trainer_tensors(path: str | Path, name: str) -> dict[str, torch.Tensor]:
    """trainer/<name>.safetensors of a checkpoint, as saved."""
    folder = state_dir(path)
    require(folder, f"{name}.safetensors")
    return load_file(str(folder / f"{name}.safetensors"))
