"""Errors shared by modules that must not import each other; each message is meant for people."""


class DataError(RuntimeError):
    """Data that cannot be used; the message names what is wrong and what to change."""


class SetupError(RuntimeError):
    """The run cannot start as asked (the message says what to change)."""


class RewardError(RuntimeError):
    """A reward function failed, timed out or returned something that is not N rewards."""


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is meant for people (the CLI exits 2 with it)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved, found or used; the message names the file and what to do."""
