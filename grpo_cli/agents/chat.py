"""OpenAI's chat messages as the agent endpoint (agents/endpoint.py) reads and answers them: a request's messages and
tools checked and normalised (the form histories are compared in), and a sampled turn as an assistant message with
OpenAI's tool calls. Importing this module must not import torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass
class ChatRequest:
    messages: list[dict]  # normalised (see `normal`)
    tools: list[dict] | None
    max_tokens: int | None  # max_completion_tokens or max_tokens: this turn's cap
    stream: bool  # answer as server-sent events (`stream_events`)
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def parse_request(body: bytes) -> ChatRequest:
    """A chat completions body -> the request; RequestError 400 naming what is wrong."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise RequestError(400, "the body is a JSON object")
    if req.get("n", 1) != 1:
        raise RequestError(400, "n: one choice per request (each request is one turn of one episode)")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: a non-empty list of messages is required")
    tools = req.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError(400, "tools: a list of tool objects ({\"type\": \"function\", \"function\": {...}})")
    cap = req.get("max_completion_tokens", req.get("max_tokens"))
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise RequestError(400, "max_tokens: a positive integer")
    options = req.get("stream_options") or {}
    return ChatRequest([normal(m, f"messages.{i}") for i, m in enumerate(messages)], tools or None, cap,
                       bool(req.get("stream")), bool(isinstance(options, dict) and options.get("include_usage")))


def stream_events(completion: dict, include_usage: bool) -> bytes:
    """A chat completion as OpenAI's server-sent events: the whole turn in one delta (it is sampled whole), then
    the finish reason, the usage where asked, and [DONE]."""
    head = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = completion["choices"][0]
    delta = dict(choice["message"])
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(delta["tool_calls"])]
    chunks = [head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append(head | {"choices": [], "usage": completion["usage"]})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


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
