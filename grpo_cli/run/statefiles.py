"""The trainer's state beside the weights, as files without pickle (checkpoint.py's trainer/ folder):
state_dicts as JSON with tags for tensors, tuples and int keys, the tensors in a .safetensors beside it; and
every RNG a run draws from (python, numpy, torch CPU and CUDA), per process, as JSON."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from grpo_cli.errors import CheckpointError

STATE_FORMAT = 1  # of the JSON state files (optimizer.json, scheduler.json)
_TENSOR, _TUPLE, _INT_KEYS, _FILE = "__tensor__", "__tuple__", "__int_keys__", "__tensor_file__"


# ------------------------------------------------------------------------- state dicts <-> JSON + safetensors


def encode_value(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A state_dict value -> JSON-able value; tensors go into `tensors[key]` and leave a tag behind."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().contiguous()
        return {_TENSOR: key}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_value(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_value(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: encode_value(v, f"{key}.{k}", tensors) for k, v in obj.items()}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            return {_INT_KEYS: {str(k): encode_value(v, f"{key}.{k}", tensors) for k, v in obj.items()}}
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    raise CheckpointError(
        f"cannot save {key!r} of type {type(obj).__name__} without pickle; "
        "only tensors, numbers, strings, lists, tuples and dicts with str or int keys are supported"
    )


def decode_value(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [decode_value(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1 and _TENSOR in obj:
        return tensors[obj[_TENSOR]]
    if len(obj) == 1 and _TUPLE in obj:
        return tuple(decode_value(v, tensors) for v in obj[_TUPLE])
    if len(obj) == 1 and _INT_KEYS in obj:
        return {int(k): decode_value(v, tensors) for k, v in obj[_INT_KEYS].items()}
    return {k: decode_value(v, tensors) for k, v in obj.items()}


def save_state(folder: Path, stem: str, state: dict, *, tensor_file: bool) -> None:
    """`state` -> `stem.json` (+ `stem.safetensors` when asked or when it holds tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    meta = {k: encode_value(v, k, tensors) for k, v in state.items()}
    if tensor_file or tensors:
        save_file(_unshared(tensors), str(folder / f"{stem}.safetensors"))
    doc = {"format": STATE_FORMAT, "tensor_file": bool(tensor_file or tensors), "state": meta}
    (folder / f"{stem}.json").write_text(json.dumps(doc, indent=1))


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors whose memory overlaps one seen before are copied: safetensors stores each once, by name
    (bitsandbytes' 8-bit optimizers point every parameter's state at the same quantization maps); views of
    separate parts of one block (AdamW's moments, grpo_cli/trainer/blocks.py) are saved as they are."""
    seen: dict[int, list[tuple[int, int]]] = {}  # storage -> the byte ranges of the tensors kept
    out = {}
    for k, t in tensors.items():
        if not t.numel():
            out[k] = t
            continue
        start = t.data_ptr()
        end = start + (t.untyped_storage().nbytes() if not t.is_contiguous() else t.numel() * t.element_size())
        ranges = seen.setdefault(t.untyped_storage().data_ptr(), [])
        if any(start < e and s < end for s, e in ranges):
            out[k] = t.clone()
        else:
            out[k] = t
            ranges.append((start, end))
    return out


def require(folder: Path, *names: str) -> None:
    for name in names:
        if not (folder / name).is_file():
            raise CheckpointError(
                f"{folder}: {name} is missing; the checkpoint is incomplete, pass another one to --resume"
            )


def load_state(folder: Path, stem: str) -> dict:
    path = folder / f"{stem}.json"
    require(folder, path.name)
    try:
        doc = json.loads(path.read_text())
        if doc["tensor_file"]:
            require(folder, f"{stem}.safetensors")
        tensors = load_file(str(folder / f"{stem}.safetensors")) if doc["tensor_file"] else {}
        return decode_value(doc["state"], tensors)
    except (ValueError, KeyError, TypeError, SafetensorError) as e:
        raise CheckpointError(
            f"{path} (or its .safetensors) cannot be read ({e}); the checkpoint is corrupted"
        ) from None


@dataclass
class TensorFile:
    """Tensors a part of the run's state keeps in a file of their own, trainer/<name>.safetensors, under their own
    names (a refreshed reference's weights, a trained reward model's): loadable with safetensors alone."""

    name: str
    tensors: dict[str, torch.Tensor]


def encode_parts(parts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """The run's state by part name -> (JSON for trainer_state.json, tensor files by name): a `TensorFile` anywhere in
    a part leaves {"__tensor_file__": name} behind; tuples and int keys are tagged as in `save_state`."""
    files: dict[str, dict[str, torch.Tensor]] = {}

    def swap(obj: Any) -> Any:
        if isinstance(obj, TensorFile):
            files[obj.name] = _unshared({k: v.detach().contiguous().cpu() for k, v in obj.tensors.items()})
            return {_FILE: obj.name}
        if isinstance(obj, dict):
            return {k: swap(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(swap(v) for v in obj)
        return obj

    out = {}
    for name, value in parts.items():
        loose: dict[str, torch.Tensor] = {}
        out[name] = encode_value(swap(value), name, loose)
        if loose:
            raise CheckpointError(f"part {name!r} of the run's state holds tensors outside a TensorFile: {sorted(loose)}")
    return out, files


def decode_parts(folder: Path, parts: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `encode_parts`: each {"__tensor_file__": name} becomes the tensors of trainer/<name>.safetensors."""

    def load(obj: Any) -> Any:
        if isinstance(obj, list):
            return [load(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        if len(obj) == 1 and _FILE in obj:
            require(folder, f"{obj[_FILE]}.safetensors")
            try:
                return load_file(str(folder / f"{obj[_FILE]}.safetensors"))
            except SafetensorError as e:
                raise CheckpointError(f"{folder / obj[_FILE]}.safetensors cannot be read ({e}); the checkpoint is "
                                      "corrupted") from None
        return {k: load(v) for k, v in obj.items()}

    return {name: load(decode_value(value, {})) for name, value in parts.items()}


def save_optimizer(folder: Path, optimizer: Any) -> None:
    save_state(folder, "optimizer", optimizer.state_dict(), tensor_file=True)


def save_scheduler(folder: Path, scheduler: Any) -> None:
    save_state(folder, "scheduler", scheduler.state_dict(), tensor_file=False)


# ------------------------------------------------------------------------------------------------ RNG states


def seed_process(seed: int) -> None:
    """Seed every RNG `rng_state` covers (a fresh run; a resumed one restores them instead)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """This process's RNGs, every one a training step draws from, as JSON (torch's byte states in base64, no
    pickle): python `random`, numpy's legacy global generator, torch CPU and the current CUDA device."""
    version, mt, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": [version, list(mt), gauss_next],
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached_gaussian)],
        "cpu": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = _b64(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of `rng_state`. (Entries of the older per-rank format hold torch's states only.)"""
    import base64

    dec = lambda s: torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)  # noqa: E731
    if "python" in state:
        version, mt, gauss_next = state["python"]
        random.setstate((version, tuple(mt), gauss_next))
        name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(dec(state["cpu"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(dec(state["cuda"]))


def restore_rng(folder: Path, per_rank: list[dict], rank: int, world: int) -> bool:
    """This process's saved RNG states, if the checkpoint has them for this many processes; -> restored or not.
    Older checkpoints: rank 0's python/numpy/torch from rng.safetensors + rng.json, then torch's per rank."""
    legacy = (folder / "rng.json").exists()
    if legacy:
        require(folder, "rng.json", "rng.safetensors")
        try:
            meta = json.loads((folder / "rng.json").read_text())
            tensors = load_file(str(folder / "rng.safetensors"))
            set_rng_state({"python": meta["python"], "numpy": meta["numpy"], "cpu": _b64(tensors["torch.cpu"])})
            if meta.get("cuda_devices", 0) and torch.cuda.is_available():
                for i in range(min(meta["cuda_devices"], torch.cuda.device_count())):
                    torch.cuda.set_rng_state(tensors[f"torch.cuda.{i}"].to(torch.uint8), device=i)
        except (ValueError, KeyError, TypeError, SafetensorError) as e:
            raise CheckpointError(
                f"{folder}: rng.json / rng.safetensors cannot be read ({e}); the checkpoint is corrupted"
            ) from None
    if len(per_rank) != world:
        return legacy and world == 1
    try:
        set_rng_state(per_rank[rank])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{folder / 'trainer_state.json'}: rng_per_rank[{rank}] cannot be read ({e}); "
                              "the checkpoint is corrupted") from None
    return True


def _b64(t: torch.Tensor) -> str:
    import base64

    return base64.b64encode(t.to(torch.uint8).numpy().tobytes()).decode()
