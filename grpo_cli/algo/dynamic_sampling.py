"""DAPO dynamic sampling (arXiv:2503.14476, sec. 3.2): a group whose G rewards are all equal has zero
advantages and teaches nothing (algo/advantages.groups_with_signal tells which). Such groups are dropped and
whole new generation batches are sampled until B groups with signal are collected, or `max_rounds` batches
were sampled; then the batch is completed with dropped groups, earliest first (zero advantages: no policy
gradient), and `frac_reward_zero_std` says how many.

Every process sees every round's rewards, so the choice of groups is the same everywhere; the chosen rows
are then split over processes as any generation batch is (the rounds are sampled by grpo_cli/rollout/dynamic.py).
Each round takes B prompts from the data stream, so the stream's position counts every prompt consumed and a resume
continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout, group_rows


@dataclass
class Round:
    """One generation batch: B prompts and all their B*G rows (every process's), scored."""

    batch: PromptBatch
    rollout: Rollout  # [N] rows, on the CPU
    rewards: RewardResult  # [N] rows; error counts are this process's own scoring calls
    total: torch.Tensor  # [N] weighted rewards


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
    rewards = replace(scored, errors=calls.errors, timeouts=calls.timeouts, nonfinite=calls.nonfinite,
                      failed=calls.failed)
    total = torch.cat([rounds[r].total[x] for (r, _), x in zip(picks, rows)])
    batch = PromptBatch.cat([rounds[r].batch.select([g]) for r, g in picks])
    return Round(batch=batch, rollout=rollout, rewards=rewards, total=total)


def dynamic_sampling_metrics(rounds: list[Round], signal: list[list[bool]], picks: list[tuple[int, int]],
                             batch_size: int) -> dict[str, float]:
    """dynamic_sampling/*: rounds sampled, groups dropped for want of signal, groups with signal beyond the B kept,
    and the mean reward of everything generated."""
    B = batch_size
    with_signal, picked_with_signal = sum(map(sum, signal)), sum(signal[r][g] for r, g in picks)
    return {
        "dynamic_sampling/rounds": len(rounds),
        "dynamic_sampling/filtered_groups": len(rounds) * B - with_signal - (B - picked_with_signal),
        "dynamic_sampling/surplus_groups": with_signal - picked_with_signal,
        "dynamic_sampling/generated_reward_mean": torch.cat([rd.total for rd in rounds]).nanmean().item(),
    }
