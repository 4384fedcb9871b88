"""An RMS norm that keeps its input for the backward instead of two float32 copies of it.

Llama-style models (Llama, Qwen2, Qwen3, SmolLM2, Mistral, ...) normalize in float32 and scale in the model's dtype:
`weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)` with `x32 = x.float()`. Autograd keeps, per norm, x32 (for
the square and the product with the reciprocal root) and the normalized tensor before the scale: three of the
hidden size's values a token in bfloat16 for each of two norms a layer (Qwen2.5-0.5B, 8 rows x 273 positions:
0.35 GiB of a micro-batch's 2.2 GiB of activations). `LeanRMSNorm` keeps x in its own dtype and the float32
reciprocal root, one value a token, and recomputes the normalized tensor in the backward: two elementwise
operations. The forward is the model's own operations in their order; the backward is autograd's, the same operations
on the same values.

Installed by `use_lean_norms` on every module whose forward computes what `LeanRMSNorm` does, checked once per class
on a probe (a module that adds 1 to its weight, keeps a different epsilon attribute or normalizes another way keeps
its own forward). It runs under autograd with a weight that holds its whole value (not a shard); otherwise
(generation, reference forwards, FSDP or ZeRO-3 partitions) the module's own forward.
"""

from __future__ import annotations

import types

import torch
from torch.utils.weak import WeakIdKeyDictionary

from grpo_cli.algo.logprobs import whole_tensor


def _normalized(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (x32, 1 / sqrt(mean(x32^2) + eps)), as the model's forward computes them."""
    x32 = x.to(torch.float32)
    return x32, torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def scaled(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The norm's output from its input, reciprocal root and weight: weight * (x32 * r).to(x.dtype)."""
    return weight * (x.to(torch.float32) * r).to(x.dtype)


# a lean norm's output -> (its input, reciprocal root, weight), while the output lives: the linear layers it feeds
# keep these for their backward instead of the output itself (models/linear.py), which LeanRMSNorm keeps already
NORMALIZED: WeakIdKeyDictionary = WeakIdKeyDictionary()


class LeanRMSNorm(torch.autograd.Function):
    """(x, weight, eps) -> weight * (x32 * r).to(x.dtype), keeping x and r for the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32, r = _normalized(x, eps)
        ctx.save_for_backward(x, r, weight)
        out = weight * (x32 * r).to(x.dtype)
        NORMALIZED[out] = (x, r, weight)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, r, weight = ctx.saved_tensors
        x32 = x.to(torch.float32)
        grad_weight = None
        if ctx.needs_input_grad[1]:  # d(weight * n)/dweight, summed over every leading dimension
            n = (x32 * r).to(x.dtype)
            grad_weight = (grad * n).reshape(-1, n.shape[-1]).sum(0).to(weight.dtype)
        if not ctx.needs_input_grad[0]:
            return None, grad_weight, None
        g = (grad * weight).to(x.dtype).to(torch.float32)  # through the scale and the cast to x's dtype
        # x32 * r: g * r to x32 directly; to r, sum(g * x32), then rsqrt's, mean's and the square's backward
        grad_r = (g * x32).sum(-1, keepdim=True)
        grad_mean = grad_r * (-0.5 * r.pow(3))
        grad_x = g * r + grad_mean.expand_as(x32) / x32.shape[-1] * 2 * x32
        return grad_x.to(x.dtype), grad_weight, None


def lean_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if (torch.is_grad_enabled() and whole_tensor(self.weight)
            and (hidden_states.requires_grad or self.weight.requires_grad)):
        return LeanRMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)  # the class's own


_SAME: dict[type, bool] = {}  # norm class -> whether its forward is LeanRMSNorm's (checked once per class)


def _computes_the_same(module: torch.nn.Module) -> bool:
    cls = type(module)
    if cls not in _SAME:
        weight = getattr(module, "weight", None)
        same = False
        if isinstance(weight, torch.Tensor) and weight.dim() == 1 and isinstance(
                getattr(module, "variance_epsilon", None), float) and whole_tensor(weight):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(2, 3, weight.shape[0], generator=g).to(weight.device, torch.bfloat16) * 3
            probe = torch.randn(weight.shape[0], generator=g).to(weight.device, weight.dtype)  # not the module's own:
            # a forward that ignored or offset its weight could match at a weight of ones
            with torch.no_grad():
                try:
                    own = torch.func.functional_call(module, {"weight": probe}, (x,))
                    x32, r = _normalized(x, module.variance_epsilon)
                    lean = probe * (x32 * r).to(x.dtype)
                    same = own.dtype == lean.dtype and own.shape == lean.shape and torch.equal(own, lean)
                except Exception:  # a forward that takes other arguments, or none of this shape
                    same = False
        _SAME[cls] = same
    return _SAME[cls]


def use_lean_norms(model: torch.nn.Module) -> int:
    """Give every RMS norm of `model` that computes what LeanRMSNorm does the lean forward; -> how many."""
    n = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and not runs_lean(module) and _computes_the_same(module):
            module.forward = types.MethodType(lean_norm_forward, module)
            n += 1
    return n


def runs_lean(module: torch.nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is lean_norm_forward
