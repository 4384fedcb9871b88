"""Grouped-query attention without repeated keys and values, for a masked batch.

transformers' `sdpa` attention copies every key/value head `n_rep` times (`repeat_kv`) whenever an attention mask is
given, which is always the case for left-padded rollouts and for the training forward of a group's rows: at decode it
reads `n_rep` times the cache it needs (Qwen2.5-0.5B: 14 query heads on 2 key/value heads, 7x), and in training the
copies are saved for the backward (SmolLM2, 8 rows x ~90 positions: 0.1 GiB of a micro-batch's 0.53 GiB of
activations). `grouped_sdpa` runs the same attention without the copies:
- on the CPU, whose flash kernel takes grouped heads with a mask, as sdpa's `enable_gqa`;
- elsewhere (CUDA's kernels fall back to the repeating math kernel for grouped heads with a mask) by folding each
  key/value head's `n_rep` query heads into the query-length axis, [b, kv * n_rep, q, d] -> [b, kv, n_rep * q, d],
  with the mask's rows repeated to match, [b, 1, q, k] -> [b, 1, n_rep * q, k]: the same products and softmaxes,
  each key/value head read once.
Either way sdpa gets an additive mask made once per forward and shared by every layer. A batch without padding gets
no mask from transformers, which then asks sdpa for `is_causal` with `enable_gqa`: CUDA runs that in its flash kernel
in 16-bit, but in float32 only in the math kernel, which keeps every layer's [b, heads, q, k] attention weights for the
backward (7 x 81 MiB at 8 rows x 576 positions, H200); there the causal mask is made ([1, 1, q, q], once per forward)
and folded as above.

Where no mask is given otherwise, or the call needs what neither handles (a position bias, a paged cache, attention
weights), it is transformers' own `sdpa`, unchanged. Registered as `sdpa_grouped` (attention and mask interfaces),
and chosen by `use_grouped_sdpa` for a model that transformers put on `sdpa` and that has grouped heads.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

NAME = "sdpa_grouped"

# devices whose sdpa kernel takes grouped heads with a mask (enable_gqa) without repeating keys/values itself: the
# CPU's flash kernel does; CUDA's kernels with a mask fall back to the math one, which repeats them
NATIVE_GQA = {"cpu"}

# the last mask made for sdpa: (a weak reference to the model's mask, (n_rep, dtype), sdpa's mask), dropped with
# the model's mask
_last_mask: tuple[weakref.ref, tuple[int, torch.dtype], torch.Tensor] | None = None


def fold_mask(mask: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[b, 1 or h, q, k] mask -> [b, 1 or h, n_rep * q, k]: query row i of folded head-copy r is row i of the mask."""
    b, h, q, k = mask.shape
    return mask[:, :, None].expand(b, h, n_rep, q, k).reshape(b, h, n_rep * q, k)


# CUDA's memory-efficient kernel reads a mask whose rows start a multiple of 16 elements apart; any other mask it
# copies (padded) in every layer and keeps each copy for the backward: 4 layers x 31.6 MiB beside the one shared mask
# at 8 rows x 505 positions x 4 folded heads (H200, bench/cuda_memory_trace.py). Made with padded rows, it is read
# as it is.
ALIGN = 16


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    k = mask.shape[-1]
    pad = 0 if mask.device.type in NATIVE_GQA else -k % ALIGN
    if mask.dtype != torch.bool and not pad:
        return mask.to(dtype)
    out = torch.zeros((*mask.shape[:-1], k + pad), dtype=dtype, device=mask.device)[..., :k]
    return out.copy_(mask) if mask.dtype != torch.bool else out.masked_fill_(~mask, float("-inf"))


def _forget(ref: weakref.ref) -> None:
    global _last_mask
    if _last_mask is not None and _last_mask[0] is ref:
        _last_mask = None


def sdpa_mask_for(mask: torch.Tensor, n_rep: int, dtype: torch.dtype) -> torch.Tensor:
    """The mask as sdpa gets it: additive in the query's dtype (0 / -inf, what sdpa turns a boolean mask into, or
    it converts one in every layer and saves each layer's copy for the backward), folded for `n_rep` > 1; made
    once per forward (every layer receives the same mask tensor)."""
    global _last_mask
    if torch.compiler.is_compiling():
        return _additive(fold_mask(mask, n_rep) if n_rep > 1 else mask, dtype)  # no Python-side cache in a graph
    if _last_mask is not None and _last_mask[0]() is mask and _last_mask[1] == (n_rep, dtype):
        return _last_mask[2]
    out = _additive(fold_mask(mask, n_rep) if n_rep > 1 else mask, dtype)
    _last_mask = (weakref.ref(mask, _forget), (n_rep, dtype), out)
    return out


# the causal mask of the forward in flight: (a weak reference to its position ids, (q, device), the mask)
_last_causal: tuple[weakref.ref, tuple, torch.Tensor] | None = None


def _forget_causal(ref: weakref.ref) -> None:
    global _last_causal
    if _last_causal is not None and _last_causal[0] is ref:
        _last_causal = None


def causal_mask(q: int, device: torch.device, position_ids: torch.Tensor | None) -> torch.Tensor:
    """[1, 1, q, q] boolean: query i sees keys 0..i (sdpa's is_causal), made once per forward (the layers share the
    forward's position ids) so that the folded mask made from it is shared too."""
    global _last_causal
    key = (q, device)
    if _last_causal is not None and position_ids is not None and _last_causal[0]() is position_ids \
            and _last_causal[1] == key:
        return _last_causal[2]
    mask = torch.ones(q, q, dtype=torch.bool, device=device).tril()[None, None]
    if position_ids is not None and not torch.compiler.is_compiling():
        _last_causal = (weakref.ref(position_ids, _forget_causal), key, mask)
    return mask


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [b, h, q, d], key/value [b, kv, k, d], mask [b, 1, q, k] (bool or additive) -> ([b, q, h, d], None),
    as transformers' sdpa_attention_forward returns it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = getattr(module, "num_key_value_groups", 1)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (attention_mask is None and causal and query.dtype == torch.float32 and query.shape[2] > 1 and n_rep > 1
            and query.device.type not in NATIVE_GQA and key.shape[1] * n_rep == query.shape[1]
            and kwargs.get("position_bias") is None and kwargs.get("cache") is None
            and not kwargs.get("output_attentions", False)):
        q = query.shape[2]  # keys past the queries' length are cut, as transformers' sdpa does (an empty static cache)
        key, value = key[:, :, :q], value[:, :, :q]
        attention_mask = causal_mask(q, query.device, kwargs.get("position_ids"))
    plain = (n_rep == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
             or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
             or kwargs.get("output_attentions", False) or key.shape[1] * n_rep != query.shape[1])
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if query.device.type in NATIVE_GQA:  # the kernel reads each key/value head for its query heads itself
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=sdpa_mask_for(attention_mask, 1, query.dtype), dropout_p=dropout,
            scale=scaling, is_causal=False, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    b, h, q, d = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, key.shape[1], n_rep * q, d), key, value, attn_mask=sdpa_mask_for(attention_mask, n_rep, query.dtype),
        dropout_p=dropout, scale=scaling, is_causal=False,
    )  # [b, kv, n_rep * q, dv]
    return out.reshape(b, h, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make `sdpa_grouped` a name transformers accepts (attention function and its mask builder, sdpa's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def grouped_heads(config: Any) -> bool:
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv and heads > kv)


def use_grouped_sdpa(model: Any) -> bool:
    """Switch a model that runs transformers' `sdpa` with grouped query heads to `sdpa_grouped` (same attention,
    no repeated keys/values); -> whether it did. Other implementations, and models without grouped heads, stay."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or not grouped_heads(config):
        return False
    register()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
