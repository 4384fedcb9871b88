"""Group-relative advantages (GRPO, DeepSeekMath arXiv:2402.03300, sec. 4.1.2 "outcome supervision"), and the other
estimators of `algorithm.advantage_estimator` (`ESTIMATORS`; their table is recipe/specs.py): RLOO's leave-one-out
baseline and REINFORCE++-baseline's batch whitening.

A_i = (r_i - mean(group)) / (std + 1e-4), where the std is the group's (`group`, the paper),
the whole batch's (`batch`, as in TRL's scale_rewards="batch"), or 1 (`none`, Dr. GRPO arXiv:2503.20783,
which shows that dividing by the group std biases towards too-easy and too-hard prompts).
With several rewards, `normalize_then_sum` (GDPO arXiv:2601.05242; TRL's multi_objective_aggregation) first
normalises each reward within its group, sums them weighted, and normalises the sums over the whole batch.
Process supervision (sec. 4.1.3), `process_advantages`: each completion gets rewards for its reasoning steps,
each step ending at a completion token; the step rewards R of a group's G completions are normalised together,
r~ = (r - mean(R)) / std(R), and token t's advantage is the sum of r~ over the steps of its completion that end
at or after t.
Rows are B groups of G contiguous completions. A NaN reward means "no reward" (a reward function
returned None): it is left out of the group statistics and its advantage is 0.

A group without signal gets exactly 0: one whose rewards number fewer than two or whose std (taken in float64,
so that equal rewards give exactly 0) is at most ZERO_STD. The float32 formula alone leaks rounding: the float32
mean of eight rewards of 5.7 is not 5.7, and TRL 1.16 gives each of them -0.0047. Every other group gets the
float32 formula as before, TRL's to float32 rounding (bench/vs_trl_loss.py). The same rule counts
frac_reward_zero_std and drives DAPO's dynamic sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_cli.datatypes import StepBatch
from grpo_cli.registry import Registry

EPS = 1e-4
ZERO_STD = 1e-6  # a group whose rewards' std is at most this has no signal

# scale name -> fn(rewards [B, G] with NaN, centered [B, G]) -> denominator broadcastable to [B, G]
ADVANTAGE_SCALES: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("advantage scale")


def _nan_std(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased sample std ignoring NaN (torch.std semantics); 0 where fewer than 2 values."""
    valid = ~torch.isnan(x)
    n = valid.sum(dim=dim, keepdim=True) if dim is not None else valid.sum()
    mean = torch.nanmean(x, dim=dim, keepdim=True) if dim is not None else torch.nanmean(x)
    sq = torch.where(valid, (x - mean) ** 2, torch.zeros_like(x))
    ss = sq.sum(dim=dim, keepdim=True) if dim is not None else sq.sum()
    std = torch.sqrt(ss / (n - 1).clamp(min=1))
    std = torch.where(n >= 2, std, torch.zeros_like(std))
    return std if keepdim or dim is None else std.squeeze(dim)


@ADVANTAGE_SCALES.register("group")
def _scale_group(rewards: torch.Tensor, centered: torch.Tensor) -> torch.Tensor:
    return _nan_std(rewards, dim=1, keepdim=True) + EPS  # [B, 1]


@ADVANTAGE_SCALES.register("batch")
def _scale_batch(rewards: torch.Tensor, centered: torch.Tensor) -> torch.Tensor:
    return _nan_std(rewards) + EPS  # scalar: std of every reward in the batch


@ADVANTAGE_SCALES.register("none")
def _scale_none(rewards: torch.Tensor, centered: torch.Tensor) -> torch.Tensor:
    return torch.ones((), dtype=rewards.dtype, device=rewards.device)


def _signal(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Whether the values along `dim` (NaN left out) differ: at least two, float64 std above ZERO_STD."""
    return _nan_std(x.double(), dim=dim, keepdim=dim is not None) > ZERO_STD


# algorithm.advantage_estimator -> fn(rewards [B, G] with NaN, scale) -> [B, G] advantages (NaN where no reward);
# the names and their rules are recipe/specs.py's table
ESTIMATORS: Registry[Callable[[torch.Tensor, str], torch.Tensor]] = Registry("advantage estimator")


@ESTIMATORS.register("grpo")
def _grpo(r: torch.Tensor, scale: str) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / scale: DeepSeekMath's outcome supervision."""
    centered = r - torch.nanmean(r, dim=1, keepdim=True)  # NaN for an all-NaN group
    return centered / ADVANTAGE_SCALES.get(scale)(r, centered)


@ESTIMATORS.register("rloo")
def _rloo(r: torch.Tensor, scale: str) -> torch.Tensor:
    """A_i = (r_i - mean of the group's other rewards) / scale: RLOO's leave-one-out baseline, over the n rewards
    the group has (NaN left out); r_i - (sum - r_i) / (n - 1) = n / (n - 1) (r_i - mean)."""
    n = (~torch.isnan(r)).sum(dim=1, keepdim=True)
    centered = (r - torch.nanmean(r, dim=1, keepdim=True)) * n / (n - 1).clamp(min=1)
    return centered / ADVANTAGE_SCALES.get(scale)(r, centered)


@ESTIMATORS.register("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline(r: torch.Tensor, scale: str) -> torch.Tensor:
    """c_i = r_i - mean(group), then whitened over the batch: (c - mean(c)) / (std(c) + EPS), REINFORCE++-baseline
    (its own normalisation: the schema holds scale_rewards at batch)."""
    centered = r - torch.nanmean(r, dim=1, keepdim=True)
    return (centered - torch.nanmean(centered)) / (_nan_std(centered) + EPS)


def compute_advantages(rewards: torch.Tensor, group_size: int, scale: str, estimator: str = "grpo") -> torch.Tensor:
    """[N] rewards (NaN = missing), groups of `group_size` contiguous rows -> [N] advantages; a group without signal
    (or a row without a reward) gets exactly 0, whatever the estimator."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be [B*G] with G={group_size}, got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)  # [B, G]
    adv = ESTIMATORS.get(estimator)(r, scale)
    adv = torch.where(torch.isnan(adv) | ~_signal(r, dim=1), torch.zeros_like(adv), adv)
    return adv.view(-1)


def group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] -> [B] unbiased std of each group's rewards (NaN ignored, float64: equal rewards give 0); reward_std."""
    return _nan_std(rewards.double().view(-1, group_size), dim=1).float()


def groups_with_signal(rewards: torch.Tensor, group_size: int) -> list[bool]:
    """[N] rewards -> [B] whether a group's rewards give it non-zero advantages (see the module's docstring)."""
    return _signal(rewards.view(-1, group_size), dim=1).view(-1).tolist()


def normalize_then_sum(per_function: torch.Tensor, weights: list[float], group_size: int) -> torch.Tensor:
    """[N, K] rewards of K functions (NaN = missing) -> [N] advantages, as TRL's normalize_then_sum:
    r_k = (r_k - mean_group(r_k)) / (std_group(r_k) + eps); s = sum_k w_k r_k over the functions that gave one;
    A = (s - mean_batch(s)) / (std_batch(s) + eps). A row no function scored gets 0."""
    n, k = per_function.shape
    if n % group_size or k != len(weights):
        raise ValueError(f"per-function rewards must be [B*G, K] with G={group_size}, K={len(weights)}, got {(n, k)}")
    r = per_function.float().view(-1, group_size, k)  # [B, G, K]
    normalized = (r - torch.nanmean(r, dim=1, keepdim=True)) / (_nan_std(r, dim=1, keepdim=True) + EPS)
    normalized = torch.where(_signal(r, dim=1) | torch.isnan(r), normalized, torch.zeros_like(normalized))
    w = torch.tensor(weights, dtype=torch.float32, device=r.device)
    summed = (normalized.view(n, k) * w).nansum(dim=1)
    summed = torch.where(torch.isnan(per_function).all(dim=1), torch.full_like(summed, math.nan), summed)
    adv = (summed - torch.nanmean(summed)) / (_nan_std(summed) + EPS)
    return torch.where(torch.isnan(adv) | ~_signal(summed), torch.zeros_like(adv), adv)


def process_advantages(steps: list[list[tuple[int, float | None]]], group_size: int, length: int) -> torch.Tensor:
    """Per completion, its steps as (index of the step's last token in the completion, reward or None) -> [N, T]
    per-token advantages (T = `length`), DeepSeekMath sec. 4.1.3.

    Steps with a None reward are left out. Every other step counts in its group's statistics; a step's advantage is
    placed at its last token if that lies within the T columns (a process holding some rows of a group passes all
    of the group's steps and its own width). The std is the unbiased one of the group's step rewards, + EPS (as
    for outcome rewards). The statistics are float64 (no TRL reference to match: TRL has no process supervision),
    and a group without signal (`step_signal`) gets exactly 0 everywhere."""
    if len(steps) % group_size:
        raise ValueError(f"{len(steps)} completions do not form groups of {group_size}")
    adv = torch.zeros(len(steps), length, dtype=torch.float64)
    for g, signal in zip(range(0, len(steps), group_size), step_signal(steps, group_size)):
        if not signal:
            continue
        rows = range(g, g + group_size)
        rewards = _step_rewards(steps[g : g + group_size])
        mean, std = rewards.mean(), _nan_std(rewards)
        for i in rows:
            per_token = adv[i]  # a view: the step's normalised reward goes at its last token
            for t, r in steps[i]:
                if r is not None and 0 <= t < length:
                    per_token[t] += (r - mean) / (std + EPS)
            adv[i] = per_token.flip(0).cumsum(0).flip(0)  # suffix sums: steps ending at or after t
    return adv.float()


def _step_rewards(rows: list[list[tuple[int, float | None]]]) -> torch.Tensor:
    return torch.tensor([r for row in rows for _, r in row if r is not None], dtype=torch.float64)


def step_signal(steps: list[list[tuple[int, float | None]]], group_size: int) -> list[bool]:
    """Per group, whether its step rewards give it signal (at least two, float64 std above ZERO_STD): without,
    process_advantages gives the whole group 0 (e.g. completions that take no step, or all steps right)."""
    return [bool(_signal(_step_rewards(steps[g : g + group_size]))) for g in range(0, len(steps), group_size)]


# algorithm.multi_objective_aggregation -> fn(total [N], per_function [N, K], weights [K], group_size, scale,
# estimator) -> [N]: how several rewards reach the estimator
AGGREGATIONS: Registry[Callable[..., torch.Tensor]] = Registry("multi_objective_aggregation")


@AGGREGATIONS.register("sum_then_normalize")
def sum_then_normalize(total: torch.Tensor, per_function: torch.Tensor, weights: list[float], group_size: int,
                       scale: str, estimator: str = "grpo") -> torch.Tensor:
    """The weighted sum of the rewards, through the estimator (`scale`): DeepSeekMath's outcome supervision."""
    return compute_advantages(total, group_size, scale, estimator)


@AGGREGATIONS.register("normalize_then_sum")
def _normalize_then_sum(total: torch.Tensor, per_function: torch.Tensor, weights: list[float], group_size: int,
                        scale: str, estimator: str = "grpo") -> torch.Tensor:
    return normalize_then_sum(per_function, weights, group_size)  # GDPO's own (the schema: estimator grpo)


@dataclass
class Advantages:
    """A step's advantages: what the update trains with and what is logged."""

    local: torch.Tensor  # [n] per completion, or [n, T] with step rewards: this process's rows
    outcome: torch.Tensor  # [N] every row's outcome advantage
    signal: torch.Tensor  # [B] bool: whether a group's advantages, outcome or step, are anywhere non-zero
    stats: dict[str, float]  # per step reward: steps_per_completion, frac_zero_std

    def per_completion(self, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows, `sampled` [n, T] their sampled tokens -> [n] each completion's advantage as
        trained (with step rewards: the mean of A_t over its sampled tokens) and [n] its mean |A_t|."""
        if self.local.dim() == 1:
            return self.local, self.local.abs()
        m = sampled.to(self.local.device, self.local.dtype)
        n = m.sum(1).clamp(min=1)
        return (self.local * m).sum(1) / n, (self.local.abs() * m).sum(1) / n


def step_advantages(s: StepBatch, group_size: int, scale: str, aggregation: str, estimator: str = "grpo") -> Advantages:
    """The outcome advantages of the step's rewards (`estimator`, with several rewards combined as `aggregation`
    says) plus, with step-level rewards, each one's sec. 4.1.3 per-token advantages times its weight, for this
    process's rows (a group's steps come from every process: they are normalised together)."""
    outcome = AGGREGATIONS.get(aggregation)(s.total, s.per_function, s.weights, group_size, scale, estimator)  # [N]
    local = outcome[s.rows.start : s.rows.stop]
    signal = outcome.view(-1, group_size).ne(0).any(dim=1)  # [B]
    stats: dict[str, float] = {}
    if s.steps:
        weight = dict(zip(s.rewards.per_function, s.weights))
        length = s.rollout.completion_ids.shape[1]
        per_token = torch.zeros(len(s.rows), length)
        for name, steps in s.steps.items():
            every = [x or [] for x in steps]
            per_token += weight[name] * process_advantages(every, group_size, length)[s.rows.start : s.rows.stop]
            flags = step_signal(every, group_size)
            signal |= torch.tensor(flags)
            stats[f"rewards/{name}/steps_per_completion"] = sum(map(len, every)) / len(every)
            stats[f"rewards/{name}/frac_zero_std"] = 1 - sum(flags) / len(flags)
        local = local[:, None] + per_token
    return Advantages(local, outcome, signal, stats)
