"""Per-token log-probs of completion tokens under a causal LM.

Only completion positions get logits (`logits_to_keep`), and the fp32 log-softmax runs over small
row chunks under activation checkpointing, so a [b, T, V] fp32 tensor never exists, not even for
the backward pass. Where the model's forward returns its LM head's output as it is (`HEAD_CHUNKED`), the LM head
itself runs inside those chunks (`head_logps`): the micro-batch's [b, T, V] logits never exist either, neither kept
for the backward nor as their gradient; a chunk's are recomputed in the backward.
Logits are divided by the sampling temperature: the policy that sampled is pi(. | T), and the
ratio pi/pi_old must compare the same distribution (TRL does the same). With top-k / top-p / min-p sampling
the kept set is replayed on these logits first (`truncation`, grpo_cli/algo/sampling.py): the log-probs are of the
truncated, renormalised policy that sampled.
A group's G rows share their prompt: it runs through the model once per micro-batch, not G times.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from grpo_cli.algo import head_gradient
from grpo_cli.algo.head_gradient import (ChunkedHead, Shared, embedding_lookup, plain_logps, plain_logps_grad,
                                         plain_weight, replaced_forward)
from grpo_cli.algo.packing import Packed, one_bin_for, pack
from grpo_cli.algo.sampling import Truncation, truncated_logps


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, L] 0/1 mask with left padding -> positions counting from the first real token (as generate does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _chunk_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    x = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(x.exp() * x).sum(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float, chunk_rows: int = 1, grad: bool = False) -> torch.Tensor:
    """[b, T, V] logits -> [b, T] entropy of softmax(logits / T), fp32 a chunk of rows at a time; with `grad`
    differentiable (the entropy bonus), the fp32 chunk recomputed in backward as for the log-probs."""
    if grad:
        return torch.cat([checkpoint(_chunk_entropy, c, temperature, use_reentrant=False)
                          for c in logits.split(chunk_rows)])
    with torch.no_grad():
        return torch.cat([_chunk_entropy(c, temperature) for c in logits.detach().split(chunk_rows)])


def token_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [b, P]
    prompt_mask: torch.Tensor,  # [b, P]
    completion_ids: torch.Tensor,  # [b, T]
    completion_mask: torch.Tensor,  # [b, T]
    *,
    temperature: float = 1.0,
    chunk_rows: int = 1,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    shared_prompts: bool = True,
    truncation: Truncation | None = None,
    chunked_head: bool | str = True,
    packing: bool | str = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> logps [b, T] (fp32) and, if asked, per-token entropy [b, T] (no grad, unless `entropy_grad`).

    `shared_prompts`: rows with the same prompt (a group's G completions) run the prompt through the
    model once: its keys and values are computed for each distinct prompt, indexed out to the rows
    (backward sums their gradients), and the completions attend to them, so a group's prompt costs one
    row's forward and backward instead of G. Same function, same gradient (to float rounding).
    `truncation`: the log-probs of the truncated sampling policy (its kept set replayed); the entropy stays the full
    distribution's at temperature T.
    `chunked_head`: run the LM head inside the row chunks where the model allows it (`HeadLogps`); KEEP_LOGITS: the
    chunks' logits kept for the backward rather than recomputed there.
    `packing`: the rows packed end to end (grpo_cli/algo/packing.py), no padding computed; the same values and
    gradients, and 0 (not a value computed on padding) where the completion mask is 0. Takes the place of
    `shared_prompts`; "auto": packed where that runs fewer tokens than the padded layout (with `shared_prompts`, each
    distinct prompt once)."""
    packed = pack(prompt_ids, prompt_mask, completion_ids, completion_mask, one_bin=one_bin_for(_unwrapped(model))) \
        if packing else None
    if packed is not None and packing == "auto":
        shared = distinct_rows(prompt_ids, prompt_mask) if shared_prompts else None
        prompts = len(shared[0]) if shared is not None else len(prompt_ids)
        if packed.input_ids.numel() >= prompts * prompt_ids.shape[1] + completion_ids.numel():
            packed = None
    if packed is not None:
        return _packed_logprobs(model, packed, temperature=temperature, chunk_rows=chunk_rows,
                                entropy=with_entropy or entropy_grad, entropy_grad=entropy_grad,
                                truncation=truncation, chunked=chunked_head if _head_of(model) is not None else False)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    positions = position_ids_from_mask(attention_mask)
    head = HeadLogps(_head_of(model) if chunked_head else None, temperature, chunk_rows, truncation,
                     with_entropy or entropy_grad, entropy_grad, _unwrapped(model).get_input_embeddings(),
                     keep=chunked_head == KEEP_LOGITS)
    parts = (_shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, attention_mask, positions, head)
             if shared_prompts else None)  # [(logits or head_logps' output, which)]
    if parts is None:
        # the last kept position predicts past the completion: its target is a placeholder, its result dropped
        with head(torch.cat([completion_ids, completion_ids[:, :1]], dim=1)):
            out = model(
                input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
                attention_mask=attention_mask,
                position_ids=positions,
                logits_to_keep=completion_ids.shape[1] + 1,
                use_cache=False,
            )
        parts = [(out.logits[:, :-1], head.ran)]  # [b, T, V] (or [b, T, 2] from head): position t predicts token t
    ids = completion_ids.split([p.shape[1] for p, _ in parts], dim=1)
    logps, entropy = [], []
    for (part, packed), i in zip(parts, ids):
        if packed:
            logps.append(part[..., 0])
            entropy.append(part[..., 1] if entropy_grad else part[..., 1].detach())
            continue
        logps.append(logps_from_logits(part, i, temperature, chunk_rows, truncation))
        entropy.append(entropy_from_logits(part, temperature, chunk_rows, entropy_grad)
                       if with_entropy or entropy_grad else None)
    return torch.cat(logps, dim=1), (torch.cat(entropy, dim=1) if with_entropy or entropy_grad else None)


# CausalLM forwards that return `lm_head(hidden)` unchanged (no soft-capping or scaling of the logits after it)
HEAD_CHUNKED = {"llama", "qwen2", "qwen3", "mistral"}
KEEP_LOGITS = "keep_logits"  # train.chunked_lm_head's value for chunks whose logits are kept for the backward


def whole_tensor(p: torch.Tensor | None) -> bool:
    """A parameter holding its whole value here as a plain tensor: not a DTensor shard (FSDP2) or another tensor
    subclass, and not a DeepSpeed ZeRO-3 partition (a plain tensor marked `ds_id`, gathered whole only in the
    pre-forward hook of the module that owns it). Code that reads a module's weight without calling the module
    (the chunked LM head here, models/swiglu.py's lean MLP) needs it."""
    return p is not None and type(p.data) is torch.Tensor and not hasattr(p, "ds_id")


def _unwrapped(model) -> torch.nn.Module:
    """The model under DistributedDataParallel and PEFT's wrapper: the one with a config and an output head."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _head_of(model) -> torch.nn.Module | None:
    """The LM head `head_logps` may take over: of a HEAD_CHUNKED model, plain or with LoRA adapters, alone or under
    DistributedDataParallel; None under FSDP or DeepSpeed (whose weights are gathered by module hooks, which a chunk
    recomputed in the backward would not run)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    if any(type(m).__name__ in ("FullyShardedDataParallel", "DeepSpeedEngine") or type(m).__name__.startswith("FSDP")
           for m in (model, *model.children())):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(getattr(base, "config", None), "model_type", None) not in HEAD_CHUNKED:
        return None
    head = base.get_output_embeddings()
    return head if whole_tensor(getattr(head, "weight", None)) else None


class HeadLogps:
    """`with head(targets): model(...)` runs the model with its LM head (`module`, from `_head_of`) replaced, for that
    call, by `head_logps`: per chunk of rows the logits of the kept positions, their log-probs of `targets` [b, K]
    (and entropy), and the logits dropped (with `keep`, kept for the backward); under autograd each chunk is
    recomputed in the backward. The model then returns, in place of [b, K, V] logits, [b, K, 2]: log-prob and entropy
    (0 where not asked). With `module` None (a head that cannot be taken over, or train.chunked_lm_head off) the model
    runs unchanged and returns logits. `head(targets, rows=inverse)`: the model's hidden states are of distinct rows,
    [u, K, H], and `rows_of(hidden, inverse)` gives the [b, K, H] that `targets` [b, K] go with (a group's prompt run
    once: its last position predicts each row's first completion token)."""

    def __init__(self, module: torch.nn.Module | None, temperature: float, chunk_rows: int,
                 truncation: Truncation | None, entropy: bool, entropy_grad: bool,
                 embedding: torch.nn.Module | None = None, keep: bool = False) -> None:
        self.module, self.keep = module, keep
        self.embedding = embedding  # its gradient added in place too where it can be (head_gradient.embedding_lookup)
        self.temperature, self.chunk_rows, self.truncation = temperature, chunk_rows, truncation
        self.entropy, self.entropy_grad = entropy, entropy_grad
        self.ran = False  # whether the last call's model output came from it

    @contextmanager
    def __call__(self, targets: torch.Tensor, rows: torch.Tensor | None = None) -> Iterator[None]:
        self.ran = False
        if self.module is None:
            yield
            return
        with embedding_lookup(self.embedding, plain_weight(self.module)) as shared, \
                replaced_forward(self.module, partial(self._forward, targets=targets, shared=shared, rows=rows)):
            yield

    def _forward(self, original, hidden: torch.Tensor, targets: torch.Tensor, shared: Shared | None,
                 rows: torch.Tensor | None) -> torch.Tensor:
        self.ran = True
        return head_logps(original, hidden if rows is None else rows_of(hidden, rows), targets, self.temperature,
                          self.chunk_rows, self.truncation, self.entropy, self.entropy_grad, plain_weight(self.module),
                          shared, self.keep)


def head_logps(head_forward, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_rows: int = 1,
               truncation: Truncation | None = None, entropy: bool = False, entropy_grad: bool = False,
               weight: torch.Tensor | None = None, shared: Shared | None = None, keep: bool = False) -> torch.Tensor:
    """[b, K, H] hidden states, [b, K] targets -> [b, K, 2] (log-prob, entropy or 0) through the LM head
    `head_forward`, `chunk_rows` rows at a time: a chunk's [c, K, V] logits exist only inside it, and under autograd
    are recomputed in the backward. `weight`: the head's (`plain_weight`), whose gradient the chunks then add into one
    tensor (grpo_cli/algo/head_gradient.py), handed to a tied embedding's lookup with `shared`, and with `keep` the
    chunks' logits are kept for the backward instead; without it each chunk runs under checkpointing."""
    grad = torch.is_grad_enabled() and hidden.requires_grad
    # chunks of positions, at most head_gradient.CHUNK_LOGITS logits in each; without autograd too (an old policy's or
    # a reference's forward), so that its numbers are the training forward's bit for bit: the same products and sums
    if weight is not None:
        (b, k), h = targets.shape, hidden.shape[-1]
        positions = max(1, min(chunk_rows * k, head_gradient.CHUNK_LOGITS // weight.shape[0]))
        closed = not entropy_grad and (truncation is None or not truncation.active)  # the plain log-probs
        after = (partial(plain_logps, temperature, entropy) if closed
                 else partial(_after_head, temperature, truncation, entropy, entropy_grad))
        out = ChunkedHead.apply(hidden.reshape(b * k, 1, h), weight, targets.reshape(b * k, 1), head_forward, after,
                                positions, shared, partial(plain_logps_grad, temperature) if closed else None,
                                keep and grad)
        return out.reshape(b, k, -1)
    chunk = partial(_head_chunk, head_forward, temperature, truncation, entropy, entropy_grad)
    out = []
    for h, tok in zip(hidden.split(chunk_rows), targets.split(chunk_rows)):
        out.append(checkpoint(chunk, h, tok, use_reentrant=False) if grad else chunk(h, tok))
    return torch.cat(out)


def _head_chunk(head_forward, temperature: float, truncation: Truncation | None, entropy: bool, entropy_grad: bool,
                hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[c, K, H] hidden states, [c, K] targets -> [c, K, 2]: log pi(target) and the entropy (0 unless asked; without
    a gradient unless `entropy_grad`), the [c, K, V] logits only inside."""
    return _after_head(temperature, truncation, entropy, entropy_grad, head_forward(hidden), ids)


def _after_head(temperature: float, truncation: Truncation | None, entropy: bool, entropy_grad: bool,
                logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logps = truncated_logps(logits, ids, temperature, truncation)
    if not entropy:
        return torch.stack([logps, torch.zeros_like(logps)], dim=-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = _chunk_entropy(logits, temperature)
    return torch.stack([logps, ent], dim=-1)


def _packed_logprobs(model, packed: Packed, *, temperature: float, chunk_rows: int, entropy: bool, entropy_grad: bool,
                     truncation: Truncation | None, chunked: bool | str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs on the packed layout: the model runs the bins; the LM head, taken over for the call, gets only
    the K hidden states that predict a completion token ([K, 1, H]), and with `chunked` computes their log-probs inside
    chunks of as many positions as `chunk_rows` padded rows hold. A head that cannot be taken over (FSDP's wrapper)
    computes every position's logits and the K are picked from them."""
    head = _unwrapped(model).get_output_embeddings()
    if head is not None and "FullyShardedDataParallel" in type(head).__name__:
        head = None
    targets, rows = packed.targets[:, None], chunk_rows * packed.shape[1]

    embedding = _unwrapped(model).get_input_embeddings() if chunked else None

    def selected(shared: Shared | None, original, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden[packed.at][:, None]  # [K, 1, H]
        if chunked:
            return head_logps(original, h, targets, temperature, rows, truncation, entropy, entropy_grad,
                              plain_weight(head), shared, chunked == KEEP_LOGITS)
        return original(h)

    inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False)
    if head is None:
        out = model(**inputs)
        logits, chunked = out.logits[packed.at][:, None], False  # [K, 1, V]
    else:
        with embedding_lookup(embedding, plain_weight(head)) as shared, \
                replaced_forward(head, partial(selected, shared)):
            logits = model(**inputs).logits  # [K, 1, V], or [K, 1, 2] from head_logps
    if chunked:
        logps, ent = logits[:, 0, 0], logits[:, 0, 1]
        ent = ent if entropy_grad else ent.detach()
    else:
        logps = logps_from_logits(logits, targets, temperature, rows, truncation)[:, 0]
        ent = entropy_from_logits(logits, temperature, rows, entropy_grad)[:, 0] if entropy else None
    return packed.unpacked(logps), (packed.unpacked(ent) if entropy else None)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows of left-padded [b, L] ids/mask that repeat (a group's G copies of its prompt) -> (first: [u] one row
    index per distinct row, inverse: [b] each row's distinct index), or None when every row differs."""
    distinct, inverse = torch.unique(torch.cat([ids, mask], dim=1), dim=0, return_inverse=True)
    if len(distinct) == len(ids):
        return None
    rows = torch.arange(len(inverse), device=inverse.device)
    return torch.zeros(len(distinct), dtype=torch.long, device=inverse.device).scatter_(0, inverse, rows), inverse


def _shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, attention_mask, positions,
                          head: HeadLogps) -> list[tuple[torch.Tensor, bool]] | None:
    """Logits of the completion tokens, each distinct prompt run once -> [b, 1, V] and [b, T-1, V] (each [b, ., 2]
    through `head`); None when every row's prompt differs, or the model returns no key/value cache (gradient
    checkpointing)."""
    shared = distinct_rows(prompt_ids, prompt_mask)
    if shared is None:
        return None
    first, inverse = shared
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    with head(completion_ids[:, :1], rows=inverse):  # the prompt's last position: each row's first token
        prefix = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first],
                       position_ids=positions[first, :P], logits_to_keep=1, use_cache=True)
    first_token = (prefix.logits, True) if head.ran else (rows_of(prefix.logits, inverse), False)
    cache = prefix.past_key_values
    if cache is None:
        return None
    _select_rows(cache, inverse)  # [u, ...] -> [b, ...]; backward sums the rows' gradients
    with head(torch.cat([completion_ids[:, 1:], completion_ids[:, :1]], dim=1)):  # the last target: a placeholder
        out = model(input_ids=completion_ids, attention_mask=attention_mask, position_ids=positions[:, P:],
                    past_key_values=cache, logits_to_keep=T, use_cache=True)
    # the prompt's last position predicts completion token 0, completion position t token t + 1
    return [first_token, (out.logits[:, :-1], head.ran)]


def _select_rows(cache, inverse: torch.Tensor) -> None:
    """A prompt cache's rows -> the batch's, by `rows_of` where a layer holds only keys and values per row (it selects
    them as transformers' base layer does); a layer with more per-row state (an indexer's keys, a recurrent state)
    selects its own (its backward is then the indexing one)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer).batch_select_indices is not DynamicLayer.batch_select_indices
                             or not layer.is_initialized for layer in layers):
        cache.batch_select_indices(inverse)
        return
    for layer in layers:
        layer.keys, layer.values = rows_of(layer.keys, inverse), rows_of(layer.values, inverse)


def rows_of(t: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """[u, ...] -> [b, ...], row i = t[inverse[i]], with a backward that sums each row's gradients in one order on
    every run. Indexing (`t[inverse]`) does not: its backward adds rows that share an index with atomic adds split over
    threads (CPU, CUDA), so a group's prompt got a differently rounded gradient on every run (SmolLM2 on 2 CPU
    threads: 211 of 272 tensors 1 ulp apart after one step, and `grpo replay` could not reproduce it). Contiguous
    groups of equal size (a group's G rows, the usual layout) repeat by expanding, whose backward is a sum over the
    group; any other layout by `index_select`, whose backward adds the rows one index at a time on the CPU."""
    u, b = t.shape[0], inverse.shape[0]
    if b % u == 0 and torch.equal(inverse, torch.arange(u, device=inverse.device).repeat_interleave(b // u)):
        return t.unsqueeze(1).expand(u, b // u, *t.shape[1:]).reshape(b, *t.shape[1:])
    return t.index_select(0, inverse)


def logps_from_logits(logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_rows: int = 1,
                      truncation: Truncation | None = None) -> torch.Tensor:
    """[b, T, V] logits (any dtype), [b, T] ids -> [b, T] fp32 log-probs, fp32 one chunk of rows at a time.

    `split` (not slicing) lets autograd assemble the logits gradient once, instead of a full-size
    zero tensor per chunk; under grad the fp32 chunk is recomputed in backward instead of kept."""
    grad = torch.is_grad_enabled() and logits.requires_grad
    out = []
    for lg, tok in zip(logits.split(chunk_rows), ids.split(chunk_rows)):
        if grad:
            out.append(checkpoint(truncated_logps, lg, tok, temperature, truncation, use_reentrant=False))
        else:
            out.append(truncated_logps(lg, tok, temperature, truncation))  # [c, T, V] fp32, one chunk only
    return torch.cat(out)


@torch.no_grad()
def logps_no_grad(model, rollout, slices: list[slice], *, temperature: float, shared_prompts: bool, autocast,
                  truncation: Truncation | None = None, chunked_head: bool = True, packing: bool = False) -> torch.Tensor:
    """[N, T] log-probs of a rollout's completion tokens without autograd, micro-batch by micro-batch (`slices`),
    under `autocast()` (the trainer's mixed precision): the old policy's or the reference's."""
    out = []
    with torch.inference_mode(), autocast():
        for sl in slices:
            lp, _ = token_logprobs(model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl],
                                   rollout.completion_mask[sl], temperature=temperature, shared_prompts=shared_prompts,
                                   truncation=truncation, chunked_head=chunked_head, packing=packing)
            out.append(lp)
    return torch.cat(out).clone()  # clone: leave inference mode so autograd can use it as a constant
