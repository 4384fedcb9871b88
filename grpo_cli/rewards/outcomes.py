"""What one reward call's outcome means: its values checked (N floats or None), its failures raised or, with
`on_error: skip`, counted and logged once with the frame in the user's code (grpo_cli/rewards/scoring.py runs the
calls). A call the function's own signature refuses always raises: skipping it would drop the reward everywhere.

Importing this module must not import torch."""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from grpo_cli.errors import RewardError
from grpo_cli.rewards.steps import check_steps


class RewardSpec(Protocol):
    """A recipe's reward entry (recipe.RewardConfig), as scoring reads it."""

    name: str
    weight: float
    kwargs: dict[str, Any]
    timeout_s: float | None
    on_error: Literal["raise", "skip"]
    level: Literal["outcome", "step"]


class ChildFailure(Exception):
    """An exception raised inside a reward's child process, carried back as text: `kind` is the type's
    name, `message` its message, `frame` the user-code frame, `child_traceback` the whole traceback."""

    def __init__(self, kind: str, message: str, frame: str = "", child_traceback: str = "") -> None:
        super().__init__(f"{kind}: {message}" + (f"\n\nchild traceback:\n{child_traceback}" if child_traceback else ""))
        self.kind, self.message, self.frame = kind, message, frame


class RowsFailed(Exception):
    """Raised by a reward that scored some rows and could not score others (a judge that did not answer, or whose
    answer did not parse): `values` holds None at the `failed` rows, `reason` says why the first one failed. With
    on_error: skip the rows are missing and counted (rewards/<name>/failed); without, the run stops: never a 0."""

    def __init__(self, values: list[float | None], failed: int, reason: str) -> None:
        super().__init__(f"{failed} of {len(values)} completions could not be scored; the first: {reason}")
        self.values, self.failed, self.reason = values, failed, reason


log = logging.getLogger(__name__)
_REPORTED: set[tuple[str, str]] = set()  # (log name, kind) whose first failure this process has logged


@dataclass
class Outcome:
    values: Any = None
    error: BaseException | None = None
    timed_out: bool = False


def check_values(log_name: str, out: Any, n: int, skip: bool = False) -> tuple[list[float | None], list[int]]:
    """The call's result as N floats or None, and the rows whose value was NaN or inf (None with `skip`,
    RewardError without); RewardError saying what is wrong for any other broken result."""
    if not isinstance(out, (list, tuple)):
        kind = type(out).__name__
        raise RewardError(f"reward {log_name!r} returned a {kind}; it must return a list of {n} floats (or None)")
    if len(out) != n:
        raise RewardError(
            f"reward {log_name!r} returned {len(out)} values for {n} completions; it must return one per completion"
        )
    values: list[float | None] = []
    nonfinite: list[int] = []
    for i, v in enumerate(out):
        if v is None:
            values.append(None)
        elif isinstance(v, numbers.Real):  # int, float, bool, numpy scalars
            if isinstance(v, numbers.Integral) and abs(int(v)) > sys.float_info.max:  # float() would raise
                raise RewardError(
                    f"reward {log_name!r} returned an integer of {int(v).bit_length()} bits for completion {i}, too "
                    "large for a float; return a float (or None for a missing reward)"
                )
            if not math.isfinite(float(v)):
                if not skip:
                    raise RewardError(
                        f"reward {log_name!r} returned {float(v)} for completion {i}; return None for a missing "
                        "reward, or set on_error: skip to score such values as missing"
                    )
                nonfinite.append(i)
                values.append(None)
                continue
            values.append(float(v))
        else:
            raise RewardError(
                f"reward {log_name!r} returned a {type(v).__name__} ({v!r:.60}) for completion {i}; "
                "expected a float or None"
            )
    return values, nonfinite


def user_frame(e: BaseException, fn: Callable | None = None) -> str:
    """`file:line in function` of the innermost traceback frame in the reward's own file (else the innermost
    one outside grpo_cli), so a skipped failure points at the user's code, not at grpo's."""
    frames = traceback.extract_tb(e.__traceback__)
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn)) if fn is not None else None
        own = os.path.realpath(source) if source else None
    except (TypeError, OSError):
        own = None
    grpo_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    mine = [f for f in frames if own and os.path.realpath(f.filename) == own]
    if not mine:
        mine = [f for f in frames if not os.path.realpath(f.filename).startswith(grpo_dir + os.sep)]
    return f"{mine[-1].filename}:{mine[-1].lineno} in {mine[-1].name}" if mine else ""


def _report_once(log_name: str, kind: str, text: str) -> None:
    """Log `text` the first time the reward logged as `log_name` fails this way in this process (on_error: skip)."""
    if (log_name, kind) not in _REPORTED:
        _REPORTED.add((log_name, kind))
        log.warning(text)


def reset_reports() -> None:
    """Forget which first failures were logged (a new run in the same process logs them again)."""
    _REPORTED.clear()


def _skipped_error(label: str, log_name: str, e: BaseException, fn: Callable | None, step: int) -> str:
    kind, message = (e.kind, e.message) if isinstance(e, ChildFailure) else (type(e).__name__, str(e))
    frame = e.frame if isinstance(e, ChildFailure) else user_frame(e, fn)
    where = f"\n  at {frame}" if frame else ""
    return (f"reward {label} failed at step {step} and is scored as missing (on_error: skip): {kind}: {message}{where}\n"
            f"  later failures of this reward are only counted (rewards/{log_name}/errors)")


def _signature_mismatch(error: BaseException, name: str) -> bool:
    """Whether `error` is Python refusing the call of the function `name` itself (a parameter no argument fills, an
    argument no parameter takes), not a TypeError raised inside it: every call would fail the same way."""
    kind, message = (error.kind, error.message) if isinstance(error, ChildFailure) else (type(error).__name__,
                                                                                        str(error))
    refused = (r"got an unexpected keyword argument|got multiple values for argument|"
               r"missing \d+ required (positional|keyword-only) argument")
    return kind == "TypeError" and re.match(rf"(\w+\.)*({re.escape(name)}|__call__)\(\) ({refused})", message) is not None


def interpret(
    spec: RewardSpec, log_name: str, out: Outcome, n: int, step: int, counts: dict[str, dict[str, int]],
    fn: Callable | None = None, lengths: list[int] | None = None, passed: Iterable[str] = (),
) -> list[Any]:
    """The call's rewards (a step-level reward's: its steps, rewards/steps.py; `lengths`: the completions' token
    counts; `passed`: the keyword arguments of the call); failures and timeouts raise RewardError or, with
    on_error: skip, count and give None. A call the function's signature refuses raises either way: skipping it
    would drop the reward from every step."""
    label = repr(log_name) if log_name == spec.name else f"{log_name!r} ({spec.name})"
    skip = spec.on_error == "skip"
    if out.error is not None and _signature_mismatch(out.error, spec.name.rsplit(":", 1)[-1]):
        e = out.error
        text = f"{e.kind}: {e.message}" if isinstance(e, ChildFailure) else f"{type(e).__name__}: {e}"
        raise RewardError(
            f"reward {label} cannot take the call grpo makes: {text}\nit is called with the keyword arguments "
            f"{', '.join(sorted(passed))}: name its parameters after these (the data's columns and grpo's standard "
            "arguments), or add **kwargs to take the rest. on_error: skip would not help: every call fails this way, "
            "so the reward would be dropped from every step. `grpo validate` checks this before training"
        ) from e
    if out.timed_out:
        if not skip:
            raise RewardError(
                f"reward {label} timed out after {spec.timeout_s:g} s at step {step} (its child process was killed); "
                "raise timeout_s, or set on_error: skip to score such calls as missing"
            )
        _report_once(log_name, "timeout", f"reward {label} timed out after {spec.timeout_s:g} s at step {step} and is "
                     f"scored as missing (on_error: skip); later timeouts are only counted (rewards/{log_name}/timeouts)")
        counts["timeouts"][log_name] = counts["timeouts"].get(log_name, 0) + 1
        return [None] * n
    if isinstance(out.error, RowsFailed):
        e = out.error
        if not skip:
            raise RewardError(f"reward {label} failed at step {step}: {e}\nset on_error: skip to score such "
                              f"completions as missing (counted as rewards/{log_name}/failed)") from e
        _report_once(log_name, "failed", f"reward {label} could not score {e.failed} of {n} completions at step {step}; "
                     f"they are scored as missing (on_error: skip); the first: {e.reason}\n  later ones are only "
                     f"counted (rewards/{log_name}/failed)")
        counts["failed"][log_name] = counts["failed"].get(log_name, 0) + e.failed
        return check_values(log_name, e.values, n, skip)[0]
    if out.error is not None:
        e = out.error
        if not skip:
            text = str(e) if isinstance(e, ChildFailure) else f"{type(e).__name__}: {e}"
            raise RewardError(
                f"reward {label} failed at step {step}: {text}\n"
                "fix the function, or set on_error: skip to score failed calls as missing"
            ) from e
        _report_once(log_name, "error", _skipped_error(label, log_name, e, fn, step))
        counts["errors"][log_name] = counts["errors"].get(log_name, 0) + 1
        return [None] * n
    if getattr(spec, "level", "outcome") == "step":
        steps, bad = check_steps(log_name, out.values, lengths or [], skip)
        if bad:
            counts["nonfinite"][log_name] = counts["nonfinite"].get(log_name, 0) + bad
        return steps
    values, nonfinite = check_values(log_name, out.values, n, skip)
    if nonfinite:
        bad = out.values[nonfinite[0]]
        _report_once(log_name, "nonfinite", f"reward {label} returned {float(bad)} for completion {nonfinite[0]} at "
                     f"step {step}; scored as missing (on_error: skip); later ones are only counted "
                     f"(rewards/{log_name}/nonfinite)")
        counts["nonfinite"][log_name] = counts["nonfinite"].get(log_name, 0) + len(nonfinite)
    return values
