"""Environments of multi-turn episodes (`rollout.environment`): naming, checking, calling.

A class, one instance per rollout, constructed with its `rollout.environment_kwargs`. Two contracts
(`rollout.environment_api`; auto: `tools` when the class has `get_reward` or no `step`, else `turns`):

  turns (grpo's):   reset(row) -> str | None      optional; `row`: the dataset row's columns as one dict
                    step(completion_text) -> (observation: str | None, done: bool)
                                                  after every assistant turn that ended with EOS (and made no tool
                                                  call); the observation is the next user turn; done ends it
                    reward() -> float | None      optional; the built-in reward `environment`
  tools (TRL's):    reset(**columns) -> str | None
                                                  the row's columns as keyword arguments (the routing column left
                                                  out); its text is appended to the last user message, so with no
                                                  dataset prompt it is the prompt
                    public methods                tools the model calls (type hints and a docstring describe them);
                                                  a turn with no call ends the episode
                    get_reward() -> float | None  optional; the built-in reward `environment`

`rollout.environment` names one class, or maps the values of a row's `rollout.environment_column` to classes
(TRL's `environment_factory` dict): each row gets its own class's instance and only its tools.

Calls run in this process; with `rollout.environment_timeout_s` each instance lives in a child process
(children.py) that is killed when a call overruns. A call that raises or times out ends its episode (a tool method
that raises is answered with the error instead, as a tool is): the failure is counted (environment/errors,
environment/timeouts) and the first of each kind is printed, as for rewards. Importing this module must not import
torch.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo_cli.agents.openenv import PREFIX, action_tool, is_openenv
from grpo_cli.errors import EnvironmentUnavailable
from grpo_cli.usercode import objects
from grpo_cli.usercode.children import become_subreaper, kill_tree, mp_context, user_error_text

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

RESERVED = ("reset", "get_reward")  # a tools-contract class's methods that are not tools (TRL's rule)


# ---------------------------------------------------------------- naming and checking


def resolve_environment(name: str) -> type:
    cls = objects.resolve_object(name, kind="environment", what="class")
    if not inspect.isclass(cls):
        raise ValueError(f"environment {name!r} is a {type(cls).__name__}, not a class: name the class whose "
                         "instances run one episode each (reset, step, reward)")
    return cls


@dataclass(frozen=True)
class EnvSpec:
    """One environment class of a recipe and how an episode talks to it."""

    route: str | None  # the routing column's value that selects it; None: the recipe's only environment
    name: str  # path/to/env.py:Class or module:Class
    kwargs: dict[str, Any]
    api: str  # "turns" or "tools" (module docstring)
    tools: tuple[str, ...] = ()  # tools contract: the methods the model may call
    schemas: tuple[dict, ...] = ()  # and their JSON schemas, as the chat template gets them
    done_method: str | None = None  # asked after a turn's calls: True ends the episode (an OpenEnv step's done)
    reset_names: frozenset[str] | None = None  # tools contract: the columns a reset without **kwargs names

    @property
    def reward_method(self) -> str:
        return "get_reward" if self.api == "tools" else "reward"

    def reset_args(self, row: dict[str, Any], column: str) -> tuple[tuple, dict]:
        """reset's (args, kwargs) for a row: the row itself (turns), or its columns as keywords (tools), without the
        routing column; a reset without **kwargs gets only the columns it names."""
        if self.api == "turns":
            return (row,), {}
        columns = {k: v for k, v in row.items() if not (self.route is not None and k == column)}
        if self.reset_names is not None:
            columns = {k: v for k, v in columns.items() if k in self.reset_names}
        return (), columns


def _reset_names(cls: type) -> frozenset[str] | None:
    """The parameters of a reset without **kwargs (read once, when the spec is made); None: it takes any column."""
    try:
        params = list(inspect.signature(getattr(cls, "reset")).parameters.values())[1:]  # without self
    except (TypeError, ValueError, AttributeError):
        return None
    return None if any(p.kind is p.VAR_KEYWORD for p in params) else frozenset(p.name for p in params)


def contract(cls: type, asked: str = "auto") -> str:
    """`turns` or `tools` (module docstring): what the recipe asked, or by the class's methods."""
    if asked != "auto":
        return asked
    return "tools" if callable(getattr(cls, "get_reward", None)) or not callable(getattr(cls, "step", None)) \
        else "turns"


def tool_methods(cls: type) -> list[str]:
    """A tools-contract class's tools: its public functions, reset and get_reward aside (TRL's rule)."""
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not n.startswith("_") and n not in RESERVED]


def method_schema(cls: type, method: str) -> dict:
    """The JSON schema of a method as a tool (self left out; a staticmethod as it is)."""
    from transformers.utils import get_json_schema

    fn = getattr(cls, method)
    if isinstance(inspect.getattr_static(cls, method), staticmethod):
        return get_json_schema(fn)
    return get_json_schema(types.MethodType(fn, object()))


def environment_specs(ro) -> dict[str | None, EnvSpec]:
    """rollout.environment -> {route: spec} ({None: spec} for one class); ValueError naming the field when a class
    is missing, lacks a method its contract calls, cannot take its kwargs, or has a method no schema describes."""
    if ro.environment is None:
        return {}
    named = ro.environment if isinstance(ro.environment, dict) else {None: ro.environment}
    out = {}
    for route, name in named.items():
        field = "rollout.environment" + ("" if route is None else f".{route}")
        kwargs = ro.environment_kwargs if route is None else ro.environment_kwargs.get(route, {})
        if is_openenv(name):  # a server: its action is the tool (agents/openenv.py)
            url = name.removeprefix(PREFIX)
            try:
                tool = action_tool(url)
            except ValueError as e:
                raise ValueError(f"{field}: {e}") from None
            tool_name = tool["function"]["name"]
            out[route] = EnvSpec(route, "grpo_cli.agents.openenv:OpenEnvEnvironment",
                                 {"base_url": url, "tool": tool_name, **kwargs}, "tools", (tool_name,), (tool,),
                                 done_method="is_done")
            if ro.max_turns < 2:
                raise ValueError(f"rollout.max_turns ({ro.max_turns}): the OpenEnv server's action is a tool, and a "
                                 "tool's answer comes in the next turn: set rollout.max_turns >= 2")
            continue
        try:
            cls = resolve_environment(name)
        except ValueError as e:
            raise ValueError(f"{field}: {e}") from None
        api = contract(cls, ro.environment_api)
        tools = tuple(tool_methods(cls)) if api == "tools" else ()
        schemas = []
        for method in tools:
            try:
                schemas.append(method_schema(cls, method))
            except Exception as e:  # noqa: BLE001 - transformers' TypeHintParsingException, DocstringParsingException
                raise ValueError(f"{field}: {cls.__name__}.{method} is a public method, so a tool (TRL's contract), "
                                 f"and cannot be described to the model ({type(e).__name__}: {e}); give it type "
                                 "hints and a docstring with an Args: section, or start its name with _") from None
        out[route] = EnvSpec(route, name, dict(kwargs), api, tools, tuple(schemas),
                             reset_names=_reset_names(cls) if api == "tools" else None)
        _check_class(cls, out[route], field, ro)
    return out


def _check_class(cls: type, spec: EnvSpec, field: str, ro) -> None:
    name = spec.name
    if spec.api == "turns":
        step = getattr(cls, "step", None)
        if not callable(step):
            raise ValueError(f"{field}: {name} has no method step(completion_text) -> (observation, done)")
        try:
            inspect.signature(step).bind(None, "text")  # self, completion_text
        except TypeError:
            raise ValueError(f"{field}: {name}.step must take one argument, the assistant turn's text "
                             f"(it is {cls.__name__}.step{inspect.signature(step)})") from None
        except ValueError:
            pass  # no signature to read (a builtin): called as it is
    else:
        if not spec.tools and not ro.tools:
            raise ValueError(f"{field}: {name} has no method step(completion_text) -> (observation, done) (grpo's "
                             "contract) and no public method the model could call as a tool (TRL's): nothing "
                             "answers the model")
        if ro.max_turns < 2:
            raise ValueError(f"rollout.max_turns ({ro.max_turns}): {name}'s methods are tools (TRL's contract), and "
                             "a tool's answer comes in the next turn: set rollout.max_turns >= 2")
    for method in ("reset", spec.reward_method):
        if hasattr(cls, method) and not callable(getattr(cls, method)):
            raise ValueError(f"{field}: {name}.{method} is not a method")
    kwargs_field = "rollout.environment_kwargs" + ("" if spec.route is None else f".{spec.route}")
    try:
        inspect.signature(cls).bind(**spec.kwargs)
    except TypeError as e:
        raise ValueError(f"{kwargs_field}: {cls.__name__}{inspect.signature(cls)} does not take "
                         f"{spec.kwargs}: {e}") from None


def check_environment(ro, *, needs_reward: bool) -> dict[str | None, EnvSpec]:
    """environment_specs, and with the `environment` reward every class has its reward method."""
    specs = environment_specs(ro)
    rewarding = [s for s in specs.values() if callable(getattr(resolve_environment(s.name), s.reward_method, None))]
    if needs_reward and specs and not rewarding:  # routed: the rows of a class without one get None, as in TRL
        spec = next(iter(specs.values()))
        what = f"{spec.name} has no method" if len(specs) == 1 else "none of its classes has a method"
        raise ValueError(f"rollout.environment: the recipe uses the reward `environment`, but {what} "
                         f"{' or '.join(sorted({s.reward_method for s in specs.values()}))}() -> float | None")
    return specs


# ---------------------------------------------------------------- calling


class EnvFailure(Exception):
    """A call that raised (`kind` error), overran its time (`kind` timeout), or found the environment unable to run
    at all (`kind` unavailable: EnvironmentUnavailable, which stops the run); `text` says which and where."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind, self.text = kind, text


class LocalEnv:
    """An environment instance in this process."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.env = None
        try:
            self.env = resolve_environment(name)(**kwargs)
        except Exception as e:  # noqa: BLE001 - user code
            self.failure = EnvFailure("error", f"constructing it raised {user_error_text(e)}")
        else:
            self.failure = None

    def send(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._pending = (method, args, kwargs)

    def receive(self, deadline: float) -> Any:
        if self.failure is not None:
            raise self.failure
        method, args, kwargs = self._pending
        fn = getattr(self.env, method, None)
        if fn is None:  # reset and reward are optional
            return None
        try:
            return fn(*args, **kwargs)
        except EnvironmentUnavailable as e:  # the run stops (the episode runner raises it again)
            raise EnvFailure("unavailable", str(e)) from None
        except Exception as e:  # noqa: BLE001 - user code
            raise EnvFailure("error", f"{method} raised {user_error_text(e)}") from None

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - user code, nothing left to do
                pass


def _env_main(name: str, kwargs: dict[str, Any], conn: Connection) -> None:
    """Child process: construct the environment, then answer (method, args) requests until ("close",)."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # own process group: a timeout kills whatever the environment started too
    become_subreaper()
    env = LocalEnv(name, kwargs)
    while True:
        try:
            method, args, kwargs = conn.recv()
        except EOFError:
            break
        if method == "close":
            env.close()
            break
        env.send(method, *args, **kwargs)
        try:
            conn.send(("ok", env.receive(0.0)))
        except EnvFailure as e:
            conn.send(("unavailable" if e.kind == "unavailable" else "error", e.text))
        except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
            conn.send(("error", f"{method}: its result could not be sent back ({user_error_text(e)})"))
    conn.close()


class ChildEnv:
    """An environment instance in a child process, each call under `timeout_s`."""

    def __init__(self, name: str, kwargs: dict[str, Any], timeout_s: float) -> None:
        ctx = mp_context()
        self.conn, child = ctx.Pipe(duplex=True)
        # not a daemon: an environment may start processes of its own. It ends with the episode (close), or when the
        # trainer is gone (its pipe closes: recv raises EOFError)
        self.proc = ctx.Process(target=_env_main, args=(objects.portable(name), kwargs, child), name="environment")
        self.proc.start()
        child.close()
        self.timeout_s, self.dead, self._method = timeout_s, False, ""

    def send(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._method = method
        if not self.dead:
            try:
                self.conn.send((method, args, kwargs))
            except (BrokenPipeError, OSError):
                self.dead = True

    def receive(self, deadline: float) -> Any:
        if self.dead:
            raise EnvFailure("error", f"{self._method}: its process is gone")
        if not self.conn.poll(max(0.0, deadline - time.monotonic())):
            self.dead = True  # hung: killed at once, not asked to close
            kill_tree(self.proc)
            raise EnvFailure("timeout", f"{self._method} did not return within rollout.environment_timeout_s "
                                        f"({self.timeout_s:g} s); its process was killed")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.close()
            raise EnvFailure("error", f"{self._method}: its process exited ({self.proc.exitcode})") from None
        if status in ("error", "unavailable"):
            raise EnvFailure(status, value)
        return value

    def close(self) -> None:
        if not self.dead and self.proc.is_alive():
            try:
                self.conn.send(("close", (), {}))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(1)
        self.dead = True
        if self.proc.is_alive():
            kill_tree(self.proc)
        self.proc.join()
        self.conn.close()


def open_environments(specs: list[EnvSpec], timeout_s: float | None) -> list:
    """An instance of each spec's class (one per episode): in a child process with `timeout_s`, else here."""
    return [ChildEnv(s.name, s.kwargs, timeout_s) if timeout_s else LocalEnv(s.name, s.kwargs) for s in specs]


def call_all(envs: list, method: str | list[str], args: list[tuple], timeout_s: float | None,
             kwargs: list[dict] | None = None) -> list[Any]:
    """`method(*args[i], **kwargs[i])` (or `method[i]`) on every `envs[i]`, children concurrently under one deadline
    -> each result, or the EnvFailure it raised."""
    methods = [method] * len(envs) if isinstance(method, str) else method
    for env, m, a, k in zip(envs, methods, args, kwargs or [{}] * len(envs), strict=True):
        env.send(m, *a, **k)
    deadline = time.monotonic() + (timeout_s or 0.0)
    out: list[Any] = []
    for env in envs:
        try:
            out.append(env.receive(deadline))
        except EnvFailure as e:
            out.append(e)
    return out
