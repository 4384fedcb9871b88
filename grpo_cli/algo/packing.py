"""Sequence packing (train.packing): a micro-batch's rows laid end to end, positions restarting at each row, and
attention that never crosses from one row into another.

The padded layout runs every row at the micro-batch's longest prompt plus its longest completion: a group of short
answers beside one long one computes mostly padding. Packed, each row's real tokens (its prompt without the left
padding, its completion up to the mask's end) are placed into bins:
- first fit by decreasing length, each bin as long as the longest row, where attention is a dense mask (sdpa, eager):
  a bin's attention costs at most what one padded row's does;
- all in one bin where the attention kernel reads variable-length sequences (flash attention's varlen, flex
  attention's block masks): no padding at all.
Positions restart at 0 with each row. transformers reads the restarts (attention mask None:
`masking_utils.find_packed_sequence_indices`, and flash attention's cu_seqlens) and keeps each query inside its
row, so every real token sees what it sees in the padded layout: the same keys at the same positions. A bin's tail is
padding at position 0, each such token a sequence of its own; its output is dropped. Only the positions that predict
a completion token reach the LM head (`at`), and the results go back to the [rows, T] layout (`to`), 0 elsewhere.

That holds for models whose attention masks transformers builds from the positions (`PACKED_MODELS`, each checked
against its padded layout by tests/algo/test_packing.py); ALiBi models (BLOOM, MPT) bias attention by distance
instead and are not among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# attention implementations that read packed rows as variable-length sequences: one bin, no padding
VARLEN = ("flash", "flex")

# model types whose packed log-probs and gradients equal their padded ones (tests/algo/test_packing.py builds each)
PACKED_MODELS = frozenset({
    "cohere", "exaone4", "gemma", "gemma2", "gemma3_text", "glm4", "gpt2", "gpt_neox", "granite", "llama", "ministral",
    "mistral", "mixtral", "olmo", "olmo2", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3",
    "stablelm", "starcoder2",
})


@dataclass
class Packed:
    input_ids: torch.Tensor  # [bins, L]
    position_ids: torch.Tensor  # [bins, L]: 0, 1, ... from each row's first token; 0 on a bin's padded tail
    at: tuple[torch.Tensor, torch.Tensor]  # (bin, position) [K] whose output predicts each completion token
    to: tuple[torch.Tensor, torch.Tensor]  # (row, t) [K]: where that token sits in the [rows, T] layout
    targets: torch.Tensor  # [K] the completion tokens
    shape: tuple[int, int]  # (rows, T) of the padded layout

    def unpacked(self, values: torch.Tensor) -> torch.Tensor:
        """[K, ...] per completion token -> [rows, T, ...], 0 where the padded layout has no token (differentiable)."""
        out = values.new_zeros((*self.shape, *values.shape[1:]))
        return out.index_put(self.to, values)


def first_fit(lengths: list[int], capacity: int) -> list[tuple[int, int]]:
    """Rows of these lengths -> (bin, offset) each: first fit, longest rows first (ties in row order)."""
    room: list[int] = []
    where = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                where[i], room[b] = (b, capacity - free), free - lengths[i]
                break
        else:
            where[i] = (len(room), 0)
            room.append(capacity - lengths[i])
    return where


def pack(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
         completion_mask: torch.Tensor, *, one_bin: bool = False, pad_id: int = 0) -> Packed | None:
    """Left-padded prompts [b, P] and right-padded completions [b, T] (masks 0/1) -> the packed layout, or None
    where it cannot stand for the padded one: no completion token at all, or a row whose first completion token
    nothing precedes (an empty prompt)."""
    device = prompt_ids.device
    tokens = torch.cat([prompt_ids, completion_ids], dim=1)
    real = torch.cat([prompt_mask, completion_mask], dim=1).bool()
    prompt_len, lengths = prompt_mask.sum(1), real.sum(1)
    kept = completion_mask.bool()
    if not kept.any() or bool(((prompt_len == 0) & kept.any(1)).any()):
        return None
    lens = lengths.tolist()
    capacity = sum(lens) if one_bin else max(lens)
    where = torch.tensor(first_fit(lens, capacity), dtype=torch.long, device=device)  # [b, 2]
    bins = int(where[:, 0].max()) + 1
    # every real token: its row, its index k in the row's real tokens (= its position), its place in the bins
    row = torch.repeat_interleave(torch.arange(len(lens), device=device), lengths)
    k = torch.arange(len(row), device=device) - torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    input_ids = torch.full((bins, capacity), pad_id, dtype=tokens.dtype, device=device)
    position_ids = torch.zeros((bins, capacity), dtype=torch.long, device=device)
    input_ids[where[row, 0], where[row, 1] + k] = tokens[real]
    position_ids[where[row, 0], where[row, 1] + k] = k
    # completion token (r, t) is real token prompt_len + (its rank among the row's completion tokens); the one before
    # it predicts it
    r, t = kept.nonzero(as_tuple=True)
    index = prompt_len[r] + completion_mask.cumsum(1)[r, t] - 1
    at = (where[r, 0], where[r, 1] + index - 1)
    return Packed(input_ids, position_ids, at, (r, t), completion_ids[r, t], tuple(completion_ids.shape))


def one_bin_for(model) -> bool:
    """Whether the model's attention reads packed rows as variable-length sequences (all rows in one bin)."""
    config = getattr(model, "config", None)
    name = str(getattr(config, "_attn_implementation", None) or "")
    return any(v in name for v in VARLEN)
