"""LoRA adapters `grpo serve-vllm --lora-rank R` serves in place of merged weights, checked before vLLM sees them.

A trainer with LoRA adapters syncs the adapter alone (a few MB) instead of the merged model: one safetensors file
holding peft's adapter tensors (`base_model.model.<module>.lora_A.weight` / `lora_B.weight`) with peft's
adapter_config.json in its metadata (`adapter_config`), by path from the weights directory or uploaded, like a
weight file. The server writes it out as a peft folder and loads it as vLLM's LoRA adapter for that weight version;
every generate then samples base + adapter.

`unservable` says what vLLM cannot serve (its own list, vllm/lora/peft_helper.py); the trainer asks it before it
chooses adapter sync, and the server before it loads a file: a refused adapter never reaches the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_cli.errors import RequestError

CONFIG_KEY = "adapter_config"  # the safetensors metadata key that holds adapter_config.json
ADAPTER_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"
PREFIX = "base_model.model."  # peft's names: PREFIX + the base model's module + .lora_A.weight
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def served_rank(rank: int) -> int:
    """vLLM's smallest max_lora_rank >= rank (it takes only RANKS)."""
    for r in RANKS:
        if r >= rank:
            return r
    raise ValueError(f"--lora-rank {rank} is over vLLM's largest LoRA rank, {RANKS[-1]}")


def unservable(config: dict[str, Any], max_rank: int, base_replaced: bool = False) -> str | None:
    """Why a server with max_lora_rank `max_rank` cannot serve an adapter with this peft config; None if it can.
    `base_replaced`: a full weight update replaced the weights the adapter would apply to."""
    ranks = [int(config.get("r") or 0), *map(int, (config.get("rank_pattern") or {}).values())]
    if max_rank <= 0:
        return "the server was started without --lora-rank"
    if base_replaced:
        return "full weights were synced to the server since it started, and an adapter applies to the model's own " \
               "weights: restart it"
    if max(ranks) > max_rank:
        return f"the adapter's rank {max(ranks)} is over the server's --lora-rank {max_rank}"
    if config.get("modules_to_save"):
        return f"model.lora.modules_to_save ({', '.join(config['modules_to_save'])}) trains whole modules vLLM " \
               "cannot take as an adapter"
    if config.get("use_dora"):
        return "vLLM does not serve DoRA adapters"
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        return "vLLM does not serve adapters with biases"
    if config.get("layer_replication"):
        return "vLLM does not serve layer_replication"
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        return f"init_lora_weights {init!r} changes the base weights, which the server does not hold"
    return None


def check_adapter_file(path: Path, shapes: dict[str, tuple[int, ...]], max_rank: int) -> tuple[dict[str, Any], int]:
    """Refuse (422, naming the tensor) an adapter the engine must not load; -> (its peft config, tensor count).

    `shapes`: the base model's HF state_dict shapes (weights.WeightSpec.shapes): every adapted module must be a
    linear layer of the model, lora_A [r, in] and lora_B [out, r] both present."""
    from grpo_cli.serve.weights import ACCEPTED_DTYPES, read_header

    header, meta = read_header(path)
    try:
        config = json.loads(meta[CONFIG_KEY])
        assert isinstance(config, dict)
    except (KeyError, ValueError, AssertionError, TypeError):
        raise RequestError(422, f"an adapter file carries peft's adapter_config.json as JSON in its safetensors "
                                f"metadata under {CONFIG_KEY!r}; this one does not", "weights") from None
    if (why := unservable(config, max_rank)) is not None:
        raise RequestError(422, why, "weights")
    if not header:
        raise RequestError(422, "the adapter file holds no tensors", "weights")
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, (dtype, shape) in header.items():
        module, _, part = name.removeprefix(PREFIX).rpartition(".lora_")
        if not name.startswith(PREFIX) or part not in ("A.weight", "B.weight"):
            raise RequestError(422, f"tensor {name!r} is not a LoRA tensor (peft names: {PREFIX}<module>.lora_A.weight "
                                    "and .lora_B.weight)", "weights")
        base = shapes.get(f"{module}.weight")
        if base is None or len(base) != 2:
            raise RequestError(422, f"tensor {name!r}: {module!r} is not a linear layer of this model", "weights")
        if dtype not in ACCEPTED_DTYPES:
            raise RequestError(422, f"tensor {name!r} has dtype {dtype}; accepted: {', '.join(ACCEPTED_DTYPES)}",
                               "weights")
        pairs.setdefault(module, {})[part[0]] = shape
    for module, ab in pairs.items():
        out_features, in_features = shapes[f"{module}.weight"]
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            raise RequestError(422, f"{module!r} has lora_{'A' if a else 'B'} without lora_{'B' if a else 'A'}",
                               "weights")
        if len(a) != 2 or len(b) != 2 or a[1] != in_features or b[0] != out_features or a[0] != b[1] or a[0] > max_rank:
            raise RequestError(422, f"{module!r}: lora_A {a} and lora_B {b} do not fit its weight ({out_features}, "
                                    f"{in_features}) at a rank of at most {max_rank} (lora_A [r, in], lora_B [out, r])",
                               "weights")
    return config, len(header)


def write_peft_folder(path: Path, config: dict[str, Any], folder: Path) -> None:
    """The checked file as the folder vLLM's LoRA loader reads (adapter_model.safetensors + adapter_config.json)."""
    import shutil

    folder.mkdir(mode=0o700)
    shutil.copyfile(path, folder / ADAPTER_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(config))


# ------------------------------------------------------------------ the base an adapter applies to

FINGERPRINT_SAMPLES = 256  # elements of the input embedding, evenly spaced
FINGERPRINT_TOLERANCE = 2e-2  # relative L2 distance: bf16 rounding gives ~3e-3, another checkpoint far more
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight")


def fingerprint(embedding: Any) -> dict[str, Any]:
    """A base model's identity from its input embedding [V, H] (every causal LM has one, and an adapter never
    changes it): its shape and FINGERPRINT_SAMPLES evenly spaced values, as float64."""
    import torch

    flat = embedding.detach().reshape(-1)
    index = torch.linspace(0, flat.numel() - 1, FINGERPRINT_SAMPLES).round().long()
    return {"shape": list(embedding.shape), "sample": flat[index.to(flat.device)].double().cpu().tolist()}


def folder_fingerprint(folder: str | Path) -> dict[str, Any] | None:
    """`fingerprint` of the input embedding in a model folder's safetensors files (None: not a local folder, or no
    tensor of a known embedding name)."""
    from safetensors import safe_open

    for file in sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []:
        with safe_open(str(file), framework="pt") as f:
            name = next((k for k in f.keys() if k.endswith(EMBEDDING_NAMES)), None)
            if name is not None:
                return fingerprint(f.get_tensor(name))
    return None


def base_mismatch(trainer: dict[str, Any], server: dict[str, Any] | None) -> str | None:
    """Why the server's base model is not the trainer's (None: the same, as far as the fingerprints tell)."""
    import math

    if server is None:
        return None
    if trainer["shape"] != server["shape"]:
        return f"its input embedding is {server['shape']}, the trainer's {trainer['shape']}"
    a, b = trainer["sample"], server["sample"]
    norm = math.sqrt(sum(x * x for x in a)) or 1.0
    distance = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / norm
    if distance > FINGERPRINT_TOLERANCE:
        return f"its input embedding differs from the trainer's base by {distance:.1%} (relative L2 distance)"
    return None
