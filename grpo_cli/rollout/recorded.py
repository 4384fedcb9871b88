"""The rollouts of `grpo replay` (grpo_cli/trainer/replay.py): each step's batch as a run recorded it
(grpo_cli/run/replays.py), nothing sampled, no weights to hand on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from grpo_cli.datatypes import StepBatch
from grpo_cli.process.clock import Clock
from grpo_cli.rollout.backends import Generator
from grpo_cli.rollout.protocol import Rollouts
from grpo_cli.run.replays import load_step


class Recorded:
    """Step t's batch is the one `run_dir` recorded for step t (process 0's rows: a replay runs one process)."""

    def __init__(self, run_dir: Path, device: torch.device) -> None:
        self.run_dir, self.device = Path(run_dir), device

    def prepare(self) -> str | None:
        return None

    def start(self, step: int) -> None:
        pass

    def next(self, step: int, clock: Clock) -> StepBatch:
        return load_step(self.run_dir, step, 0, self.device)

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        return {}

    def eval_generator(self, sharded: bool) -> Generator | None:
        return None

    def sampling_copy(self) -> torch.nn.Module | None:
        return None

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def close(self) -> None:
        pass


def recorded_rollouts(run_dir: Path) -> Callable[..., Rollouts]:
    """A builder for the engine (build_rollouts' keywords): the records of `run_dir`, on the engine's device."""

    def build(recipe, *, device, **_: Any) -> Rollouts:
        return Recorded(run_dir, device)

    return build
