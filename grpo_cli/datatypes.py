"""Dataclasses that cross module boundaries. Shapes in comments: N = B*G rows, T = completion length."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch


@dataclass
class PromptBatch:
    """B prompts drawn from the data stream, rendered and tokenized."""

    texts: list[str]  # [B] prompt text after template and chat template
    input_ids: list[list[int]]  # [B] prompt token ids, left-truncated to data.max_prompt_length
    columns: dict[str, list[Any]]  # dataset columns, each [B] (the answer is under `answer`)
    indices: list[int]  # [B] dataset row of each prompt

    def __len__(self) -> int:
        return len(self.texts)


def completion_lists(completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> list[list[int]]:
    """[N, T] padded ids and 0/1 mask -> N lists of the active ids."""
    return [row[m.bool()].tolist() for row, m in zip(completion_ids, completion_mask)]


@dataclass
class Rollout:
    """Completions for a batch of prompts, each prompt repeated G times in contiguous rows."""

    prompt_ids: torch.Tensor  # [N, P] int64, left-padded
    prompt_mask: torch.Tensor  # [N, P] int64
    completion_ids: torch.Tensor  # [N, T] int64, right-padded
    completion_mask: torch.Tensor  # [N, T] int64, 1 up to and including the first EOS
    truncated: torch.Tensor  # [N] bool, no EOS within max_completion_length
    prompts: list[str]  # [N]
    completions: list[str]  # [N] decoded, special tokens skipped
    sampling_logps: torch.Tensor | None = None  # [N, T] log-probs reported by the sampler, if any

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def completion_lists(self) -> list[list[int]]:
        """[N] unpadded completion token ids (up to and including the first EOS)."""
        return completion_lists(self.completion_ids, self.completion_mask)

    def to(self, device) -> Rollout:
        """The tensors on `device` (vLLM returns CPU tensors; the trainer may be on a GPU)."""
        move = {k: getattr(self, k).to(device) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")}
        logps = self.sampling_logps.to(device) if self.sampling_logps is not None else None
        return replace(self, **move, sampling_logps=logps)


@dataclass
class RewardResult:
    """Scores of N completions: the weighted total and each function's own column."""

    total: list[float]  # [N] weighted sum over functions that returned a value; NaN when none did
    per_function: dict[str, list[float | None]]  # name -> [N]; None = no reward for that row
    errors: dict[str, int] = field(default_factory=dict)  # name -> exceptions turned into None (on_error: skip)
    timeouts: dict[str, int] = field(default_factory=dict)  # name -> calls killed at timeout_s
    nonfinite: dict[str, int] = field(default_factory=dict)  # name -> NaN/inf values turned into None (on_error: skip)
