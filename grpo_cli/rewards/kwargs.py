"""Check a reward's `kwargs` when the recipe is validated, before any model loads.

Keys: every key must be a parameter of the function. Built-ins take `**_` only to ignore the dataset
columns grpo passes to every reward, so they are checked against their keyword-only parameters (their
settings: `mode`, `pattern`, ...). A user function that takes `**kwargs` accepts any key; one without
it accepts its named parameters. `prompts`, `completions` and `completion_ids` are what grpo scores and
cannot be set; a key named like a dataset column overrides that column (one value for every row).

Values: built-ins also check their values here (`{mode: boxd}` is refused with the valid modes), so a
typo fails in `grpo validate`, not at step 1.

Importing this module must not import torch.
"""

from __future__ import annotations

import inspect
import numbers
import re
from collections.abc import Callable
from typing import Any

from grpo_cli.registry import did_you_mean
from grpo_cli.rewards.builtin import EXTRACT_MODES, GYM_EXTRACT, REWARDS
from grpo_cli.rewards.judges import judge_settings

RESERVED = ("prompts", "completions", "completion_ids")  # grpo passes these itself


def accepted_kwargs(fn: Callable, builtin: bool) -> list[str] | None:
    """Names `kwargs` may set, or None when the function takes any keyword (`**kwargs`, or no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some C callables have no signature: nothing to check against
        return None
    if builtin:
        return [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in RESERVED]


def check_kwargs(name: str, fn: Callable, kwargs: dict[str, Any]) -> None:
    """Raise ValueError `kwargs.KEY: ...` for a key the function does not take or a bad built-in value."""
    for key in kwargs:
        if key in RESERVED:
            raise ValueError(
                f"kwargs.{key}: grpo passes {', '.join(RESERVED)} to every reward itself; remove it from kwargs"
            )
    builtin = name in REWARDS
    if builtin and name in BUILTIN_CHECKS:
        BUILTIN_CHECKS[name](kwargs)
    accepted = accepted_kwargs(fn, builtin)
    if accepted is not None:
        for key in kwargs:
            if key not in accepted:
                takes = ", ".join(accepted) if accepted else "no settings"
                where = f"the built-in reward {name!r}" if builtin else f"{name} (its signature has no **kwargs)"
                hint = did_you_mean(key, accepted)
                raise ValueError(f"kwargs.{key}: not a parameter of {where}{hint}; it takes: {takes}")


def check_parameters(name: str, fn: Callable, kwargs: dict[str, Any], columns: list[str], level: str = "outcome") -> None:
    """Raise ValueError unless the call grpo makes fits the function's signature: each parameter without a default
    is a dataset column, an argument grpo passes or a kwargs key, and a function without **kwargs takes every
    column (grpo passes them all, as TRL does). `columns`: the dataset's, the answer column renamed `answer`."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    passed = [*RESERVED, *(["completion_offsets"] if level == "step" else []), *columns, *kwargs]
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for p in params:
        if p.kind in named and p.default is p.empty and p.name not in passed:
            raise ValueError(
                f"parameter {p.name!r} of reward {name} is no dataset column and no argument grpo passes"
                f"{did_you_mean(p.name, passed)}; it gets: {', '.join(dict.fromkeys(passed))}; rename it, give it a "
                "default, or set it in kwargs")
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    taken = {p.name for p in params if p.kind in named}
    extra = [c for c in dict.fromkeys(passed) if c not in taken]
    if extra:
        raise ValueError(
            f"reward {name} takes no **kwargs, and grpo passes every dataset column to each reward (as TRL does): "
            f"{', '.join(extra)} would fail the first call; add **kwargs to its signature")


# --------------------------------------------------------------------------- built-in values


def _int(kwargs: dict[str, Any], key: str, low: int, required: bool = False, hint: str = "") -> None:
    if key not in kwargs or (kwargs[key] is None and not required):
        if required:
            raise ValueError(f"kwargs.{key}: required, an integer >= {low}{hint}")
        return
    v = kwargs[key]
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
        raise ValueError(f"kwargs.{key}: must be an integer >= {low} (got {v!r}){hint}")


def _accuracy(kwargs: dict[str, Any]) -> None:
    mode = kwargs.get("mode", "auto")
    if mode not in EXTRACT_MODES:
        hint = did_you_mean(str(mode), EXTRACT_MODES)
        raise ValueError(f"kwargs.mode: unknown answer extraction mode {mode!r}{hint}; valid: {', '.join(EXTRACT_MODES)}")
    tag = kwargs.get("tag", "answer")
    if not isinstance(tag, str) or not tag.strip():
        raise ValueError(f"kwargs.tag: must be a non-empty tag name such as answer (got {tag!r})")
    if not isinstance(kwargs.get("strict", False), bool):
        raise ValueError(f"kwargs.strict: must be true or false (got {kwargs['strict']!r})")


def _format(kwargs: dict[str, Any]) -> None:
    if "pattern" not in kwargs:
        return
    pattern = kwargs["pattern"]
    if not isinstance(pattern, str):
        raise ValueError(f"kwargs.pattern: must be a regular expression string (got {pattern!r})")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"kwargs.pattern: not a valid regular expression ({e}): {pattern!r}") from None


def _tag_count(kwargs: dict[str, Any]) -> None:
    if "tags" not in kwargs:
        return
    tags = kwargs["tags"]
    tags = [tags] if isinstance(tags, str) else tags
    if not isinstance(tags, (list, tuple)) or not tags or not all(isinstance(t, str) and t.strip() for t in tags):
        raise ValueError(
            f"kwargs.tags: must be a non-empty list of tag names such as [think, answer] (got {kwargs['tags']!r})"
        )


def _soft_overlong(kwargs: dict[str, Any]) -> None:
    hint = " (DAPO uses 4096 with max_completion_length 20480)"
    _int(kwargs, "soft_punish_cache", 1, required=True, hint=hint)
    _int(kwargs, "max_completion_length", 1)
    cache, l_max = kwargs["soft_punish_cache"], kwargs.get("max_completion_length")
    if l_max is not None and cache > l_max:
        raise ValueError(f"kwargs.soft_punish_cache ({cache}) must be <= kwargs.max_completion_length ({l_max})")


def _repetition(kwargs: dict[str, Any]) -> None:
    _int(kwargs, "ngram_size", 1)
    p = kwargs.get("max_penalty", -1.0)
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or p > 0:
        raise ValueError(f"kwargs.max_penalty: must be a number <= 0, e.g. -1.0 (got {p!r})")


def _reasoning_gym(kwargs: dict[str, Any]) -> None:
    if "extract" in kwargs and kwargs["extract"] not in GYM_EXTRACT:
        raise ValueError(f"kwargs.extract: {kwargs['extract']!r} is not an extraction; valid: {', '.join(GYM_EXTRACT)}")


BUILTIN_CHECKS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "judge": judge_settings,
    "reasoning_gym": _reasoning_gym,
    "accuracy": _accuracy,
    "format": _format,
    "tag_count": _tag_count,
    "soft_overlong_punishment": _soft_overlong,
    "repetition_penalty": _repetition,
}
