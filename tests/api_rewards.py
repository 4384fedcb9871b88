"""A reward for the Python API tests, as a file the command line can name: the same function a notebook defines."""


def brevity(completions: list[str], **_) -> list[float]:
    return [1.0 / (1 + len(c)) for c in completions]
