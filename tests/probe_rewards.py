"""Rewards for the `grpo doctor` tests: one that pays nothing, one whose values no checkpoint can restore."""

import random

_own = random.Random()  # seeded from the OS: another stream in every process


def always_zero(completions: list[str], **_) -> list[float]:
    return [0.0 for _ in completions]


def unseeded(completions: list[str], **_) -> list[float]:
    return [_own.random() for _ in completions]
