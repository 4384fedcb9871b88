def add(x: float, y: float) -> float:
    """Add two numbers (a second tool named add).

    Args:
        x: The first number.
        y: The second number.
    """
    return x + y
