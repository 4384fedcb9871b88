"""What crosses module boundaries: prompts, rollouts, rewards, a step's batch, and the processes' collectives.
Shapes in comments: B prompts, G completions each, N = B*G rows (n of them this process's), T = completion length."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch


def group_of(row: int, group_size: int) -> int:
    """The prompt (group) of completion row `row`: a group's G rows are contiguous."""
    return row // group_size


def group_rows(group: int, group_size: int) -> range:
    """The completion rows of prompt (group) `group`."""
    return range(group * group_size, (group + 1) * group_size)


@dataclass
class PromptBatch:
    """B prompts drawn from the data stream, rendered and tokenized."""

    texts: list[str]  # [B] prompt text after template and chat template
    input_ids: list[list[int]]  # [B] prompt token ids, left-truncated to data.max_prompt_length
    columns: dict[str, list[Any]]  # dataset columns, each [B] (the answer is under `answer`)
    indices: list[int]  # [B] dataset row of each prompt

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, picks: list[int]) -> PromptBatch:
        """The prompts at positions `picks`, in that order."""
        return PromptBatch(texts=[self.texts[i] for i in picks], input_ids=[self.input_ids[i] for i in picks],
                           columns={k: [v[i] for i in picks] for k, v in self.columns.items()},
                           indices=[self.indices[i] for i in picks])

    def per_row(self, rows: range | list[int], group_size: int) -> PromptBatch:
        """One entry per completion row in `rows` (each row's prompt, columns and data index)."""
        return self.select([group_of(i, group_size) for i in rows])

    @staticmethod
    def cat(batches: list[PromptBatch]) -> PromptBatch:
        return PromptBatch(texts=[t for b in batches for t in b.texts], input_ids=[x for b in batches for x in b.input_ids],
                           columns={k: [v for b in batches for v in b.columns[k]] for k in batches[0].columns},
                           indices=[i for b in batches for i in b.indices])


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
    weight_step: int | None = None  # asynchronous rollouts: the trainer step whose weights sampled them
    # multi-turn episodes: 1 where a completion token is an observation (environment or tool text), 0 where the
    # policy sampled it; observations are attended to (completion_mask) but never trained on (trained_mask)
    observation_mask: torch.Tensor | None = None  # [N, T] int64
    turns: list[list[dict]] | None = None  # [N] each episode's turns: {role, text, tokens}
    # episodes split where the chat template changes the history (rollout.history_change: split): per row, each
    # later training sample's [start, context ids]; its tokens are the row's completion from `start` to the next
    # sample's, sampled in `context` (the template's rendering of the conversation, as a deployed model sees it)
    segments: list[list[list]] | None = None  # [N]

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def completion_lists(self) -> list[list[int]]:
        """[N] unpadded completion token ids (up to and including the first EOS)."""
        return completion_lists(self.completion_ids, self.completion_mask)

    def trained_mask(self) -> torch.Tensor:
        """[N, T] 1 where the policy sampled the token: the tokens of the loss, KL, entropy and lengths."""
        if self.observation_mask is None:
            return self.completion_mask
        return self.completion_mask * (1 - self.observation_mask)

    def select(self, rows: list[int]) -> Rollout:
        """The rows `rows`, in that order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.completion_ids.device)
        pick = {k: getattr(self, k)[index] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")}
        logps = self.sampling_logps[index] if self.sampling_logps is not None else None
        observed = self.observation_mask[index] if self.observation_mask is not None else None
        return replace(self, **pick, prompts=[self.prompts[i] for i in rows], completions=[self.completions[i] for i in rows],
                       sampling_logps=logps, observation_mask=observed,
                       turns=[self.turns[i] for i in rows] if self.turns is not None else None,
                       segments=[self.segments[i] for i in rows] if self.segments is not None else None)

    @staticmethod
    def cat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Rows of several rollouts, re-padded to the longest prompt (left) and completion (right)."""
        P = max(r.prompt_ids.shape[1] for r in parts)
        T = max(r.completion_ids.shape[1] for r in parts)

        def left(x, width, value):
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x, width, value):
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        with_logps = [r.sampling_logps is not None for r in parts]
        if any(with_logps) and not all(with_logps):
            raise ValueError("cannot join rollouts with and without sampler log-probs")
        episodes = [r.observation_mask is not None for r in parts]
        if any(episodes) and not all(episodes):
            raise ValueError("cannot join multi-turn episodes with single completions")
        return Rollout(
            prompt_ids=torch.cat([left(r.prompt_ids, P, pad_id) for r in parts]),
            prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
            completion_ids=torch.cat([right(r.completion_ids, T, pad_id) for r in parts]),
            completion_mask=torch.cat([right(r.completion_mask, T, 0) for r in parts]),
            truncated=torch.cat([r.truncated for r in parts]),
            prompts=[x for r in parts for x in r.prompts], completions=[x for r in parts for x in r.completions],
            sampling_logps=torch.cat([right(r.sampling_logps, T, 0.0) for r in parts]) if all(with_logps) else None,
            weight_step=parts[0].weight_step if len({r.weight_step for r in parts}) == 1 else None,
            observation_mask=torch.cat([right(r.observation_mask, T, 0) for r in parts]) if all(episodes) else None,
            turns=[t for r in parts for t in r.turns] if all(episodes) else None,
            segments=([x for r in parts for x in (r.segments or [[] for _ in range(len(r))])]
                      if any(r.segments is not None for r in parts) else None),
        )

    def to(self, device) -> Rollout:
        """The tensors on `device` (vLLM returns CPU tensors; the trainer may be on a GPU)."""
        move = {k: getattr(self, k).to(device) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")}
        logps = self.sampling_logps.to(device) if self.sampling_logps is not None else None
        observed = self.observation_mask.to(device) if self.observation_mask is not None else None
        return replace(self, **move, sampling_logps=logps, observation_mask=observed)


@dataclass
class RewardResult:
    """Scores of N completions: the weighted total and each function's own column."""

    total: list[float]  # [N] weighted sum over functions that returned a value; NaN when none did
    per_function: dict[str, list[float | None]]  # name -> [N]; None = no reward for that row
    errors: dict[str, int] = field(default_factory=dict)  # name -> exceptions turned into None (on_error: skip)
    timeouts: dict[str, int] = field(default_factory=dict)  # name -> calls killed at timeout_s
    nonfinite: dict[str, int] = field(default_factory=dict)  # name -> NaN/inf values turned into None (on_error: skip)
    failed: dict[str, int] = field(default_factory=dict)  # name -> rows it could not score (a judge's), None (skip)
    # step-level rewards (process supervision): name -> [N] each completion's (token_index, reward) steps, or None
    steps: dict[str, list[list[tuple[int, float | None]] | None]] = field(default_factory=dict)

    def select(self, rows: list[int]) -> RewardResult:
        """The rows `rows`; the error counts stay (they count scoring calls, not rows)."""
        return replace(self, total=[self.total[i] for i in rows],
                       per_function={k: [v[i] for i in rows] for k, v in self.per_function.items()},
                       steps={k: [v[i] for i in rows] for k, v in self.steps.items()})

    @staticmethod
    def cat(parts: list[RewardResult]) -> RewardResult:
        """Rows of several results; counts summed."""
        def counts(kind: str) -> dict[str, int]:
            out: dict[str, int] = {}
            for r in parts:
                for k, v in getattr(r, kind).items():
                    out[k] = out.get(k, 0) + v
            return out

        return RewardResult(total=[x for r in parts for x in r.total],
                            per_function={k: [x for r in parts for x in r.per_function[k]] for k in parts[0].per_function},
                            errors=counts("errors"), timeouts=counts("timeouts"), nonfinite=counts("nonfinite"),
                            failed=counts("failed"),
                            steps={k: [x for r in parts for x in r.steps[k]] for k in parts[0].steps})


@dataclass
class StepBatch:
    """One step's generation batch, sampled and scored: what Algorithm 1's update consumes.

    `rollout` and `rewards` are this process's rows of the N = B*G completions; the reward tensors and the
    step rewards are every process's rows (a group is normalised over all its G completions)."""

    prompts: PromptBatch  # [B] the step's prompts (every process's)
    rollout: Rollout  # [n] this process's rows, on the trainer's device
    rewards: RewardResult  # [n] this process's rows
    rows: range  # which of the N rows they are
    total: torch.Tensor  # [N] float32 weighted rewards (NaN: no reward function returned a value)
    per_function: torch.Tensor  # [N, K] float32 each reward function's column (NaN: none)
    weights: list[float]  # [K] each reward function's weight
    steps: dict[str, list[list[tuple[int, float | None]]]]  # name -> [N] step rewards (process supervision)
    metrics: dict[str, float] = field(default_factory=dict)  # what sampling measured (rounds, staleness, episodes)


class Processes(Protocol):
    """The trainer's processes as the parts of a step see them (grpo_cli/trainer/distributed.py's `Collectives`)."""

    count: int  # how many
    index: int  # this one's
    is_main: bool

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every process's `x`, concatenated in process order, on the CPU."""

    def gather_rows(self, rows: list[Any]) -> list[Any]:
        """Every process's list, concatenated in process order (picklable objects)."""

    def gather_ragged(self, x: torch.Tensor) -> torch.Tensor:
        """Every process's 1-D `x`, whatever its length, concatenated in process order, on the CPU."""

    def total(self, x: float) -> float:
        """The sum of `x` over processes."""

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any process."""

    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `x` over processes, on the CPU."""
