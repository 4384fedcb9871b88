"""A gated MLP that keeps two tensors for its backward instead of four.

Llama-style models (Llama, Qwen2, SmolLM2, Mistral, ...) compute `down(silu(gate(x)) * up(x))`. Autograd keeps, per
layer, the gate's output (for silu), silu's output and the up projection (for the product) and the product (for the
down projection's weight gradient): four [tokens, intermediate] tensors, the largest activations of a training
forward (SmolLM2, 8 rows of a micro-batch: 0.18 of 0.47 GiB). `GatedDown` keeps the gate's and the up projection's
outputs only and recomputes silu and the product in backward, two elementwise operations on tensors already there.
The forward computes what the model's own does, in the same order; the gradients are the same operations on the
same values, the weights' added into their kept gradients in place (models/linear.py).

With `recompute_up_projection` (train.recompute_up_projection) `GatedUpDown` keeps the gate's output and the MLP's
input (which the gate projection keeps anyway) and recomputes the up projection in the backward too: one product of
the layer's seven, for one [tokens, intermediate] tensor a layer less (on a GPU, where a step at micro-batch shapes
waits on the host rather than on its products, about free).

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
from grpo_cli.models.linear import weight_gradient
from grpo_cli.models.rmsnorm import NORMALIZED, scaled


class GatedDown(torch.autograd.Function):
    """(gate, up, weight, bias) -> linear(silu(gate) * up, weight, bias), keeping gate and up for the backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(gate, up, weight)
        ctx.weight, ctx.has_bias = weight, bias is not None  # the parameter, for its kept gradient (models/linear.py)
        return F.linear(F.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        return gated_down_gradients(grad, gate, up, weight, ctx.has_bias, *ctx.needs_input_grad, param=ctx.weight)


def gated_down_gradients(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor,
                         has_bias: bool, need_gate: bool, need_up: bool, need_weight: bool, need_bias: bool, *,
                         param: torch.Tensor) -> tuple:
    """-> the gradients of gate, up, the down projection's weight and bias (None where not needed, and the weight's
    where added into the kept gradient of `param`, the down projection's parameter: `weight` is its saved value,
    which activation checkpointing gives back detached)."""
    silu = F.silu(gate)
    grad_h = grad @ weight  # d/dh of h @ W^T
    grad_weight = grad_bias = None
    if need_weight:  # added into the kept gradient where it can be (models/linear.py)
        grad_weight = weight_gradient(param, grad, silu * up)
    if has_bias and need_bias:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
    grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate) if need_gate else None
    grad_up = grad_h * silu if need_up else None
    return grad_gate, grad_up, grad_weight, grad_bias


class GatedUpDown(torch.autograd.Function):
    """(x, gate, up weight, up bias, down weight, down bias) -> linear(silu(gate) * linear(x, up...), down...),
    keeping x and gate for the backward: the up projection is recomputed there."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gate: torch.Tensor, up_weight: torch.Tensor, up_bias: torch.Tensor | None,
                weight: torch.Tensor, bias: torch.Tensor | None):
        norm = NORMALIZED.get(x)  # a lean RMS norm's output: recomputed from what the norm keeps (models/linear.py)
        ctx.save_for_backward(gate, up_weight, up_bias, weight, *(norm if norm is not None else (x,)))
        ctx.params, ctx.has_bias = (up_weight, weight), bias is not None  # for their kept gradients
        return F.linear(F.silu(gate) * F.linear(x, up_weight, up_bias), weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up_weight, up_bias, weight, *kept = ctx.saved_tensors
        x = kept[0] if len(kept) == 1 else scaled(*kept)
        need_x, need_gate, need_up_weight, need_up_bias, need_weight, need_bias = ctx.needs_input_grad
        up = F.linear(x, up_weight, up_bias)
        grad_gate, grad_up, grad_weight, grad_bias = gated_down_gradients(
            grad, gate, up, weight, ctx.has_bias, need_gate, need_x or need_up_weight or need_up_bias, need_weight,
            need_bias, param=ctx.params[1])
        grad_x = grad_up @ up_weight if need_x else None
        grad_up_weight = grad_up_bias = None
        if need_up_weight:
            grad_up_weight = weight_gradient(ctx.params[0], grad_up, x)
        if up_bias is not None and need_up_bias:
            grad_up_bias = grad_up.reshape(-1, grad_up.shape[-1]).sum(0)
        return grad_x, grad_gate, grad_up_weight, grad_up_bias, grad_weight, grad_bias


def _plain_linear(layer: Any) -> bool:
    return (type(layer) is torch.nn.Linear and whole_tensor(layer.weight)
            and (layer.bias is None or whole_tensor(layer.bias)))


def lean_forward(self, x: torch.Tensor) -> torch.Tensor:
    lean = torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type) and _plain_linear(self.down_proj)
    gate = self.gate_proj(x)
    if lean and getattr(self, "recompute_up", False) and _plain_linear(self.up_proj) and (
            x.requires_grad or gate.requires_grad
            or any(p.requires_grad for p in (*self.up_proj.parameters(), *self.down_proj.parameters()))):
        return GatedUpDown.apply(x, gate, self.up_proj.weight, self.up_proj.bias, self.down_proj.weight,
                                 self.down_proj.bias)
    up = self.up_proj(x)
    if lean and (gate.requires_grad or up.requires_grad or self.down_proj.weight.requires_grad):
        return GatedDown.apply(gate, up, self.down_proj.weight, self.down_proj.bias)
    return self.down_proj(self.act_fn(gate) * up)


def is_silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def use_lean_mlp(model: torch.nn.Module) -> int:
    """Give every gated SiLU MLP of `model` the lean forward; -> how many."""
    n = 0
    for module in model.modules():
        if all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj")) \
                and is_silu(getattr(module, "act_fn", None)):
            module.forward = types.MethodType(lean_forward, module)
            n += 1
    return n


def recompute_up_projection(model: torch.nn.Module, on: bool) -> int:
    """Whether the lean MLPs of `model` recompute their up projection in the backward; -> how many MLPs."""
    n = 0
    for module in model.modules():
        if getattr(module, "forward", None) is not None and getattr(module.forward, "__func__", None) is lean_forward:
            module.recompute_up = on
            n += 1
    return n
