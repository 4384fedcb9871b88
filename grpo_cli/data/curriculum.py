"""A difficulty curriculum (data.curriculum): prompts come back by what their groups last gave. A large share of
groups carry no signal (every completion right, or every one wrong: every advantage is exactly 0), and dynamic
sampling throws such groups away after paying for them; prime-rl samples its prompts from pools by their past pass
rate. Here a row whose last group gave no signal is drawn with probability `no_signal_weight` when its turn comes in
an epoch's order, and passed over until the next epoch otherwise, before anything is sampled for it. A row not yet
seen, or whose last group had a signal, is always drawn; a row passed over keeps its mark until it is drawn again.

The draw for the row at position i of epoch e is a uniform number from numpy's Generator seeded with (seed, e, i),
and the marks come from the step's rewards of every process: every process passes over the same rows, and a run
resumed from a checkpoint (the marks are in it) draws what the run that went on drew.

Importing this module must not import torch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


class Curriculum:
    def __init__(self, no_signal_weight: float, seed: int) -> None:
        self.weight, self.seed = no_signal_weight, seed
        self.no_signal: dict[int, bool] = {}  # row -> whether its last group gave no signal
        self.passed_over = 0  # since the last metrics

    def draws(self, row: int, epoch: int, position: int) -> bool:
        """Whether the row at `position` of epoch `epoch`'s order is drawn (counted when it is not)."""
        if not self.no_signal.get(row, False):
            return True
        drawn = np.random.default_rng([self.seed % 2**63, epoch, position]).random() < self.weight
        self.passed_over += not drawn
        return bool(drawn)

    def observe(self, rows: Sequence[int], rewards: Sequence[float], group_size: int) -> None:
        """Mark each row by its group's rewards ([len(rows) * G], missing ones NaN): no signal when fewer than two
        are given or they all lie within 1e-6 (the advantages' own test, algo/advantages.py)."""
        for g, row in enumerate(rows):
            given = [float(r) for r in rewards[g * group_size : (g + 1) * group_size] if not math.isnan(float(r))]
            self.no_signal[int(row)] = len(given) < 2 or max(given) - min(given) <= 1e-6

    def metrics(self) -> dict[str, float]:
        out = {"curriculum/passed_over": float(self.passed_over),
               "curriculum/no_signal_rows": float(sum(self.no_signal.values()))}
        self.passed_over = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"no_signal": sorted(r for r, flag in self.no_signal.items() if flag),
                "signal": sorted(r for r, flag in self.no_signal.items() if not flag)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.no_signal = {**{int(r): False for r in state.get("signal", [])},
                          **{int(r): True for r in state.get("no_signal", [])}}
