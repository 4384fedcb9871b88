"""The LM head inside the log-prob chunks, with its weight gradient built in one tensor.

`head_logps` (grpo_cli/algo/logprobs.py) runs the head a chunk of rows at a time so that a micro-batch's [b, K, V]
logits never exist. Recomputed per chunk under activation checkpointing, each chunk's backward makes its own [V, H]
weight gradient, and autograd sums them out of place: the running sum, the next chunk's gradient and their new sum
are alive at once, three tensors of the head's size beside the gradient kept between micro-batches (0.76 GiB for
Qwen2.5-0.5B's 151,936 x 896 head in bf16, most of a training step's transient memory on a GPU). Here one autograd
function runs all the chunks: its backward recomputes a chunk's logits, takes their gradient through what follows
the head (log-probs, entropy), and adds the chunk's products into one weight gradient in place, the same products
and sums autograd computes (to float rounding), in one tensor. A tied input embedding (Qwen2.5's, SmolLM2's: the
head's weight is the embedding's) would add a dense [V, H] gradient of its own to that one at the backward's end,
two at once; `TiedEmbedding` adds its rows into the head's tensor instead. ChunkedHead's chunks are of positions, at
most CHUNK_LOGITS logits each, not of rows: a row of 8,192 completion tokens over 151,936 entries would be 4.6 GiB
in float32, and a chunk's forward and backward hold a few such tensors at once. Smaller chunks take less memory and
more time on a GPU, where each is a dozen kernels and an autograd call: with 27 positions a chunk (Qwen2.5's
vocabulary), a step of 128 rows x 256 tokens took 4.9 s on an H200 against 4.0-4.5 s with a row a chunk, and its
peak was 0.4 GiB lower (bench/RESULTS.md); 110 positions a chunk gave back half the memory saved, on the CPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn.functional as F


CHUNK_LOGITS = 1 << 22  # logits in one chunk: 16 MiB a tensor in float32 (Qwen2.5's 151,936 entries: 27 positions)


def plain_weight(head: torch.nn.Module | None) -> torch.Tensor | None:
    """The weight of a head ChunkedHead can take over: a bias-free `nn.Linear` itself (not a LoRA layer or a
    quantized subclass, whose forward is not `hidden @ weight.T`); else None (the chunks run under checkpointing)."""
    if type(head) is torch.nn.Linear and head.bias is None:
        return head.weight
    return None


def plain_embedding(embedding: torch.nn.Module | None, weight: torch.Tensor | None) -> torch.nn.Embedding | None:
    """`embedding` when `TiedEmbedding` can take it over: an `nn.Embedding` itself whose weight is `weight` (the plain
    head's, trained) and that looks rows up as they are (no max_norm, no scaling by frequency, dense)."""
    if (weight is None or type(embedding) is not torch.nn.Embedding or embedding.weight is not weight
            or not weight.requires_grad or embedding.max_norm is not None or embedding.scale_grad_by_freq
            or embedding.sparse):
        return None
    return embedding


class Shared:
    """The head's weight gradient between ChunkedHead's backward, which makes it, and TiedEmbedding's, which adds the
    embedding's rows and hands it to autograd as the weight's whole gradient."""

    grad: torch.Tensor | None = None


class TiedEmbedding(torch.autograd.Function):
    """`TiedEmbedding.apply(ids, weight, shared, padding_idx)` -> `F.embedding(ids, weight, padding_idx)`. The backward
    runs after ChunkedHead's (the head reads what the embedding began) and adds the looked-up rows' gradients (none for
    `padding_idx`, as F.embedding) into `shared.grad` (a zero tensor when no head left one): with distinct rows, summed
    first, so that adding them is the same on every run on a GPU too. Autograd gets that one tensor for the weight,
    and None from the head's function."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, shared: Shared, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.shared, ctx.padding_idx, ctx.shape, ctx.dtype = shared, padding_idx, weight.shape, weight.dtype
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (ids,) = ctx.saved_tensors
        grad, ctx.shared.grad = ctx.shared.grad, None
        if grad is None:
            grad = torch.zeros(ctx.shape, dtype=ctx.dtype, device=grad_out.device)
        ids, rows = ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.padding_idx is not None:
            keep = ids != ctx.padding_idx
            ids, rows = ids[keep], rows[keep]
        rows = torch.sparse_coo_tensor(ids[None], rows.to(grad.dtype), (ctx.shape[0], rows.shape[1]),
                                       check_invariants=False).coalesce()  # ids < V: the lookup read them
        grad.index_add_(0, rows.indices()[0], rows.values())
        return None, grad, None, None


class ChunkedHead(torch.autograd.Function):
    """`ChunkedHead.apply(hidden [n, K, H], weight [V, H], targets [n, K], head_forward, after, rows, shared)` -> cat
    over chunks of `rows` of `after(head_forward(hidden_chunk), targets_chunk)`; `head_forward(h)` is `h @ weight.T`
    (under the caller's autocast, which the backward's recomputation repeats). `head_logps` gives it one position a
    row. With `shared` (a tied embedding's `TiedEmbedding` runs in the same forward) the weight's gradient goes there
    for it to finish, else to autograd."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                head_forward: Callable, after: Callable, chunk_rows: int, shared: Shared | None = None) -> torch.Tensor:
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.head_forward, ctx.after, ctx.chunk_rows, ctx.shared = head_forward, after, chunk_rows, shared
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
        rows = ctx.chunk_rows
        for h, t, g in zip(hidden.split(rows), targets.split(rows), grad_out.split(rows)):
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
        if ctx.shared is not None and grad_weight is not None:
            ctx.shared.grad, grad_weight = grad_weight, None
        return grad_hidden, grad_weight, None, None, None, None, None


@contextmanager
def replaced_forward(module: torch.nn.Module, forward) -> Iterator[None]:
    """`module`'s calls (hooks included) run `forward(original_forward, *args)` inside the block; then its own again."""
    own = module.__dict__.get("forward")
    module.forward = partial(forward, module.forward)
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


@contextmanager
def tied_lookup(embedding: torch.nn.Embedding | None) -> Iterator[Shared | None]:
    """`with tied_lookup(embedding) as shared:` `embedding` (`plain_embedding`'s) looks up through TiedEmbedding inside
    the block, and `shared` is the way the head's gradient comes to it (for ChunkedHead); None (the embedding as it is)
    without one, or without autograd."""
    if embedding is None or not torch.is_grad_enabled():
        yield None
        return
    shared = Shared()
    with replaced_forward(embedding, lambda original, ids: TiedEmbedding.apply(ids, embedding.weight, shared,
                                                                                embedding.padding_idx)):
        yield shared
