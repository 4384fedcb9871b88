"""What the engine asks of its rollouts (grpo_cli/rollout/rollouts.py has the implementations and picks the run's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from grpo_cli.datatypes import Processes, PromptBatch, RewardResult, Rollout, StepBatch
from grpo_cli.process.clock import Clock
from grpo_cli.rollout.backends import Generator



@dataclass
class Scored:
    """One round of sampling: the step's B prompts, this process's rows of their completions and rewards, and the
    weighted rewards of every row (every process's)."""

    batch: PromptBatch
    rollout: Rollout  # [n] this process's rows, on the trainer's device
    rewards: RewardResult  # [n]
    total: torch.Tensor  # [N] float32


class Rollouts(Protocol):
    """What the engine asks for each step's batch (this process's rows of it)."""

    def prepare(self) -> str | None:
        """Once, before step 1: what the sampler readies for the run; -> the start line's words about it, or None."""

    def start(self, step: int) -> None:
        """Before the first step after `step` (the run's start or its checkpoint)."""

    def next(self, step: int, clock: Clock) -> StepBatch:
        """The batch of step `step`, scored; its time goes to clock("generate") and clock("score")."""

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        """The policy after step `step`'s update, for whatever samples next; -> `sync/bytes` (what was handed over)
        and, with several servers, `servers/live`."""

    def eval_generator(self, sharded: bool) -> Generator | None:
        """What the run's eval samples with (None: the policy itself)."""

    def sampling_copy(self) -> torch.nn.Module | None:
        """The copy of the policy sampling runs on, where there is one (rollout.dtype), for the start line."""

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a checkpoint saves of the rollouts (objects with state_dict and load_state_dict), by name: the parts
        every process shares, and each process's own."""

    def close(self) -> None: ...


class Rounds(Rollouts, Protocol):
    """Rollouts sampled in rounds, of which a wrapper (dynamic sampling) can ask for more than one a step."""

    recipe: Any
    G: int
    rows: range  # this process's rows of the B*G
    procs: Processes
    generator: Generator

    def round(self, step: int, clock: Clock, wake: bool = False) -> Scored:
        """B prompts sampled and scored; `wake`: a later round of the step, after the generator went to sleep."""

    def step_batch(self, step: int, chosen: Scored, metrics: dict[str, float] | None = None) -> StepBatch:
        """A round (or rows chosen from several) -> the step's batch, with what sampling measured."""
