"""Tools for tests/test_tools.py (named by path, as a recipe names them)."""

import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def slow(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "done"


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError(f"broken tool got {x}")


def no_hints(a, b):
    """Add.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Calculator:
    pass
