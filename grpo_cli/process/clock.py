"""A step's clock: its time and peak memory region by region (the engine's `with clock("generate"): ...`; the
rollouts and the update are handed it)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

from grpo_cli.process.memory import PhasePeaks


def settle(device: torch.device) -> None:
    """Wait for the kernels queued on a GPU, so that the timer read next counts them (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """A step's time and peak memory by region: `with clock("train"): ...` adds the seconds spent in it (GPU kernels
    waited for) to time/train and records its peak memory as memory/train_gib; `clock.memory("optimizer")` records a
    phase's peak memory only (grpo_cli/process/memory.py). `times()` adds time/step, everything since the clock started."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.start, self.spent = device, time.perf_counter(), {}
        self.memory = PhasePeaks(device)

    @contextmanager
    def __call__(self, region: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with self.memory(region):
                yield
        finally:
            settle(self.device)
            self.spent[f"time/{region}"] = self.spent.get(f"time/{region}", 0.0) + time.perf_counter() - t0

    def times(self) -> dict[str, float]:
        """time/<region> and memory/<phase>_gib of every region and phase, and time/step."""
        return {**self.spent, **self.memory.metrics(), "time/step": time.perf_counter() - self.start}
