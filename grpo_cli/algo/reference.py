"""The reference refresh: pi_ref <- alpha pi_theta + (1 - alpha) pi_ref, weight by weight (TR-DPO arXiv:2404.09656;
alpha = 1 is DeepSeekMath Algorithm 1's outer loop, "reference model pi_ref <- pi_theta")."""

from __future__ import annotations

from typing import Any

import torch


def mix_into(target: Any, source: Any, alpha: float) -> None:
    """target <- alpha * source + (1 - alpha) * target, parameter by parameter (same names; the reference refresh
    of TR-DPO; alpha = 1 copies). Both full models on the same device; in place, no grad."""
    params = dict(source.named_parameters())
    with torch.no_grad():
        for name, t in target.named_parameters():
            if alpha == 1:
                t.copy_(params[name])
            else:
                t.mul_(1 - alpha).add_(params[name].to(t.dtype), alpha=alpha)
