"""The optimizer and learning-rate schedule of a run."""

from __future__ import annotations

import math

import torch


def build_optimizer(params, t, *, fused: bool, device: torch.device | None = None) -> torch.optim.Optimizer:
    """train.optimizer with train.* settings.

    adamw: torch's; `fused`: one kernel over all tensors (5x faster than the per-tensor loop on CPU for 135M
    parameters); sharded runs (FSDP's DTensors, DeepSpeed's wrapper) keep the default. adafactor: transformers'
    with a fixed learning rate (the schedule is train.scheduler's; no relative step, no parameter scaling, as TRL
    and the Trainer build it). adamw_8bit / paged_adamw_8bit: bitsandbytes' (betas and weight decay as AdamW's)."""
    kind = getattr(t, "optimizer", "adamw")
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2),
                                 weight_decay=t.weight_decay, fused=fused or None)
    if kind == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=t.learning_rate, scale_parameter=False, relative_step=False, warmup_init=False,
                         weight_decay=t.weight_decay, beta1=None)
    from grpo_cli.errors import SetupError

    try:
        import bitsandbytes as bnb
    except ImportError:
        raise SetupError(f"train.optimizer {kind} needs bitsandbytes: pip install 'grpo-cli[qlora]' (or bitsandbytes)") from None
    if kind == "paged_adamw_8bit" and (device is None or device.type != "cuda"):
        raise SetupError("train.optimizer paged_adamw_8bit pages optimizer state between GPU and host memory: it needs "
                         "CUDA; on this device use adamw_8bit")
    cls = bnb.optim.PagedAdamW8bit if kind == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return cls(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """Linear warm-up, then constant / linear decay to 0 / cosine decay to 0 over `total` optimizer steps."""

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[kind]

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
