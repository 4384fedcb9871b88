"""Scripted environments for tests/test_episodes.py (loaded by path, as a recipe names them)."""

import time


class Echo:
    """Answers each turn with its length; done after `turns` turns (or when a turn holds `stop`).
    reset: a hint for the first turn; reward: 1.0 if the first turn had a digit, else 0.0."""

    def __init__(self, turns: int = 2, stop: str | None = None, hint: str | None = None):
        self.turns, self.stop, self.hint, self.seen = turns, stop, hint, []

    def reset(self, row):
        return self.hint.format(**row) if self.hint else None

    def step(self, text):
        self.seen.append(text)
        if len(self.seen) >= self.turns or (self.stop and self.stop in text):
            return None, True
        return f"turn {len(self.seen)}: you wrote {len(text)} characters", False

    def reward(self):
        return float(any(c.isdigit() for c in self.seen[0])) if self.seen else None


class Flaky(Echo):
    """Echo whose step raises on its second call when `raise_on_second`, or hangs when `hang_on_second`."""

    def __init__(self, raise_on_second: bool = False, hang_on_second: bool = False):
        super().__init__(turns=4)
        self.raise_on_second, self.hang_on_second = raise_on_second, hang_on_second

    def step(self, text):
        if len(self.seen) == 1:
            if self.raise_on_second:
                raise RuntimeError("the environment broke")
            if self.hang_on_second:
                time.sleep(60)
        return super().step(text)


class NoStep:
    def reset(self, row):
        return None


def not_a_class(text):
    return None, True


class NoReward:
    def step(self, text):
        return None, True
