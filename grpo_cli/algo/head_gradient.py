"""The LM head inside the log-prob chunks, with its weight gradient built in one tensor.

`head_logps` (grpo_cli/algo/logprobs.py) runs the head a chunk of rows at a time so that a micro-batch's [b, K, V]
logits never exist. Recomputed per chunk under activation checkpointing, each chunk's backward makes its own
[V, H] weight gradient, and autograd sums them out of place: the running sum, the next chunk's gradient and their
new sum are alive at once, three tensors of the head's size beside the gradient kept between micro-batches (0.76 GiB
for Qwen2.5-0.5B's 151,936 x 896 head in bf16, most of a training step's transient memory on a GPU). Here one
autograd function runs all the chunks: its backward recomputes a chunk's logits, takes their gradient through what
follows the head (log-probs, entropy), and adds the chunk's products into one weight gradient in place, the same
products and sums autograd computes (to float rounding), in one tensor. Autograd adds a tied embedding's gradient
(Qwen2.5's, SmolLM2's) into that tensor in place too, as it is a fresh one. Its chunks are of positions, at most
CHUNK_LOGITS logits each, not of rows: a row of 8,192 completion tokens over 151,936 entries would be 4.6 GiB in
float32, and a chunk's forward and backward hold a few such tensors at once. Smaller chunks take less memory and more time on
a GPU, where each is a dozen kernels and an autograd call: with 27 positions a chunk (Qwen2.5's vocabulary), a step of
128 rows x 256 tokens took 4.9 s on an H200 against 4.0-4.5 s with a row a chunk, and its peak was 0.4 GiB lower
(bench/RESULTS.md); 110 positions a chunk gave back half the memory saved, on the CPU.
"""

from __future__ import annotations

from typing import Callable

import torch


CHUNK_LOGITS = 1 << 22  # logits in one chunk: 16 MiB a tensor in float32 (Qwen2.5's 151,936 entries: 27 positions)


def plain_weight(head: torch.nn.Module | None) -> torch.Tensor | None:
    """The weight of a head this function can take over: a bias-free `nn.Linear` itself (not a LoRA layer or a
    quantized subclass, whose forward is not `hidden @ weight.T`); else None (the chunks run under checkpointing)."""
    if type(head) is torch.nn.Linear and head.bias is None:
        return head.weight
    return None


class ChunkedHead(torch.autograd.Function):
    """`ChunkedHead.apply(hidden [b, K, H], weight [V, H], targets [b, K], head_forward, after, chunk_rows)` ->
    cat over chunks of `after(head_forward(hidden_chunk), targets_chunk)`; `head_forward(h)` is `h @ weight.T`
    (under the caller's autocast, which the backward's recomputation repeats)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                head_forward: Callable, after: Callable, chunk_rows: int) -> torch.Tensor:
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.head_forward, ctx.after, ctx.chunk_rows = head_forward, after, chunk_rows
        ctx.save_for_backward(hidden, weight, targets)
        chunks = zip(hidden.split(chunk_rows), targets.split(chunk_rows))
        return torch.cat([after(head_forward(h), t) for h, t in chunks])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, targets = ctx.saved_tensors
        device, enabled, dtype = ctx.autocast
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = w = None
        start = 0
        for h, t, g in zip(hidden.split(ctx.chunk_rows), targets.split(ctx.chunk_rows), grad_out.split(ctx.chunk_rows)):
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                with torch.no_grad():
                    logits = ctx.head_forward(h)
                logits.requires_grad_(True)
                with torch.enable_grad():
                    (d,) = torch.autograd.grad(ctx.after(logits, t), logits, g)
            del logits
            if w is None:  # the weight as the forward's product read it (autocast: a copy in its dtype, made once)
                w = weight if weight.dtype == d.dtype else weight.to(d.dtype)
            if grad_hidden is not None:
                grad_hidden[start:start + len(h)] = d @ w
            if ctx.needs_input_grad[1]:
                d2, h2 = d.flatten(0, -2).t(), h.flatten(0, -2).to(d.dtype)
                if grad_weight is None:
                    grad_weight = d2.mm(h2)
                    grad_weight = grad_weight if grad_weight.dtype == weight.dtype else grad_weight.to(weight.dtype)
                elif grad_weight.dtype == d.dtype:
                    grad_weight.addmm_(d2, h2)
                else:  # autocast: the product in its dtype, summed in the weight's (as autograd casts each back)
                    grad_weight.add_(d2.mm(h2))
            start += len(h)
        return grad_hidden, grad_weight, None, None, None, None
