"""DAPO dynamic sampling (arXiv:2503.14476, sec. 3.2): a group whose G rewards are all equal has zero
advantages and teaches nothing. Such groups are dropped and whole new generation batches are sampled until
B groups with signal are collected, or `max_rounds` batches were sampled; then the batch is completed with
dropped groups, earliest first (zero advantages: no policy gradient), and `frac_reward_zero_std` says how many.

Every process sees every round's rewards, so the choice of groups is the same everywhere; the chosen rows
are then split over processes as any generation batch is. Each round takes B prompts from the data
stream, so the stream's position counts every prompt consumed and a resume continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from grpo_cli.algo.advantages import group_std
from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout, group_rows

ZERO_STD = 1e-6  # as frac_reward_zero_std counts it


@dataclass
class Round:
    """One generation batch: B prompts and all their B*G rows (every process's), scored."""

    batch: PromptBatch
    rollout: Rollout  # [N] rows, on the CPU
    rewards: RewardResult  # [N] rows; error counts are this process's own scoring calls
    total: torch.Tensor  # [N] weighted rewards


def groups_with_signal(total: torch.Tensor, group_size: int) -> list[bool]:
    """[N] rewards -> [B] whether a group's rewards differ (NaN left out, as in the advantages)."""
    return (group_std(total, group_size) > ZERO_STD).tolist()


def pick_groups(signal: list[list[bool]], batch_size: int) -> list[tuple[int, int]]:
    """Per round, which of its groups have signal -> the `batch_size` (round, group) pairs to train on: groups
    with signal in the order they were generated, then, if there are too few, groups without, earliest first."""
    pairs = [(r, g) for r, flags in enumerate(signal) for g in range(len(flags))]
    good = [(r, g) for r, g in pairs if signal[r][g]]
    rest = [(r, g) for r, g in pairs if not signal[r][g]]
    return (good + rest)[:batch_size]


def assemble(rounds: list[Round], picks: list[tuple[int, int]], group_size: int, pad_id: int) -> Round:
    """The picked (round, group) pairs as one generation batch, in pick order (rows of a group contiguous).
    The error counts are those of every round: they count scoring calls, kept or not."""
    rows = [list(group_rows(g, group_size)) for _, g in picks]
    rollout = Rollout.cat([rounds[r].rollout.select(x) for (r, _), x in zip(picks, rows)], pad_id)
    scored = RewardResult.cat([rounds[r].rewards.select(x) for (r, _), x in zip(picks, rows)])
    calls = RewardResult.cat([rd.rewards for rd in rounds])
    rewards = replace(scored, errors=calls.errors, timeouts=calls.timeouts, nonfinite=calls.nonfinite)
    total = torch.cat([rounds[r].total[x] for (r, _), x in zip(picks, rows)])
    batch = PromptBatch.cat([rounds[r].batch.select([g]) for r, g in picks])
    return Round(batch=batch, rollout=rollout, rewards=rewards, total=total)


def collect(first: tuple, sample: Callable[[], tuple], *, max_rounds: int, batch_size: int, group_size: int, rows: range,
            pad_id: int, accelerator) -> tuple[PromptBatch, Rollout, RewardResult, torch.Tensor, dict[str, float]]:
    """Rounds of (batch, this process's rollout rows, their rewards, every row's total) — `first`, then more from
    `sample()` — until `batch_size` groups have signal or `max_rounds` were sampled. -> the chosen batch in the
    same form (this process's `rows` of it, on the first rollout's device) and the dynamic_sampling/* metrics."""
    B, G = batch_size, group_size
    device = first[1].completion_ids.device
    rounds = [whole_round(*first, pad_id=pad_id, accelerator=accelerator)]
    signal = [groups_with_signal(rounds[0].total, G)]
    while sum(map(sum, signal)) < B and len(rounds) < max_rounds:
        rounds.append(whole_round(*sample(), pad_id=pad_id, accelerator=accelerator))
        signal.append(groups_with_signal(rounds[-1].total, G))
    picks = pick_groups(signal, B)
    chosen = assemble(rounds, picks, G, pad_id)
    with_signal, picked_with_signal = sum(map(sum, signal)), sum(signal[r][g] for r, g in picks)
    metrics = {
        "dynamic_sampling/rounds": len(rounds),
        "dynamic_sampling/filtered_groups": len(rounds) * B - with_signal - (B - picked_with_signal),
        "dynamic_sampling/surplus_groups": with_signal - picked_with_signal,
        "dynamic_sampling/generated_reward_mean": torch.cat([rd.total for rd in rounds]).nanmean().item(),
    }
    local = list(rows)
    return chosen.batch, chosen.rollout.select(local).to(device), chosen.rewards.select(local), chosen.total, metrics


def whole_round(batch: PromptBatch, rollout: Rollout, rewards: RewardResult, total: torch.Tensor, *, pad_id: int,
                accelerator) -> Round:
    """A round with every process's rows (each process scored only its own; its error counts stay its own)."""
    rollout = rollout.to("cpu")
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        parts = gather_object([(rollout, rewards)])  # in process order: the rows' order
        rollout = Rollout.cat([p[0] for p in parts], pad_id)
        rewards = replace(RewardResult.cat([p[1] for p in parts]), errors=rewards.errors, timeouts=rewards.timeouts,
                          nonfinite=rewards.nonfinite)
    return Round(batch=batch, rollout=rollout, rewards=rewards, total=total.cpu())
