"""Linear layers that add their weight gradient into the kept one in place, instead of handing autograd a new tensor.

Autograd gives a linear layer's backward a new [out, in] tensor for its weight's gradient, which the weight's
accumulation then adds into `.grad` (or takes as `.grad` on a step's first micro-batch) and frees. When a weight is
used twice in one backward, autograd first sums the two uses' tensors and accumulates once, so the first use's
tensor waits for the second: grpo runs a group's prompt in a forward of its own (the completions read its keys and
values), and the completions' backward, which runs first, leaves a gradient of every layer's weights waiting for the
prompt's, most of the model's size at once (SmolLM2-135M, 8 rows: glibc's heap grew 0.79 GiB in a micro-batch's
forward + backward, 0.50 GiB with the gradients added in place; bench/RESULTS.md). `AccumulatingLinear` adds each
use's product into the weight's kept gradient where it can (algo/head_gradient.kept_gradient: a weight without a
gradient yet gets one of zeros, or its home in trainer/blocks.py's block; DDP's reduction finds it as it finds any),
so nothing of a weight's size is new in a backward, and the separate add is gone. A layer fed by a lean RMS norm
keeps the norm's input and root (which the norm keeps anyway) and recomputes its input in the backward, instead of
keeping the norm's output (models/rmsnorm.NORMALIZED). The products are autograd's; `grad + a @ b` as one `addmm_`
is the same sum (bit for bit on the CPU below its K-blocking, else the products' rounding), and with a group's
prompt its use is added after the completions' instead of to them first: the order of two float additions. The
recomputation reads tensors the norm kept, not its output: a forward that changed the output in place after the
layer read it would go unnoticed (transformers' decoder layers do not).

Installed by `use_accumulating_linears` on every plain `nn.Linear` (the LM head too, where the chunked head does not
take it over; LoRA's A and B; not subclasses such as quantized layers). It runs under autograd without autocast
(whose casts a custom function would have to repeat), on a trained weight holding its whole value (not an FSDP or
ZeRO-3 shard); otherwise the class's own forward, or, outside autograd while sampling, on a decode step's few rows
in float32 on a CPU, models/few_rows.py's product (torch's to float rounding, faster). The lean MLP's down and up
projections (models/swiglu.py) add their weight gradients the same way through `weight_gradient`.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from grpo_cli.algo.head_gradient import kept_gradient
from grpo_cli.algo.logprobs import whole_tensor
from grpo_cli.models import few_rows
from grpo_cli.models.rmsnorm import NORMALIZED, scaled


def weight_gradient(weight: torch.Tensor, grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """The gradient of `x @ weight.T` for `weight` [out, in], summed over every leading position of `grad_out`
    [..., out] and `x` [..., in]: added into the weight's kept gradient (-> None: autograd has nothing to add), else
    -> the new tensor."""
    g, x = grad_out.reshape(-1, grad_out.shape[-1]), x.reshape(-1, x.shape[-1])
    kept = kept_gradient(weight)
    if kept is None:
        return g.t().mm(x)
    kept.addmm_(g.t(), x)
    return None


class AccumulatingLinear(torch.autograd.Function):
    """(x, weight, bias) -> F.linear(x, weight, bias), whose backward adds the weight's gradient in place
    (`weight_gradient`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        norm = NORMALIZED.get(x)  # a lean RMS norm's output: recomputed from what the norm keeps for its backward
        ctx.save_for_backward(weight, *(norm if norm is not None else (x,)))
        ctx.weight, ctx.has_bias = weight, bias is not None  # the parameter: under activation checkpointing the
        # saved tensors come back detached from it, and its gradient is the parameter's own
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight, *kept = ctx.saved_tensors
        x = kept[0] if len(kept) == 1 else scaled(*kept)
        need_x, need_weight, need_bias = ctx.needs_input_grad
        grad_x = grad @ weight if need_x else None
        grad_weight = weight_gradient(ctx.weight, grad, x) if need_weight else None
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias and need_bias else None
        return grad_x, grad_weight, grad_bias


def accumulating_forward(self, x: torch.Tensor) -> torch.Tensor:
    autocast = torch.is_autocast_enabled(x.device.type)
    if torch.is_grad_enabled():
        if (self.weight.requires_grad and whole_tensor(self.weight) and (self.bias is None or whole_tensor(self.bias))
                and not autocast):
            return AccumulatingLinear.apply(x, self.weight, self.bias)
        if x.requires_grad or self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad):
            return type(self).forward(self, x)
    if not autocast:
        y = few_rows.linear(x, self.weight, self.bias)  # a decode step's few rows: read at the memory's speed
        if y is not None:
            return y
    return type(self).forward(self, x)  # the class's own


def use_accumulating_linears(model: torch.nn.Module) -> int:
    """Give every plain `nn.Linear` of `model` the accumulating forward; -> how many."""
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not accumulates(module):
            module.forward = types.MethodType(accumulating_forward, module)
            n += 1
    return n


def accumulates(module: torch.nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is accumulating_forward
