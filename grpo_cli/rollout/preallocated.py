"""A key/value cache made once per `generate` at its full length, for eager decoding on the hf backend.

transformers' dynamic cache grows by concatenation: every decode step copies each layer's whole cache into a new
tensor one position longer, so 32 steps of 16 rows copy the cache 32 times (SmolLM2 on 2 CPU cores: 0.16-0.22 s of a
2.7 s generate, `aten::cat`). A `PreallocatedLayer` holds each layer's keys and values in buffers as long as the
prompt plus the completion budget and writes each step's new position in place; attention reads a view of the
positions written so far, so it attends over exactly the keys the dynamic cache would give it (unlike the static
cache, which attends over all its positions under a mask) and samples the same tokens.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers of `capacity` positions; `keys`/`values` are views of the written ones.
    Writing past the capacity grows the buffers (to twice the size): a wrong capacity costs a copy, never an error."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.key_buffer = self.value_buffer = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_buffer = key_states.new_empty(*key_states.shape[:-2], self.capacity, key_states.shape[-1])
        self.value_buffer = value_states.new_empty(*value_states.shape[:-2], self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self.key_buffer[..., : self.length, :], self.value_buffer[..., : self.length, :]

    def _resize(self, capacity: int) -> None:
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:-2], capacity, old.shape[-1])
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._resize(max(end, 2 * self.capacity))
        self.key_buffer[..., self.length : end, :] = key_states
        self.value_buffer[..., self.length : end, :] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def written(self, positions: int) -> None:
        """`positions` more were written into the buffers in place (models/decode_layer.py's decode step)."""
        self.length += positions
        self._views()

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:  # transformers' legacy form: the length to keep
            tokens_to_remove = max(self.length - tokens_to_remove, 0)
        self.length -= min(abs(tokens_to_remove), self.length)
        self._views()

    def _rows(self, select) -> None:
        if self.is_initialized:
            self.key_buffer, self.value_buffer = select(self.key_buffer), select(self.value_buffer)
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rows(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def offload(self) -> None:  # a few MiB per layer: nothing to gain from moving them
        pass

    def prefetch(self) -> None:
        pass


def preallocated(cache: DynamicCache | None, model, capacity: int):
    """The cache `generate` should decode into, as long as `capacity` positions: `cache` (a prompt's cache from
    rollout/hf.py's shared prefill) with its plain dynamic layers moved into preallocated ones, or, without one, the
    DynamicCache transformers would make for `model`, of preallocated layers. Layers of another kind (sliding windows,
    linear attention) stay as they are, as does a prompt cache of another class; a model for which transformers makes
    no DynamicCache (its own cache class, or a cache_implementation in its generation config) gets None: generate
    makes its own."""
    if cache is None:
        if getattr(model.generation_config, "cache_implementation", None) or "mamba" in type(model).__name__.lower() \
                or not getattr(model, "_supports_default_dynamic_cache", lambda: True)():
            return None
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))  # what generate would make
    if type(cache) is not DynamicCache:
        return cache
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            continue
        fresh = PreallocatedLayer(capacity)
        if layer.is_initialized and layer.keys.numel():
            fresh.update(layer.keys, layer.values)
        cache.layers[i] = fresh
    return cache
