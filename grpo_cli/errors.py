"""Every failure a person can fix is a `UserError`: the CLI prints `error: <message>` and exits with its
`exit_code`, without a traceback (grpo_cli/cli.py does it once for every command).

Exit codes: 2 when what the user gave cannot be used (a recipe, a flag, a file, a run folder, a model name);
1 when a run failed on the way (a checkpoint that cannot be written, a reward that raised, a server that
stopped answering); the message says what failed and what to change. A subclass sets its default; a raise
site may pass another (`DataError(..., exit_code=1)`). A request `grpo serve-vllm` refuses is a
`RequestError`: an HTTP status and the field, sent back to the client. Importing this module must stay free of
torch.
"""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, stripped ("" when it has none): a library's error said in one line
    of ours."""
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


class UserError(Exception):
    """A failure meant for people: the message names what is wrong and what to change."""

    exit_code = 1

    def __init__(self, message: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class RecipeError(UserError, ValueError):
    """A recipe (or an override) that cannot be used: the dotted field, the bad value, what is allowed."""

    exit_code = 2


class DataError(UserError):
    """Data that cannot be used: the file, row or column, and what to change."""

    exit_code = 2


class RunFolderError(UserError, ValueError):
    """The run folder cannot be used as asked; the message says what it holds and what to pass."""

    exit_code = 2


class RunLockedError(UserError):
    """Another trainer holds the run folder; the message names it."""

    exit_code = 2


class ModelLoadError(UserError):
    """A model or tokenizer that cannot be found or loaded: the name, where it was looked for, what to do."""

    exit_code = 2


class AdapterError(UserError):
    """A LoRA checkpoint whose base model cannot be found or does not match."""

    exit_code = 1


class CheckpointError(UserError):
    """A checkpoint that cannot be saved, found or used; the message names the file and what to do."""

    exit_code = 1


class SetupError(UserError):
    """The run cannot start as asked (processes, devices, optimizer); the message says what to change."""

    exit_code = 1


class RewardError(UserError):
    """A reward function failed, timed out or returned something that is not N rewards."""

    exit_code = 1


class StallError(UserError):
    """A run made no progress for train.stall_timeout_s (raised where the run was started from Python; the command
    line's processes exit with the same message, grpo_cli/process/watchdog.py)."""

    exit_code = 1


class NonFiniteError(UserError):
    """train.max_nonfinite_steps steps in a row had a NaN or infinite loss or gradient (trainer/nonfinite.py)."""

    exit_code = 1


class EnvironmentUnavailable(UserError):
    """An environment that cannot run an episode at all (its server refuses the sessions a step needs): the run
    stops, naming it, instead of training on failed episodes. An environment raises it from reset."""

    exit_code = 1


class VLLMServerError(UserError):
    """`grpo serve-vllm` could not be reached or refused a request. `status`: the HTTP status of a refusal,
    None when the server was not reached."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UsageError(UserError, ValueError):
    """Command-line options that do not fit together, or a file or folder given that cannot be used."""

    exit_code = 2


class LaunchError(UserError, ValueError):
    """A multi-process launch that cannot work as asked (an accelerate config, a process count)."""

    exit_code = 2


class ConversionError(UserError, ValueError):
    """A TRL config that cannot become a recipe (a required field missing, contradicting batch settings)."""

    exit_code = 2


class InspectError(UserError):
    """A run folder or filter `grpo inspect-rollouts` cannot read."""

    exit_code = 2


class ReportError(UserError):
    """A run folder `grpo report` cannot report on; the message says which one and why."""

    exit_code = 2


class StartError(UserError):
    """`grpo serve-vllm` cannot start: 2 for refused options (nothing loaded), 1 when vLLM failed to start."""

    exit_code = 2


class RequestError(Exception):
    """A request a server of ours refuses (`grpo serve-vllm`, the agent endpoint): HTTP `status`, a message for
    people, the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field = status, field
