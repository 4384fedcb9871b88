"""DAPO's dynamic sampling (arXiv:2503.14476) as a wrapper of the rollouts: rounds sampled until B groups have signal
(grpo_cli/algo/dynamic_sampling.py picks them), or algorithm.dynamic_sampling.max_rounds were sampled."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from grpo_cli.algo.advantages import groups_with_signal
from grpo_cli.algo.dynamic_sampling import Round, assemble, dynamic_sampling_metrics, pick_groups
from grpo_cli.datatypes import RewardResult, Rollout, StepBatch
from grpo_cli.process.clock import Clock
from grpo_cli.rollout.backends import Generator
from grpo_cli.rollout.protocol import Rounds, Scored


class DynamicSampling:
    """`inner`'s rounds until B groups have signal; everything else is `inner`'s."""

    def __init__(self, inner: Rounds) -> None:
        self.inner = inner

    def next(self, step: int, clock: Clock) -> StepBatch:
        inner = self.inner
        B, G = inner.recipe.train.prompts_per_step, inner.G
        max_rounds = inner.recipe.algorithm.dynamic_sampling.max_rounds
        first = inner.round(step, clock)
        rounds = [self._whole(first)]
        signal = [groups_with_signal(rounds[0].total, G)]
        while sum(map(sum, signal)) < B and len(rounds) < max_rounds:  # a later round wakes the sleeping generator
            rounds.append(self._whole(inner.round(step, clock, wake=True)))
            signal.append(groups_with_signal(rounds[-1].total, G))
        picks = pick_groups(signal, B)
        chosen = assemble(rounds, picks, G, inner.generator.pad_id)
        local = list(inner.rows)
        mine = Scored(chosen.batch, chosen.rollout.select(local).to(first.rollout.completion_ids.device),
                      chosen.rewards.select(local), chosen.total)
        return inner.step_batch(step, mine, dynamic_sampling_metrics(rounds, signal, picks, B))

    def _whole(self, scored: Scored) -> Round:
        """A round with every process's rows (each process scored only its own; its error counts stay its own)."""
        procs, rollout, rewards = self.inner.procs, scored.rollout.to("cpu"), scored.rewards
        if procs.count > 1:
            parts = procs.gather_rows([(rollout, rewards)])  # in process order: the rows' order
            rollout = Rollout.cat([p[0] for p in parts], self.inner.generator.pad_id)
            rewards = replace(RewardResult.cat([p[1] for p in parts]), errors=rewards.errors, timeouts=rewards.timeouts,
                              nonfinite=rewards.nonfinite)
        return Round(batch=scored.batch, rollout=rollout, rewards=rewards, total=scored.total.cpu())

    # ------------------------------------------------------------------ the rest is the inner rollouts'
    def prepare(self) -> str | None:
        return self.inner.prepare()

    def start(self, step: int) -> None:
        self.inner.start(step)

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        return self.inner.after_update(policy, step)

    def eval_generator(self, sharded: bool) -> Generator | None:
        return self.inner.eval_generator(sharded)

    def sampling_copy(self) -> torch.nn.Module | None:
        return self.inner.sampling_copy()

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.inner.checkpoint_parts()

    def close(self) -> None:
        self.inner.close()
