"""LoRA / QLoRA with peft: wrap the policy, save and load adapter checkpoints, merge for vLLM and export.

With LoRA the reference policy of the KL term is the same network with its adapters disabled
(`disable_adapter()`), so beta > 0 costs no second copy of the model. A LoRA checkpoint holds the
adapter (adapter_model.safetensors + adapter_config.json, peft's format) and `base_model.json`, the
identity of the base (name, revision, gguf_file, architecture and parameter count); the base is loaded
again from the checkpoint's trainer/recipe.yaml and checked against it. vLLM and `grpo export --merge` get
merged weights W + scale * B @ A computed on the side, so the trained modules are never modified.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpo_cli.errors import AdapterError
from grpo_cli.models.loading import load_model

if TYPE_CHECKING:
    from grpo_cli.recipe.schema import ModelConfig

BASE_MODEL = "base_model.json"
ADAPTER_CONFIG = "adapter_config.json"


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def is_adapter_checkpoint(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def wrap_lora(model: Any, cfg: ModelConfig) -> Any:
    """The model with fresh LoRA adapters on cfg.lora.target_modules; only the adapters train."""
    import peft

    lo = cfg.lora
    if cfg.load_in_4bit:  # QLoRA: casts norms to fp32 and makes the frozen 4-bit base checkpointing-friendly
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing,
                                                     gradient_checkpointing_kwargs={"use_reentrant": False})
    config = peft.LoraConfig(
        r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=lo.target_modules,
        modules_to_save=lo.modules_to_save, use_rslora=lo.use_rslora, bias="none", task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # e.g. target modules not found in the model
        raise AdapterError(f"model.lora cannot be applied to {cfg.name_or_path!r}: {e}") from None


def base_identity(model: Any, cfg: ModelConfig) -> dict[str, Any]:
    """What a LoRA checkpoint records about its base model (written as base_model.json)."""
    base = model.get_base_model() if is_peft_model(model) else model
    n_params = sum(_numel(p) for n, p in base.named_parameters() if "lora_" not in n and "modules_to_save" not in n)
    return {"name_or_path": cfg.name_or_path, "revision": cfg.revision, "gguf_file": cfg.gguf_file,
            "model_type": base.config.model_type, "num_parameters": n_params}


def _numel(p: torch.Tensor) -> int:
    """Elements of the unquantized tensor (a 4-bit bitsandbytes weight packs two per byte)."""
    state = getattr(p, "quant_state", None)
    return int(torch.Size(state.shape).numel()) if state is not None else p.numel()


def load_adapter_model(checkpoint: str | Path, base_cfg: ModelConfig, *, trainable: bool, device: Any = None) -> Any:
    """Base model per `base_cfg` (the checkpoint's recipe) + the checkpoint's adapter, checked against base_model.json."""
    import peft

    checkpoint = Path(checkpoint)
    base = load_model(base_cfg, device=device if base_cfg.load_in_4bit else None)
    saved_path = checkpoint / BASE_MODEL
    if saved_path.is_file():
        saved, now = json.loads(saved_path.read_text()), base_identity(base, base_cfg)
        differs = [k for k in ("model_type", "num_parameters") if saved.get(k) != now[k]]
        if differs:
            raise AdapterError(
                f"{checkpoint} is a LoRA adapter for {saved.get('name_or_path')!r} ({saved.get('model_type')}, "
                f"{saved.get('num_parameters')} parameters), but model.name_or_path {base_cfg.name_or_path!r} gives "
                f"{now['model_type']} with {now['num_parameters']} parameters; set model.name_or_path to the base it was trained on"
            )
    return peft.PeftModel.from_pretrained(base, str(checkpoint), is_trainable=trainable)


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """A PeftModel's weights under the plain model's names, adapters merged (W + scale * B @ A), model untouched.

    What `merge_and_unload().state_dict()` would return, without merging in place (merge/unmerge round
    trips drift the frozen weights by rounding) and without keeping a merged copy of untouched tensors.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not getattr(module, "disable_adapters", False):
                active = [a for a in module.active_adapters if a in module.lora_A]
                if active:
                    deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
        out: dict[str, torch.Tensor] = {}
        for key, tensor in base.state_dict().items():
            parts = key.split(".")
            if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
                continue
            clean = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
            out[clean] = (tensor + deltas[clean].to(tensor.dtype)) if clean in deltas else tensor
    return out


def export_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The weights a plain Hugging Face model of this architecture holds (what vLLM and export need)."""
    if is_peft_model(model):
        return merged_state_dict(model)
    # FSDP2 shards are DTensors: full_tensor() gathers each one (a collective: every process calls this)
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}


def parameter_summary(model: Any) -> str:
    total = sum(_numel(p) for p in model.parameters())  # 4-bit weights counted unpacked
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"{total / 1e6:.2f}M parameters, {trainable / 1e6:.3f}M trainable ({100 * trainable / max(total, 1):.2f}%)"


def load_policy(cfg, model_cfg, checkpoint_path, device):
    """The trained model: full weights (fresh, or from the checkpoint `cfg` points at), or base + LoRA adapters
    (fresh, or the checkpoint's). `model_cfg`: the recipe's model section (LoRA and 4-bit settings)."""
    if checkpoint_path is not None and is_adapter_checkpoint(checkpoint_path):
        return load_adapter_model(checkpoint_path, model_cfg, trainable=True, device=device)
    model = load_model(cfg, device=device if model_cfg.load_in_4bit else None)
    return wrap_lora(model, model_cfg) if model_cfg.lora.r else model


def weights_file(checkpoint: str | Path) -> Path | None:
    """The file of a checkpoint's trained tensors: the model's, or with LoRA the adapter's (None: neither)."""
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if (Path(checkpoint) / name).is_file():
            return Path(checkpoint) / name
    return None
