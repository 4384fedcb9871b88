"""OpenAI's chat messages as the agent endpoint (agents/endpoint.py) reads and answers them: a request's messages and
tools checked and normalised (the form histories are compared in), and a sampled turn as an assistant message with
OpenAI's tool calls. Importing this module must not import torch."""

from __future__ import annotations

import json
from typing import Any

from grpo_cli.agents.tools import CALL, parse_calls
from grpo_cli.errors import RequestError

ROLES = ("system", "user", "assistant", "tool")


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                        "are served")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"{where}.content must be a string or a list of text parts")


def _calls(message: dict, where: str) -> list[tuple[str, Any]]:
    out = []
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RequestError(400, f"{where}.tool_calls must be a list")
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(400, f"{where}.tool_calls.{k}: a call is {{\"type\": \"function\", \"function\": "
                                    "{\"name\": ..., \"arguments\": ...}}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass
        out.append((fn["name"], args))
    return out


def normal(message: Any, where: str) -> dict:
    """A message as the history is compared and rendered: role, text content, and an assistant's calls."""
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise RequestError(400, f"{where}: a message is an object with a role ({', '.join(ROLES)}) and content")
    out = {"role": message["role"], "content": _text(message.get("content"), where)}
    calls = _calls(message, where) if message["role"] == "assistant" else []
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return out


def parse_request(body: bytes) -> tuple[list[dict], list[dict] | None]:
    """A chat completions body -> its normalised messages and tools; RequestError 400 naming what is wrong."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise RequestError(400, "the body is a JSON object")
    if req.get("stream"):
        raise RequestError(400, "stream: streamed answers are not served; ask without stream")
    if req.get("n", 1) != 1:
        raise RequestError(400, "n: one choice per request (each request is one turn of one episode)")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: a non-empty list of messages is required")
    tools = req.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError(400, "tools: a list of tool objects ({\"type\": \"function\", \"function\": {...}})")
    return [normal(m, f"messages.{i}") for i, m in enumerate(messages)], tools or None


def answer_message(text: str, raw: str) -> dict:
    """The assistant message of a sampled turn: its text without the call blocks, and its calls in OpenAI's form."""
    calls = [c for c in parse_calls(raw) if c.name is not None and c.error is None]
    content = CALL.sub("", text).strip() if calls else text
    return {"role": "assistant", "content": content,
            **({"tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in calls]} if calls else {})}


def template_message(m: dict) -> dict:
    """A normalised message as chat templates take it (calls' arguments as objects)."""
    return {k: v for k, v in m.items() if k in ("role", "content", "tool_calls")}
