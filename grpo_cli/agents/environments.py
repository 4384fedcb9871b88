"""Environments of multi-turn episodes (`rollout.environment`): naming, checking, calling, and the tokens of
what they say.

Protocol: a class, one instance per rollout, constructed with `rollout.environment_kwargs`:

  reset(row) -> str | None          optional; `row`: the dataset row's columns. Text for the first user turn,
                                    appended to the prompt's last user message
  step(completion_text) -> (observation: str | None, done: bool)
                                    after every assistant turn that ended with EOS; the observation becomes the
                                    next user turn; done (or None for the observation) ends the episode
  reward() -> float | None          optional; the built-in reward `environment`

Calls run in this process; with `rollout.environment_timeout_s` each instance lives in a child process
(children.py) that is killed when a call overruns. A call that raises or times out ends its episode: the failure
is counted (environment/errors, environment/timeouts) and the first of each kind is printed, as for rewards.

Observation tokens are the chat template's own rendering of a user (or tool) message after an assistant turn,
tokenized once: what the template puts after the assistant's end-of-turn token, the message, and the next
assistant header. Nothing sampled is decoded and re-encoded. Importing this module must not import torch.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

from grpo_cli.usercode import objects
from grpo_cli.usercode.children import become_subreaper, kill_tree, mp_context

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- naming and checking


def resolve_environment(name: str) -> type:
    cls = objects.resolve_object(name, kind="environment", what="class")
    if not inspect.isclass(cls):
        raise ValueError(f"environment {name!r} is a {type(cls).__name__}, not a class: name the class whose "
                         "instances run one episode each (reset, step, reward)")
    return cls


def check_environment(name: str, kwargs: dict[str, Any], *, needs_reward: bool) -> None:
    """ValueError starting with the field (`rollout.environment: ...`, `rollout.environment_kwargs: ...`) unless
    `name` is a class with a callable `step(text)`, callable `reset`/`reward` where present (`reward` where the
    recipe uses the `environment` reward), and a constructor that takes `kwargs`."""
    try:
        cls = resolve_environment(name)
    except ValueError as e:
        raise ValueError(f"rollout.environment: {e}") from None
    step = getattr(cls, "step", None)
    if not callable(step):
        raise ValueError(f"rollout.environment: {name} has no method step(completion_text) -> (observation, done)")
    try:
        inspect.signature(step).bind(None, "text")  # self, completion_text
    except TypeError:
        raise ValueError(f"rollout.environment: {name}.step must take one argument, the assistant turn's text "
                         f"(it is {cls.__name__}.step{inspect.signature(step)})") from None
    except ValueError:
        pass  # no signature to read (a builtin): called as it is
    for method in ("reset", "reward"):
        if hasattr(cls, method) and not callable(getattr(cls, method)):
            raise ValueError(f"rollout.environment: {name}.{method} is not a method")
    if needs_reward and not callable(getattr(cls, "reward", None)):
        raise ValueError(f"rollout.environment: the recipe uses the reward `environment`, but {name} has no method "
                         "reward() -> float | None")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"rollout.environment_kwargs: {cls.__name__}{inspect.signature(cls)} does not take "
                         f"{kwargs}: {e}") from None


# ---------------------------------------------------------------- calling


class EnvFailure(Exception):
    """A call that raised (`kind` error) or overran its time (`kind` timeout); `text` says which and where."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind, self.text = kind, text


def _describe(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "grpo_cli" not in f.filename]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


class LocalEnv:
    """An environment instance in this process."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.env = None
        try:
            self.env = resolve_environment(name)(**kwargs)
        except Exception as e:  # noqa: BLE001 - user code
            self.failure = EnvFailure("error", f"constructing it raised {_describe(e)}")
        else:
            self.failure = None

    def send(self, method: str, *args: Any) -> None:
        self._pending = (method, args)

    def receive(self, deadline: float) -> Any:
        if self.failure is not None:
            raise self.failure
        method, args = self._pending
        fn = getattr(self.env, method, None)
        if fn is None:  # reset and reward are optional
            return None
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - user code
            raise EnvFailure("error", f"{method} raised {_describe(e)}") from None

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
            method, args = conn.recv()
        except EOFError:
            break
        if method == "close":
            env.close()
            break
        env.send(method, *args)
        try:
            conn.send(("ok", env.receive(0.0)))
        except EnvFailure as e:
            conn.send(("error", e.text))
        except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
            conn.send(("error", f"{method}: its result could not be sent back ({_describe(e)})"))
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

    def send(self, method: str, *args: Any) -> None:
        self._method = method
        if not self.dead:
            try:
                self.conn.send((method, args))
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
        if status == "error":
            raise EnvFailure("error", value)
        return value

    def close(self) -> None:
        if not self.dead and self.proc.is_alive():
            try:
                self.conn.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(1)
        self.dead = True
        if self.proc.is_alive():
            kill_tree(self.proc)
        self.proc.join()
        self.conn.close()


def open_environments(name: str, kwargs: dict[str, Any], n: int, timeout_s: float | None) -> list:
    return [ChildEnv(name, kwargs, timeout_s) if timeout_s else LocalEnv(name, kwargs) for _ in range(n)]


def call_all(envs: list, method: str, args: list[tuple], timeout_s: float | None) -> list[Any]:
    """`method(*args[i])` on every `envs[i]`, children concurrently under one deadline -> each result, or the
    EnvFailure it raised."""
    for env, a in zip(envs, args, strict=True):
        env.send(method, *a)
    deadline = time.monotonic() + (timeout_s or 0.0)
    out: list[Any] = []
    for env in envs:
        try:
            out.append(env.receive(deadline))
        except EnvFailure as e:
            out.append(e)
    return out


# ---------------------------------------------------------------- what they say, as tokens


SENTINEL = "grpo-sentinel-2f9c1a"


class Observations:
    """Token ids of an environment's message after an assistant turn, as the chat template renders it."""

    def __init__(self, tokenizer: Any, template_kwargs: dict | None = None) -> None:
        self.tok, self.kwargs = tokenizer, dict(template_kwargs or {})  # data.chat_template_kwargs
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL}]
        self.base = base
        self.before = tokenizer.apply_chat_template(base, tokenize=False, **self.kwargs)
        at = self.before.rfind(SENTINEL)
        if at < 0:
            raise ValueError("the chat template drops assistant messages' text: observations cannot be placed")
        self.after_assistant = self.before[at + len(SENTINEL):]  # e.g. "<|im_end|>\n"

    def text(self, messages: list[dict], last_token: int) -> str:
        """What follows the assistant turn that ended with `last_token`: the rest of its end of turn, then the
        messages (an environment's user message, or a turn's tool answers) and the next assistant header."""
        full = self.tok.apply_chat_template(self.base + messages, tokenize=False, add_generation_prompt=True,
                                            **self.kwargs)
        if not full.startswith(self.before):
            raise ValueError("the chat template renders earlier turns differently once a message follows: "
                             "observation tokens cannot be appended")
        end = self.tok.decode([last_token])
        tail = self.after_assistant
        tail = tail[len(end):] if end and tail.startswith(end) else tail  # the sampled EOS is that end of turn
        return tail + full[len(self.before):]

    def ids(self, messages: list[dict], last_token: int) -> list[int]:
        return self.tok(self.text(messages, last_token), add_special_tokens=False)["input_ids"]
