"""Whether a model's numbers are finite: the first parameter holding a NaN or infinite value, or whose gradient
does. The trainer skips an update on a non-finite gradient and never saves non-finite weights
(grpo_cli/trainer/nonfinite.py); the sampler names the weights when the next-token probabilities are NaN."""

from __future__ import annotations

import math

import torch


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this process (FSDP2), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def word(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


@torch.no_grad()
def nonfinite_weights(model: torch.nn.Module) -> str | None:
    """'parameter NAME holds NaN values' for the first parameter (in model order) with a NaN or infinite value."""
    for name, p in model.named_parameters():
        t = local(p)
        if not bool(torch.isfinite(t).all()):
            return f"parameter {name} holds {'NaN' if bool(torch.isnan(t).any()) else 'infinite'} values"
    return None


@torch.no_grad()
def nonfinite_grad(named: list[tuple[str, torch.Tensor]]) -> str | None:
    """'gradient of NAME is nan' for the first parameter whose gradient has a NaN or infinite norm, else None. One
    fused pass over the gradients (torch._foreach_norm), one host sync."""
    grads = [(n, local(p.grad)) for n, p in named if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm([g for _, g in grads])
    finite = torch.isfinite(torch.stack([x.float().to(norms[0].device) for x in norms]))
    if bool(finite.all()):
        return None
    k = int((~finite).nonzero()[0])
    return f"gradient of {grads[k][0]} is {word(norms[k].item())}"
