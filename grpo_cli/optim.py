"""The optimizer and learning-rate schedule of a run."""

from __future__ import annotations

import math

import torch


def build_optimizer(params, t, *, fused: bool) -> torch.optim.AdamW:
    """AdamW with train.* settings. `fused`: one kernel over all tensors (5x faster than the per-tensor loop on
    CPU for 135M parameters); sharded runs (FSDP's DTensors, DeepSpeed's wrapper) keep the default."""
    return torch.optim.AdamW(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay,
                             fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """Linear warm-up, then constant / linear decay to 0 / cosine decay to 0 over `total` optimizer steps."""

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[kind]

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
