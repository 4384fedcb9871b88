"""The LM head inside the log-prob chunks, with its weight gradient built in one tensor.

`head_logps` (grpo_cli/algo/logprobs.py) runs the head a chunk of rows at a time so that a micro-batch's [b, K, V]
logits never exist. Recomputed per chunk under activation checkpointing, each chunk's backward makes its own [V, H]
weight gradient, and autograd sums them out of place: the running sum, the next chunk's gradient and their new sum
are alive at once, three tensors of the head's size beside the gradient kept between micro-batches (0.76 GiB for
Qwen2.5-0.5B's 151,936 x 896 head in bf16, most of a training step's transient memory on a GPU). Here one autograd
function runs all the chunks: its backward recomputes a chunk's logits, takes their gradient through what follows
the head (log-probs, entropy; the plain log-probs' in closed form), and adds the chunk's products into one weight
gradient in place, the same products and sums autograd computes (to float rounding), in one tensor; from a step's
second micro-batch on, that tensor is the gradient the first left (`kept_gradient`), so no tensor of the head's size
is new in the backward at all. A tied input embedding (Qwen2.5's, SmolLM2's: the head's weight is the embedding's)
would add a dense [V, H] gradient of its own at the backward's end, and an untied one beside its own kept gradient;
`EmbeddingLookup` adds its rows into one tensor instead (the head's where tied, else its own kept gradient).
ChunkedHead's chunks are of positions, at most CHUNK_LOGITS logits each, not of rows: a row of 8,192 completion tokens
over 151,936 entries would be 4.6 GiB in float32, and a chunk's forward and backward hold a few such tensors at
once. Smaller chunks take less memory and more time on a GPU, where each is a few kernels and a Python loop's turn:
with 27 positions a chunk (Qwen2.5's vocabulary) and autograd through each, a step of 128 rows x 256 tokens took
4.9 s on an H200 against 4.0-4.5 s with a row a chunk, and its peak was 0.4 GiB lower (bench/RESULTS.md); 110
positions a chunk gave back half the memory saved, on the CPU. With the closed form and the kept gradient that step
took 3.7 s (8-bit moments and recomputation: 0.47x TRL's step at 0.76x its peak).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary


# weight -> where its gradient is made when a backward makes it (`new_gradient`): a view of one block of memory for
# every trained weight's gradient (grpo_cli/trainer/blocks.py), zeroed there instead of allocated anew
GRADIENT_HOMES: WeakIdKeyDictionary = WeakIdKeyDictionary()

CHUNK_LOGITS = 1 << 22  # logits in one chunk: 16 MiB a tensor in float32 (Qwen2.5's 151,936 entries: 27 positions)


def plain_weight(head: torch.nn.Module | None) -> torch.Tensor | None:
    """The weight of a head ChunkedHead can take over: a bias-free `nn.Linear` itself (not a LoRA layer or a
    quantized subclass, whose forward is not `hidden @ weight.T`); else None (the chunks run under checkpointing)."""
    if type(head) is torch.nn.Linear and head.bias is None:
        return head.weight
    return None


def plain_embedding(embedding: torch.nn.Module | None) -> torch.nn.Embedding | None:
    """`embedding` when `EmbeddingLookup` can take it over: an `nn.Embedding` itself, trained, that looks rows up as
    they are (no max_norm, no scaling by frequency, dense)."""
    if (type(embedding) is not torch.nn.Embedding or not embedding.weight.requires_grad
            or embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse):
        return None
    return embedding


def kept_gradient(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight.grad` where a backward may add its share into it in place, as autograd's accumulation would: a dense
    tensor of the weight's shape and dtype, no hook on the weight (its gradient then goes through autograd), and a
    backward that accumulates into the weight (`.backward()`, not `torch.autograd.grad`, which returns gradients).
    Where the weight has no gradient yet (a step's first micro-batch) it gets one of zeros here, which the backward
    adds into as into any other (0 + x is x: the same gradient autograd would have set), so that no tensor of the
    weight's size is new beside it however many parts add to it (the head's chunks, a tied embedding, a group's prompt
    run in a forward of its own). DistributedDataParallel reduces the weight's `.grad` as it finds it once the weight's
    accumulation has run, which it does with no gradient to add (tests/trainer/test_distributed.py: two processes give
    the one process's gradient)."""
    grad = weight.grad
    if grad is not None and (grad.layout != torch.strided or grad.shape != weight.shape or grad.dtype != weight.dtype):
        return None
    if weight._backward_hooks or getattr(weight, "_post_accumulate_grad_hooks", None):
        return None
    try:  # raises inside torch.autograd.grad
        accumulates = torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(weight).node)
    except RuntimeError:
        accumulates = False
    if accumulates and grad is None:
        grad = weight.grad = new_gradient(weight)
    return grad if accumulates else None


def new_gradient(weight: torch.Tensor) -> torch.Tensor:
    """A gradient of zeros for `weight`: its home in GRADIENT_HOMES, zeroed, else a tensor of its own."""
    home = GRADIENT_HOMES.get(weight)
    return home.zero_() if home is not None else torch.zeros_like(weight, memory_format=torch.contiguous_format)


class Shared:
    """The head's weight gradient between ChunkedHead's backward, which makes it, and a tied embedding's
    (EmbeddingLookup's), which adds its rows and hands it to autograd as the weight's whole gradient."""

    grad: torch.Tensor | None = None


class EmbeddingLookup(torch.autograd.Function):
    """`EmbeddingLookup.apply(ids, weight, shared, padding_idx)` -> `F.embedding(ids, weight, padding_idx)`, whose
    backward adds the looked-up rows' gradients (none for `padding_idx`, as F.embedding) into one tensor: the weight's
    kept gradient (`kept_gradient`: in place, and autograd gets None), else with `shared` (the head tied to this
    weight: ChunkedHead's backward ran first, the head reading what the embedding began) the head's gradient, else a
    new zero tensor. F.embedding's own backward makes a dense [V, H] gradient on every call, one head size beside the
    kept one (1.09 GB a micro-batch for Qwen2.5-7B's input embedding in bfloat16). The rows are added with
    `index_put_(accumulate=True)` on a GPU: a row's repeats summed in the order of a sort (the same on every run), and
    no wait for the GPU (no count of distinct ids, no mask of the padding's). On a CPU that call adds them with atomic
    adds across threads (another order, and rounding, on every run), so there `index_add_` sums them in the ids'
    order, as F.embedding's own backward does."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, shared: Shared | None,
                padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.shared, ctx.padding_idx = weight, shared, padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight, grad = ctx.weight, None
        if ctx.shared is not None:
            grad, ctx.shared.grad = ctx.shared.grad, None
        kept = kept_gradient(weight) if grad is None else None
        if grad is None:
            grad = kept if kept is not None else torch.zeros_like(weight, memory_format=torch.contiguous_format)
        ids, rows = ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1]).to(grad.dtype)
        if ctx.padding_idx is not None:
            rows = rows.masked_fill((ids == ctx.padding_idx)[:, None], 0)
        if grad.device.type == "cpu":
            grad.index_add_(0, ids, rows)
        else:
            grad.index_put_((ids,), rows, accumulate=True)
        return None, (None if grad is kept else grad), None, None


class ChunkedHead(torch.autograd.Function):
    """`ChunkedHead.apply(hidden [n, K, H], weight [V, H], targets [n, K], head_forward, after, rows, shared,
    after_grad, keep)` -> cat over chunks of `rows` of `after(head_forward(hidden_chunk), targets_chunk)`;
    `head_forward(h)` is `h @ weight.T` (under the caller's autocast, which the backward's recomputation repeats).
    `head_logps` gives it one position a row. With `keep` the chunks' logits are kept for the backward instead of
    recomputed there: no second head product, for the logits' memory (the same values: the product is the same).
    The backward takes a chunk's logits' gradient from `after_grad(logits, targets, grad_out)`
    where given (the plain log-probs' closed form: a few kernels a chunk where autograd through `after` runs a few
    dozen, each a launch on a GPU), else through `after` by autograd. The weight's gradient is added into the kept one
    (`kept_gradient`: autograd then gets None), else built in one new tensor, which goes to `shared` (a tied
    embedding's `EmbeddingLookup`, in the same forward) for it to finish, else to autograd."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, head_forward: Callable,
                after: Callable, chunk_rows: int, shared: Shared | None = None,
                after_grad: Callable | None = None, keep: bool = False) -> torch.Tensor:
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.head_forward, ctx.after, ctx.chunk_rows, ctx.shared = head_forward, after, chunk_rows, shared
        ctx.after_grad, ctx.weight = after_grad, weight
        ctx.save_for_backward(hidden, weight, targets)
        chunks = list(zip(hidden.split(chunk_rows), targets.split(chunk_rows)))
        # a chunk's logits are neither an input nor an output: kept on ctx, each dropped once its backward has run
        ctx.kept = [head_forward(h) for h, _ in chunks] if keep else None
        logits = ctx.kept if keep else (head_forward(h) for h, _ in chunks)
        return torch.cat([after(z, t) for z, (_, t) in zip(logits, chunks)])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, targets = ctx.saved_tensors
        device, enabled, dtype = ctx.autocast
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        kept = kept_gradient(ctx.weight) if ctx.needs_input_grad[1] else None
        grad_weight, w = kept, None
        start = 0
        rows = ctx.chunk_rows
        for i, (h, t, g) in enumerate(zip(hidden.split(rows), targets.split(rows), grad_out.split(rows))):
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                if ctx.kept is not None:
                    logits, ctx.kept[i] = ctx.kept[i], None
                else:
                    with torch.no_grad():
                        logits = ctx.head_forward(h)
                if ctx.after_grad is not None:
                    d = ctx.after_grad(logits, t, g)
                else:
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
        if grad_weight is kept:
            grad_weight = None
        elif ctx.shared is not None:
            ctx.shared.grad, grad_weight = grad_weight, None
        ctx.kept = None
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def plain_logps(temperature: float, entropy: bool, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[..., V] logits, [...] ids -> [..., 2]: float32 log softmax(logits / T)[ids] and the entropy (0 unless
    `entropy`), from one log-softmax: `_after_head`'s values without truncation, in 9 kernels where it runs 20."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logp = torch.log_softmax(x, dim=-1)
    del x
    ent = -logp.exp().mul_(logp).sum(-1) if entropy else logp.new_zeros(logp.shape[:-1])
    return torch.stack([logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1), ent], dim=-1)


def plain_logps_grad(temperature: float, logits: torch.Tensor, ids: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of `grad[..., 0]` x log softmax(logits / T)[ids] with respect to the [..., V] logits, in their
    dtype: (onehot(ids) - softmax(logits / T)) x grad / T, what autograd takes through `plain_logps` and
    `_after_head` (the entropy beside the log-probs, without a gradient, takes none), in 5 kernels."""
    scale = grad[..., :1].float() / temperature  # [..., 1]
    x = logits if temperature == 1.0 else logits.float() / temperature
    d = torch.softmax(x, dim=-1, dtype=torch.float32).mul_(-scale)
    return d.scatter_add_(-1, ids.unsqueeze(-1), scale).to(logits.dtype)


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
def embedding_lookup(embedding: torch.nn.Module | None, head_weight: torch.Tensor | None) -> Iterator[Shared | None]:
    """`with embedding_lookup(embedding, head_weight) as shared:` the input `embedding` looks up through
    EmbeddingLookup inside the block where ChunkedHead takes the head over (`head_weight`: `plain_weight`'s) and the
    embedding is `plain_embedding`'s; `shared` is the way the head's gradient comes to it where the head is tied to it
    (its weight is `head_weight`), else None, as without autograd or where the embedding stays as it is."""
    embedding = plain_embedding(embedding) if head_weight is not None else None
    if embedding is None or not torch.is_grad_enabled():
        yield None
        return
    shared = Shared() if embedding.weight is head_weight else None
    with replaced_forward(embedding, lambda original, ids: EmbeddingLookup.apply(ids, embedding.weight, shared,
                                                                                  embedding.padding_idx)):
        yield shared
