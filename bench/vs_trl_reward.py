"""The reward of `bench/vs_trl.py`, importable by both sides: plain Python, no dependencies.

One signature serves both trainers: `grpo` calls `reward(prompts, completions, answer=[...], ...)` with
completion strings; TRL's GRPOTrainer calls it with the dataset's columns as keyword arguments and, for
conversational prompts, completions as `[{"role": "assistant", "content": ...}]`.

reward = 1 if the last number in the completion equals the reference answer, plus 0.1 x the fraction of
characters that are digits (so a random tiny model's completions differ in reward too: a group whose
rewards are all equal has zero advantages, and neither trainer would then learn anything).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _text(completion) -> str:
    if isinstance(completion, list):  # TRL, conversational: [{"role": "assistant", "content": "..."}]
        return "".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def score(text: str, answer: str) -> float:
    numbers = _NUMBER.findall(text)
    correct = bool(numbers) and float(numbers[-1]) == float(answer)
    digits = sum(c.isdigit() for c in text) / max(len(text), 1)
    return float(correct) + 0.1 * digits


def reward(prompts, completions, answer, **kwargs) -> list[float]:
    return [score(_text(c), a) for c, a in zip(completions, answer)]


def last_number(prompts, completions, answer, **kwargs) -> list[float]:
    """1 if the last number in the completion is the answer, else 0 (the whole-run comparison, bench/vs_trl_runs.py)."""
    out = []
    for c, a in zip(completions, answer):
        numbers = _NUMBER.findall(_text(c))
        out.append(float(bool(numbers) and float(numbers[-1]) == float(a)))
    return out
