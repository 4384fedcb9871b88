"""Rewards that break the numbers of an update, for the non-finite step tests (tests/trainer/test_nonfinite.py)."""


def huge(completions: list[str], **_) -> list[float]:
    """1e30 for a completion of odd length, else 0: finite, but with algorithm.scale_rewards none the advantages
    are ~1e30 and the gradient overflows float32."""
    return [1e30 if len(c) % 2 else 0.0 for c in completions]


def infinite(completions: list[str], **_) -> list[float]:
    """inf for a completion of odd length, else its length mod 3 (a signal a random model's completions have)."""
    return [float("inf") if len(c) % 2 else float(len(c) % 3) for c in completions]
