"""Writing one checkpoint and reading its trainer state back: everything goes into
`checkpoints/.tmp-step-N-<pid>/`, every file is fsynced and hashed, the manifest is written last, then the folder is
renamed into place (grpo_cli/run/checkpoints.py's layout, moves and retention), so a crash at any point leaves the
previous checkpoints untouched. No pickle: the state files are grpo_cli/run/statefiles.py's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from grpo_cli.errors import CheckpointError, first_line
from grpo_cli.run.checkpoints import (
    CHECKPOINTS, FORMAT, MANIFEST, RECIPE, STATE_DIR, TMP_PREFIX, apply_retention, fsync_dir, move_into_place, state_dir,
    write_synced,
)
from grpo_cli.run.statefiles import (
    decode_parts, encode_parts, load_state, require, restore_rng, rng_state, save_optimizer, save_scheduler, save_state,
)
from grpo_cli.process.watchdog import folder_bytes, progress_of, tick


def _sha256_and_fsync(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
            tick()  # a block hashed: a slow file system is not a stall
        os.fsync(f.fileno())
    tick()
    return h.hexdigest()


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
    write_synced(folder / STATE_DIR / MANIFEST, json.dumps(doc, indent=1).encode("utf-8"))
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
    tmp = root / f"{TMP_PREFIX}step-{int(step)}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        with progress_of(lambda: folder_bytes(tmp)):  # the files grow inside safetensors: progress all the same
            _write_contents(
                tmp, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                recipe_yaml=recipe_yaml, trainer_state=trainer_state, extra_json=extra_json, state_dict=state_dict,
                optimizer_state=optimizer_state, scheduler_state=scheduler_state,
            )
        _write_manifest(tmp, int(step))
        move_into_place(tmp, final)
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
