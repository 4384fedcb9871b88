"""Tools the model calls during an episode (`rollout.tools`): plain Python functions with type hints and a
docstring, named like rewards (`path/to/file.py:fn`, `module:fn`).

  * Described to the model by their JSON schema (transformers' `get_json_schema`), passed to the chat template
    as `tools=`; a template that ignores `tools` gets the same schemas in a system message of ours, with the
    call format below.
  * A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in an assistant turn (the Qwen2.5 /
    Hermes format); every call of a turn runs, each in a child process killed after `rollout.tool_timeout_s`.
  * What the function returns (str() of it), or what went wrong (malformed call, unknown tool, bad arguments,
    an exception, a timeout) is the tool's answer: a `tool` message, the next observation. Failures are counted
    (tools/failure_frequency), never raised.
Importing this module must not import torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from grpo_cli.usercode import children, objects
from grpo_cli.usercode.children import become_subreaper, send_error

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


# ---------------------------------------------------------------- naming, checking, describing


def resolve_tool(name: str) -> Callable[..., Any]:
    return objects.resolve_object(name, kind="tool", what="function")


def tool_schema(fn: Callable[..., Any]) -> dict:
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


def check_tools(names: list[str]) -> None:
    """ValueError starting with `rollout.tools.I:` unless every entry is a function with a schema (type hints on
    every argument, a docstring describing them) and the tools' names are distinct."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        try:
            fn = resolve_tool(name)
        except ValueError as e:
            raise ValueError(f"rollout.tools.{i}: {e}") from None
        try:
            schema = tool_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers' TypeHintParsingException, DocstringParsingException
            raise ValueError(f"rollout.tools.{i}: {name} cannot be described to the model ({type(e).__name__}: "
                             f"{e}); a tool needs type hints on every argument and a docstring with an Args: section"
                             ) from None
        tool = schema["function"]["name"]
        if tool in seen:
            raise ValueError(f"rollout.tools.{i}: a tool named {tool!r} is already rollout.tools.{seen[tool]}; "
                             "tool names must differ")
        seen[tool] = i


def schemas(names: list[str]) -> list[dict]:
    return [tool_schema(resolve_tool(n)) for n in names]


# ---------------------------------------------------------------- calls


@dataclass
class Call:
    name: str | None  # None: malformed, `error` says why
    arguments: dict[str, Any]
    error: str | None = None


def parse_calls(text: str) -> list[Call]:
    """Every `<tool_call>...</tool_call>` of an assistant turn, in order; malformed ones with their error."""
    calls = []
    for body in CALL.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(Call(None, {}, f"the tool call is not valid JSON ({e.msg} at character {e.pos})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(Call(None, {}, 'a tool call is a JSON object {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(Call(obj["name"], {}, "the tool call's arguments must be a JSON object"))
            continue
        calls.append(Call(obj["name"], args))
    return calls


def _tool_main(name: str, arguments: dict[str, Any], conn: Connection) -> None:
    """Child process: call the tool, send ("ok", str(result)) or ("error", text)."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    become_subreaper()
    try:
        conn.send(("ok", str(resolve_tool(name)(**arguments))))
    except BaseException as e:  # noqa: BLE001 - everything goes back as the tool's answer
        send_error(conn, e)
    finally:
        conn.close()


class ToolBox:
    """The recipe's tools by name; runs a turn's calls in children, concurrently, under one deadline."""

    def __init__(self, names: list[str], timeout_s: float) -> None:
        self.schemas = schemas(names)
        self.names = {s["function"]["name"]: objects.portable(n) for s, n in zip(self.schemas, names)}
        self.timeout_s = timeout_s

    def run(self, calls: list[Call]) -> list[tuple[str, bool]]:
        """-> each call's answer text and whether it succeeded."""
        started: list[children.Child | str] = []
        for c in calls:
            if c.error is not None:
                started.append(f"error: {c.error}")
            elif c.name not in self.names:
                started.append(f"error: there is no tool {c.name!r}; the tools are: {', '.join(self.names)}")
            else:  # not a daemon: a tool may start processes of its own
                started.append(children.start(_tool_main, (self.names[c.name], c.arguments), f"tool-{c.name}",
                                              self.timeout_s))
        out = []
        for item in started:  # all started first: one deadline for the turn's calls
            if isinstance(item, str):
                out.append((item, False))
                continue
            msg = children.answer(item)
            if msg[0] == "timeout":
                out.append((f"error: the tool did not answer within {self.timeout_s:g} s", False))
            elif msg[0] == "exited":
                out.append((f"error: the tool's process exited ({msg[1]})", False))
            else:
                out.append((msg[1], True) if msg[0] == "ok" else (f"error: {msg[1]}", False))
        return out
