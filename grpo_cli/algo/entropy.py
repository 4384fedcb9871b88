"""The entropy bonus: the loss minus c times the mean entropy of the trained tokens, with c fixed
(`entropy_coef`) or steered towards a target entropy (Skywork-OR1 arXiv:2505.22312's adaptive entropy control;
TRL 1.16's `use_adaptive_entropy`, same names, defaults and order of events).

Adaptive control, once per optimizer step: the mean entropy H of the step's trained tokens (every micro-batch,
every process) is measured; c <- min(c + delta, c_max) if H <= target else max(c - delta, c_min); and the next
step applies c only if H <= target (0 otherwise). The first step of a run applies nothing (H unknown). The
coefficient and the last H are the run's state: a checkpoint holds them, and a resume continues exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EntropyControl:
    coef: float  # c
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf  # H of the last optimizer step; inf: none yet

    @classmethod
    def from_recipe(cls, a) -> EntropyControl:
        return cls(a.entropy_coef, a.use_adaptive_entropy, a.entropy_target, a.entropy_coef_delta,
                   a.entropy_coef_min, a.entropy_coef_max)

    def applied(self) -> float:
        """The coefficient this optimizer step's micro-batches use."""
        if self.adaptive and not self.last_entropy <= self.target:
            return 0.0
        return self.coef

    def step(self, entropy: float) -> None:
        """After an optimizer step whose trained tokens had mean entropy `entropy`."""
        if not self.adaptive:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float | None]:
        last = self.last_entropy if math.isfinite(self.last_entropy) else None  # JSON has no inf
        return {"entropy_coef": self.coef, "last_entropy": last}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        self.coef = float(state["entropy_coef"])
        last = state["last_entropy"]
        self.last_entropy = math.inf if last is None else float(last)
