"""A gated MLP that keeps two tensors for its backward instead of four.

Llama-style models (Llama, Qwen2, SmolLM2, Mistral, ...) compute `down(silu(gate(x)) * up(x))`. Autograd keeps, per
layer, the gate's output (for silu), silu's output and the up projection (for the product) and the product (for the
down projection's weight gradient): four [tokens, intermediate] tensors, the largest activations of a training
forward (SmolLM2, 8 rows of a micro-batch: 0.18 of 0.47 GiB). `GatedDown` keeps the gate's and the up projection's
outputs only and recomputes silu and the product in backward, two elementwise operations on tensors already there.
The forward computes what the model's own does, in the same order; the gradients are the same operations on the
same values.

Installed by `use_lean_mlp` on every module with `gate_proj`, `up_proj`, `down_proj` and a SiLU `act_fn`. It runs only
under autograd without autocast, and with a down projection that is a plain `nn.Linear` holding its whole weight
(algo/logprobs.py whole_tensor); otherwise (generation, reference forwards, autocast, a LoRA, quantized, sharded or ZeRO-3
partitioned down projection) the module's own forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from grpo_cli.algo.logprobs import whole_tensor


class GatedDown(torch.autograd.Function):
    """(gate, up, weight, bias) -> linear(silu(gate) * up, weight, bias), keeping gate and up for the backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias = bias is not None
        return F.linear(F.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        silu = F.silu(gate)
        grad_h = grad @ weight  # d/dh of h @ W^T
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            h = silu * up
            grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ h.reshape(-1, h.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
        grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad_h * silu if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up, grad_weight, grad_bias


def _plain_linear(layer: Any) -> bool:
    return (type(layer) is torch.nn.Linear and whole_tensor(layer.weight)
            and (layer.bias is None or whole_tensor(layer.bias)))


def lean_forward(self, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    lean = (torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type) and _plain_linear(self.down_proj)
            and (gate.requires_grad or up.requires_grad or self.down_proj.weight.requires_grad))
    if lean:
        return GatedDown.apply(gate, up, self.down_proj.weight, self.down_proj.bias)
    return self.down_proj(self.act_fn(gate) * up)


def _silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def use_lean_mlp(model: torch.nn.Module) -> int:
    """Give every gated SiLU MLP of `model` the lean forward; -> how many."""
    n = 0
    for module in model.modules():
        if all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj")) and _silu(getattr(module, "act_fn", None)):
            module.forward = types.MethodType(lean_forward, module)
            n += 1
    return n
