"""A tool named like tests/trl_envs.py:IncrementEnv's method, for the name-clash check."""


def increment(step: int) -> int:
    """Add one step.

    Args:
        step: How much.
    """
    return step
