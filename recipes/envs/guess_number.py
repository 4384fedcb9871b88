"""A guessing game with feedback, for multi-turn episodes (`rollout.environment`; README "Agents").

The dataset row's `answer` is the number to find. After each assistant turn the environment reads the last
number in it and answers "Higher." / "Lower." / "Correct!"; a turn without a number gets "Answer with a number.".
reward(): 1.0 if the number was found, minus 0.1 per extra guess (finding it sooner is better), never below 0.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


class GuessTheNumber:
    def __init__(self, penalty_per_guess: float = 0.1) -> None:
        self.penalty, self.guesses, self.found = penalty_per_guess, 0, False

    def reset(self, row: dict) -> str:
        self.target = int(float(row["answer"]))
        return "If you are not sure, guess: I will say higher or lower."

    def step(self, completion_text: str) -> tuple[str | None, bool]:
        numbers = _NUMBER.findall(completion_text)
        if not numbers:
            return "Answer with a number.", False
        self.guesses += 1
        guess = int(numbers[-1])
        if guess == self.target:
            self.found = True
            return "Correct!", True
        return ("Higher." if guess < self.target else "Lower."), False

    def reward(self) -> float:
        return max(0.0, 1.0 - self.penalty * (self.guesses - 1)) if self.found else 0.0
