"""The control of bench/learning_checks.py: a reward that knows nothing of the task (arXiv 2506.10947's random
reward). Each completion scores 1 with probability `p` (default 0.5), else 0, drawn from a generator seeded once
by `seed`; the draws depend on nothing the model wrote."""

from __future__ import annotations

import random
from typing import Any

_RNG: dict[int, random.Random] = {}


def coin(completions: list[str], *, seed: int = 0, p: float = 0.5, **_: Any) -> list[float]:
    rng = _RNG.setdefault(seed, random.Random(seed))
    return [float(rng.random() < p) for _ in completions]
