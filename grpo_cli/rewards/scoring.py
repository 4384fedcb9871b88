"""Resolve reward names to functions, call them TRL-style and sum their weighted rewards.

A reward is named five ways: a built-in (`accuracy`), `module:function` (an importable module),
`path/to/file.py:function` (in a recipe: relative to the recipe's folder; load_recipe makes it absolute),
`model:PATH_OR_HUB_ID` (a sequence-classification reward model, see reward_model.py) or a URL (a function behind
an HTTP endpoint, remote.py). Each function is called as
`fn(prompts=..., completions=..., completion_ids=..., **columns, **spec.kwargs)` and returns one
float or None per completion; the total is TRL's: the weighted sum over functions that gave a
value, NaN where none did.

Failures: with `on_error: raise` (the default) an exception stops the run with its text. With
`on_error: skip` it scores the call as missing (None); the first failure of each reward is logged
once (type, message and the frame in the user's code), later ones are only counted. A NaN or inf
value is a failure too: an error with `raise`, None and counted (`nonfinite`) with `skip`. A wrong
number of values or a wrong type always raises: that is a programming error, not a bad sample; so does a call
the function's signature refuses (outcomes.py says what each outcome means).

How a call runs:
  * plain functions run in order in this process;
  * `async def` functions of one `score` call run concurrently in one event loop;
  * a reward with `timeout_s` runs in a child process (multiprocessing "forkserver": a clean server
    process forks each child, which is safe in a process holding CUDA or threads and costs
    milliseconds after the first call) that is killed when its time is up. The child gets the
    reward's *name* and re-resolves it, so file rewards need no pickling of functions; its
    arguments must be picklable. Children start first and run alongside everything else.

Importing this module must not import torch (`grpo validate` checks reward names with it).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpo_cli.rewards.reward_model as rm
from grpo_cli.errors import RewardError
from grpo_cli.recipe.names import (  # noqa: F401  (rewards/__init__ exports the log names)
    is_remote,
    is_reward_model,
    reward_log_name,
    unique_log_names,
)
from grpo_cli.registry import did_you_mean
from grpo_cli.rewards.builtin import REWARDS
from grpo_cli.rewards.kwargs import check_kwargs
from grpo_cli.rewards.outcomes import ChildFailure, Outcome, RewardSpec, interpret, user_frame
from grpo_cli.rewards.remote import RemoteReward
from grpo_cli.rewards.steps import step_mean
from grpo_cli.process.watchdog import phase
from grpo_cli.usercode import children, objects
from grpo_cli.usercode.children import become_subreaper

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from grpo_cli.datatypes import RewardResult


_FORMS = objects.forms()


# --------------------------------------------------------------------------- name resolution


def resolve_reward(name: str, timeout_s: float | None = None) -> Callable[..., Any]:
    """The function a reward name stands for (`timeout_s`: a remote reward's per request). Raises ValueError with a
    message for people."""
    if name in REWARDS:
        return REWARDS[name]
    if is_reward_model(name):
        return rm.reward_model(name)
    if is_remote(name):
        return RemoteReward(name, timeout_s)
    if ":" not in name:
        hint = did_you_mean(name, REWARDS.names())
        raise ValueError(
            f"unknown reward {name!r}{hint}; built-in rewards: {', '.join(REWARDS.names())}; "
            f"or name your own function as {_FORMS}, or a reward model as `model:PATH_OR_HUB_ID`"
        )
    return objects.resolve_object(name)


def check_reward_name(name: str) -> None:
    """Raise ValueError (message for people) unless `name` resolves to a callable."""
    resolve_reward(name)


def ranks_groups(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether a reward scores a prompt's completions together (the judge in mode group), so a process must hold
    whole groups (grpo_cli/trainer/distributed.py)."""
    ranks = getattr(REWARDS.get(name), "ranks_groups", None) if name in REWARDS else None
    return bool(ranks and ranks(kwargs))


def check_reward(name: str, kwargs: dict[str, Any], timeout_s: float | None = None, level: str = "outcome") -> None:
    """Everything checkable before training: the name resolves, every kwarg is a parameter of the function
    (with a did-you-mean), built-in values are valid, a reward model's config says num_labels 1, a function
    that declares its level (`fn.reward_level`) is used at it.
    Raises ValueError starting with the field (`name: ...`, `kwargs.KEY: ...`) for the recipe validator."""
    if is_reward_model(name):
        if level == "step":
            raise ValueError("level: a reward model scores whole completions: use level outcome")
        rm.check_reward_model(name, kwargs, timeout_s)
        return
    if is_remote(name):
        if level == "step":
            raise ValueError("level: a remote reward scores whole completions: use level outcome")
        return  # its kwargs go to the server with the columns
    try:
        fn = resolve_reward(name)
    except ValueError as e:
        raise ValueError(f"name: {e}") from None
    if objects.is_in_process(name) and timeout_s is not None:
        raise ValueError(f"timeout_s: reward {name!r} is a function of this Python process; a reward with timeout_s "
                         "runs in a child process that imports it by name: put it in a file (path/to/file.py:fn)")
    if timeout_s is not None and (why := getattr(fn, "stays_in_process", None)):
        raise ValueError(f"timeout_s: reward {name!r} cannot run in a child process ({why})")
    declared = getattr(fn, "reward_level", None)
    if declared is not None and declared != level:
        raise ValueError(f"level: reward {name!r} is {declared}-level: set level: {declared}")
    check_kwargs(name, fn, kwargs)


def _portable_name(name: str) -> str:
    """The name with a file path made absolute, for a child process to resolve."""
    if name in REWARDS or ":" not in name or is_reward_model(name):
        return name
    return objects.portable(name)


# --------------------------------------------------------------------------- running one call


def _is_async(fn: Callable) -> bool:
    # an object whose __call__ is `async def` is async too
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _run_sync(fn: Callable, kwargs: dict[str, Any]) -> Outcome:
    try:
        return Outcome(values=fn(**kwargs))
    except Exception as e:  # noqa: BLE001 - on_error decides what happens to it
        return Outcome(error=e)


async def _await_one(fn: Callable, kwargs: dict[str, Any]) -> Any:
    return await fn(**kwargs)


async def _gather(calls: list[tuple[Callable, dict[str, Any]]]) -> list[Any]:
    return await asyncio.gather(*(_await_one(fn, kw) for fn, kw in calls), return_exceptions=True)


def _run_async(calls: list[tuple[Callable, dict[str, Any]]]) -> list[Outcome]:
    """All async calls at once in one event loop (in a helper thread if a loop already runs here)."""
    if not calls:
        return []
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        results = asyncio.run(_gather(calls))
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            results = pool.submit(asyncio.run, _gather(calls)).result()
    return [Outcome(error=r) if isinstance(r, BaseException) else Outcome(values=r) for r in results]


def _child_main(name: str, kwargs: dict[str, Any], conn: Connection) -> None:
    """Child process: resolve the reward by name, call it, send ("ok", values) or ("error", text)."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # own process group: a timeout kills whatever the reward itself started too
    become_subreaper()
    fn = None
    try:
        fn = resolve_reward(name)
        out = fn(**kwargs)
        if inspect.iscoroutine(out):
            out = asyncio.run(out)
        out = list(out) if isinstance(out, tuple) else out
        conn.send(("ok", out))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as text
        try:
            conn.send(("error", type(e).__name__, str(e), user_frame(e, fn), traceback.format_exc()))
        except Exception:  # noqa: BLE001 - e.g. an unpicklable exception
            conn.send(("error", type(e).__name__, "(its message could not be sent)", "", ""))
    finally:
        conn.close()


def _start_child(name: str, kwargs: dict[str, Any], timeout_s: float, log_name: str) -> children.Child:
    try:
        return children.start(_child_main, (_portable_name(name), kwargs), f"reward-{log_name}", timeout_s)
    except Exception as e:
        raise RewardError(
            f"reward {log_name!r}: could not start its child process ({type(e).__name__}: {e}); with timeout_s "
            "the dataset columns and kwargs must be picklable"
        ) from e


def _outcome_of(child: children.Child) -> Outcome:
    """Wait for the child until its deadline; kill it if it is still running then."""
    msg = children.answer(child)
    if msg[0] == "timeout":
        return Outcome(timed_out=True)
    if msg[0] == "exited":
        return Outcome(error=ChildFailure("ChildProcessError", f"child process exited with code {msg[1]} without a result"))
    if msg[0] == "ok":
        return Outcome(values=msg[1])
    return Outcome(error=ChildFailure(*msg[1:]))


def weighted_total(weights: list[float], columns: list[list[float | None]], n: int) -> list[float]:
    """[N] sum of weight * reward over functions that gave one; NaN where none did (TRL's nansum)."""
    total = []
    for i in range(n):
        given = [w * col[i] for w, col in zip(weights, columns) if col[i] is not None]
        total.append(math.fsum(given) if given else math.nan)
    return total


# --------------------------------------------------------------------------- summing and score


def score(
    specs: list[RewardSpec],
    prompts: list[str],
    completions: list[str],
    completion_ids: list[list[int]],
    columns: dict[str, list],
    *,
    step: int = 0,
    user_prompts: list[str] | None = None,
) -> RewardResult:
    """Score N completions with every reward in `specs`. `columns` are dataset columns, one value per
    completion (plus scalars the engine adds, e.g. max_completion_length); `spec.kwargs` override them.
    `user_prompts` [N] (the prompts before the policy's chat template) go to reward models only."""
    from grpo_cli.datatypes import RewardResult  # here: datatypes imports torch

    n = len(completions)
    lengths = [len(c) for c in completion_ids]
    log_names = unique_log_names([s.name for s in specs])
    base = {**columns, "prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    fns = [resolve_reward(s.name, s.timeout_s) for s in specs]
    kwargs = [{**base, **s.kwargs, **({"user_prompts": user_prompts} if isinstance(f, rm.RewardModel) else {})}
              for s, f in zip(specs, fns)]
    counts: dict[str, dict[str, int]] = {"errors": {}, "timeouts": {}, "nonfinite": {}, "failed": {}}
    values: dict[int, list[float | None]] = {}
    started: dict[int, children.Child] = {}
    try:
        for i, s in enumerate(specs):
            if s.timeout_s is not None and not is_remote(s.name):  # a remote reward's timeout bounds each request
                started[i] = _start_child(s.name, kwargs[i], s.timeout_s, log_names[i])
        local = [i for i in range(len(specs)) if i not in started]
        for i in (i for i in local if not _is_async(fns[i])):
            with phase(f"reward {log_names[i]!r}"):  # the watchdog names a reward that never returns
                outcome = _run_sync(fns[i], kwargs[i])
            values[i] = interpret(specs[i], log_names[i], outcome, n, step, counts, fns[i], lengths, kwargs[i])
        async_ids = [i for i in local if _is_async(fns[i])]
        with phase(f"rewards {', '.join(repr(log_names[i]) for i in async_ids)} (async)"):
            outcomes = _run_async([(fns[i], kwargs[i]) for i in async_ids])
        for i, out in zip(async_ids, outcomes):
            values[i] = interpret(specs[i], log_names[i], out, n, step, counts, fns[i], lengths, kwargs[i])
        for i, child in started.items():
            with phase(f"reward {log_names[i]!r} (its own process)"):
                outcome = _outcome_of(child)
            values[i] = interpret(specs[i], log_names[i], outcome, n, step, counts, lengths=lengths, passed=kwargs[i])
    finally:  # on an error above, no child outlives this call
        for child in started.values():
            child.reader.close()
            if child.proc.is_alive():
                children.kill_tree(child.proc)
    stepwise = [i for i, s in enumerate(specs) if getattr(s, "level", "outcome") == "step"]
    steps = {log_names[i]: values[i] for i in stepwise}
    for i in stepwise:  # logged as each completion's mean step reward; trained through its steps
        values[i] = [step_mean(x) for x in values[i]]
    per_function = {log_names[i]: values[i] for i in range(len(specs))}
    outcome = [i for i in range(len(specs)) if i not in stepwise]  # the total is the outcome rewards'
    total = weighted_total([specs[i].weight for i in outcome], [values[i] for i in outcome], n)
    return RewardResult(total=total, per_function=per_function, errors=counts["errors"], timeouts=counts["timeouts"],
                        nonfinite=counts["nonfinite"], failed=counts["failed"], steps=steps)


def score_rollout(specs: list[RewardSpec], rollout, columns: dict[str, list], *, max_completion_length: int,
                  step: int = 0, user_prompts: list[str] | None = None, tokenizer: Any = None) -> RewardResult:
    """Score a `Rollout` (duck-typed: no torch import here). `columns` hold one value per completion;
    `max_completion_length` is added for length-aware rewards unless the data has such a column. With a
    step-level reward, `tokenizer` gives them `completion_offsets` (rewards/steps.py)."""
    ids = rollout.completion_lists()
    columns = {"max_completion_length": [max_completion_length] * len(rollout.completions), **columns}
    if tokenizer is not None and any(getattr(s, "level", "outcome") == "step" for s in specs):
        from grpo_cli.rewards.steps import token_end_offsets

        columns["completion_offsets"] = token_end_offsets(tokenizer, ids)
    return score(specs, rollout.prompts, rollout.completions, ids, columns, step=step, user_prompts=user_prompts)
