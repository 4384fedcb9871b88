"""An OpenAI-compatible chat endpoint in front of the sampler (`rollout.agent`): agent programs that own their tool
loop talk to the policy through the `openai` client, and every turn they get is recorded, token for token.

Routes, on 127.0.0.1 only, each behind `Authorization: Bearer <token>` (what the openai client sends its api_key as):
  POST /sessions/<id>/v1/chat/completions   OpenAI's chat completions: messages, tools, max_tokens; n = 1; with
                                            `stream` the turn comes back as server-sent events (sampled whole)
  GET  /sessions/<id>/v1/models             the served model, for clients that ask first

A session is one episode. Its first request's messages are rendered by the chat template (with its `tools`) into the
prompt's token ids. Every later request must extend the conversation served so far (the earlier messages as sent,
the assistant messages as answered); its new messages (tool results, user turns) are rendered as the template
renders them after an assistant turn and appended as observation tokens (agents/observations.py). Sampled tokens
are never decoded and encoded again: the episode is the exact sequence the sampler continued, and its sampler
log-probs. A request that rewrites the history is answered (the program goes on) but not recorded: the episode ends
at its last recorded turn (truncated; agent/rewrites counts it).

Bounds: a body over `rollout.agent_max_body_bytes` gets 413, a missing or wrong token 401, an unknown or closed
session 404, malformed JSON or messages 400; once an episode has used `max_completion_length` sampled tokens, its
`max_episode_length`, or `max_turns` answers, a request is answered with no text and finish_reason "length".
Requests of all sessions are sampled together: one `Generator.sample` for those waiting at once, on one thread.
Importing this module must not import torch.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import queue
import re
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from grpo_cli.agents.observations import Observations, continued, history_notice, split_roles
from grpo_cli.agents.chat import ChatRequest, answer_message, parse_request, stream_events, template_message
from grpo_cli.data.prompts import render_messages
from grpo_cli.errors import RequestError

log = logging.getLogger(__name__)


@dataclass
class Session:
    """One episode's record: the prompt, then every token after it (sampled, or observed), as served."""

    id: str
    prompt: list[int] = field(default_factory=list)
    prompt_text: str = ""
    tokens: list[int] = field(default_factory=list)
    observed: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    segments: list[list] = field(default_factory=list)  # where it was split (agents/records.py's Episode)
    messages: list[dict] | None = None  # the conversation served so far, normalised (see `normal`)
    sampled: int = 0
    answers: int = 0
    truncated: bool = False  # a bound was reached, or a turn was cut, or the history was rewritten
    rewrites: int = 0
    tool_calls: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


# ---------------------------------------------------------------- sampling, batched


class Batcher:
    """Every waiting request sampled together (`Generator.sample`), so N programs cost one batched forward per token,
    not N. The requests arrive on the server's threads; the sampling runs where `pump` is called: the trainer's own
    thread (agents/programs.py), which owns the generator (a colocated vLLM engine, its thread settings, the policy).
    `wake` becomes readable when a request waits (multiprocessing.connection.wait takes it beside the programs)."""

    def __init__(self, generator: Any, expected: Callable[[], int], window_s: float = 0.05) -> None:
        self.generator, self.expected, self.window_s = generator, expected, window_s
        self.sampling: dict[str, Any] = {}
        self.logps_seen = False  # whether the generator reported the sampler's log-probs
        self.queue: queue.Queue = queue.Queue()
        self.wake, self._waker = multiprocessing.Pipe(duplex=False)
        self._lock = threading.Lock()

    def submit(self, ids: list[int], budget: int) -> Future:
        done: Future = Future()
        self.queue.put((ids, budget, done))
        with self._lock:
            self._waker.send_bytes(b"")
        return done

    def pump(self) -> None:
        """Sample the waiting requests: those queued, and more arriving within `window_s` while fewer than
        `expected()` wait."""
        while self.wake.poll():
            self.wake.recv_bytes()
        batch = []
        deadline = time.monotonic() + self.window_s
        while True:
            try:
                batch.append(self.queue.get_nowait())
                continue
            except queue.Empty:
                pass
            if not batch or len(batch) >= max(1, self.expected()) or time.monotonic() >= deadline:
                break
            if self.wake.poll(max(0.0, deadline - time.monotonic())):
                self.wake.recv_bytes()
        if not batch:
            return
        try:
            out = self.generator.sample([ids for ids, _, _ in batch], [b for _, b, _ in batch], logprobs=True,
                                        **self.sampling)
        except BaseException as e:  # noqa: BLE001 - every waiting request fails with it; the run sees it too
            for _, _, done in batch:
                done.set_exception(e)
            raise
        self.logps_seen = out.logps is not None
        for k, (_, _, done) in enumerate(batch):
            done.set_result((out.tokens[k], out.logps[k] if out.logps is not None else None, out.finished[k]))


# ---------------------------------------------------------------- the endpoint


class Endpoint:
    """The HTTP endpoint and its sessions (module docstring). `cfg`: the recipe's rollout section."""

    def __init__(self, tokenizer: Any, generator: Any, cfg: Any, data_cfg: Any, context_limit: int,
                 model_name: str = "policy") -> None:
        self.tok, self.cfg, self.data_cfg, self.context_limit = tokenizer, cfg, data_cfg, context_limit
        self.model_name, self.token = model_name, secrets.token_urlsafe(24)
        self.kwargs = dict(data_cfg.chat_template_kwargs)
        self.observations = Observations(tokenizer, data_cfg.chat_template_kwargs)
        self.splitting = split_roles(self.observations.changes_history, {"user", "tool"}, cfg.history_change)
        notice = history_notice(self.observations.changes_history, {"user", "tool"}, cfg.history_change)
        if notice:
            log.warning(notice)
        self.sessions: dict[str, Session] = {}
        self.running = 0  # programs that may still send a request (the batcher waits for them)
        self.batcher = Batcher(generator, lambda: self.running)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="grpo-agent-endpoint", daemon=True).start()

    def open(self) -> Session:
        s = Session(secrets.token_hex(8))
        self.sessions[s.id] = s
        return s

    def close_session(self, session: Session) -> Session:
        with session.lock:  # a request still being answered finishes first
            session.closed = True
        self.sessions.pop(session.id, None)
        return session

    def base_url(self, session: Session) -> str:
        return f"http://127.0.0.1:{self.port}/sessions/{session.id}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------ one request
    def chat(self, session: Session, request: ChatRequest) -> dict:
        messages, tools = request.messages, request.tools
        with session.lock:
            if session.closed:
                raise RequestError(404, "this episode is over")
            context, record = self._context(session, messages, tools)
            c = self.cfg
            room = min(c.max_completion_length - session.sampled, self.context_limit - len(context),
                       request.max_tokens or 2**31)
            if room <= 0 or session.answers >= c.max_turns:
                session.truncated = session.truncated or record
                return self._response(session, {"role": "assistant", "content": ""}, "length", len(context), 0)
            tokens, logps, finished = self.batcher.submit(context, room).result()
            text, raw = self.tok.decode(tokens, skip_special_tokens=True), self.tok.decode(tokens)
            message = answer_message(text, raw)
            if record:
                session.tokens += tokens
                session.observed += [0] * len(tokens)
                session.logps += logps if logps is not None else [0.0] * len(tokens)
                session.sampled += len(tokens)
                session.turns.append({"role": "assistant", "text": text, "tokens": tokens})
                session.messages = messages + [message]
                session.truncated = session.truncated or not finished
                session.tool_calls += len(message.get("tool_calls", []))
            session.answers += 1
            reason = "length" if not finished else ("tool_calls" if "tool_calls" in message else "stop")
            return self._response(session, message, reason, len(context), len(tokens))

    def _context(self, session: Session, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], bool]:
        """The token ids this request continues, and whether its turn is recorded (its history extends the one
        served); records the prompt (first request) or the new messages' observation tokens."""
        if session.messages is None:
            session.prompt_text = self._render(messages, tools)
            session.prompt = self.tok(session.prompt_text, add_special_tokens=False)["input_ids"]
            session.messages = messages
            return list(session.prompt), True
        served = session.messages
        if messages == served:
            raise RequestError(400, "messages: the conversation ends where it was answered; add a user or tool "
                                    "message to continue it")
        extends = len(messages) > len(served) and messages[: len(served)] == served
        if session.truncated or not extends:  # the recorded episode ended (a cut turn, a bound, a rewrite) or ends
            session.rewrites += not session.truncated  # here: this answer is served, not recorded
            session.truncated = True
            return self.tok(self._render(messages, tools), add_special_tokens=False)["input_ids"], False
        new = messages[len(served):]
        if session.messages[-1]["role"] != "assistant":  # the first request's answer is the last served message
            raise RequestError(400, "messages: extend the conversation after the assistant's answer")
        role = "tool" if all(m["role"] == "tool" for m in new) else "environment"
        text = "\n".join(m["content"] for m in new)
        session.messages = messages
        if any(m["role"] in self.splitting for m in new):  # the template changes the history: a new sample
            context = self.tok(self._render(messages, tools), add_special_tokens=False)["input_ids"]
            session.segments.append([len(session.tokens), context])
            session.turns.append({"role": role, "text": text, "tokens": [], "sample": len(session.segments)})
            return context, True
        ids = self.observations.ids([template_message(m) for m in new], session.tokens[-1])
        session.tokens += ids
        session.observed += [1] * len(ids)
        session.logps += [0.0] * len(ids)
        session.turns.append({"role": role, "text": text, "tokens": ids})
        return continued(session.prompt, session.tokens, session.segments), True

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        tools = [{"type": "function", "function": t.get("function", t)} for t in tools] if tools else None
        try:
            return render_messages([template_message(m) for m in messages], self.tok, self.kwargs, tools)
        except Exception as e:  # noqa: BLE001 - the template's own error (e.g. roles out of order)
            raise RequestError(400, f"messages: the chat template cannot render them ({type(e).__name__}: {e})") \
                from None

    def _response(self, session: Session, message: dict, reason: str, prompt_tokens: int, tokens: int) -> dict:
        out = dict(message)
        if "tool_calls" in out:
            out["tool_calls"] = [{"id": f"call_{session.id}_{session.answers}_{k}", "type": "function",
                                  "function": {"name": c["function"]["name"],
                                               "arguments": json.dumps(c["function"]["arguments"])}}
                                 for k, c in enumerate(out["tool_calls"])]
        return {"id": f"chatcmpl-{session.id}-{session.answers}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model_name,
                "choices": [{"index": 0, "message": out, "finish_reason": reason, "logprobs": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                          "total_tokens": prompt_tokens + tokens}}


SESSION_ROUTE = re.compile(r"^/sessions/([0-9a-f]+)/v1/(chat/completions|models)$")


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # the run's output is not an access log
            log.debug("agent endpoint: " + fmt, *args)

        def _send(self, status: int, payload: dict | bytes, kind: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the program is gone (killed at its timeout): nobody to answer
                self.close_connection = True

        def _route(self, method: str) -> None:
            try:
                session, what = self._session()
                if method == "GET" and what == "models":
                    self._send(200, {"object": "list", "data": [{"id": endpoint.model_name, "object": "model",
                                                                 "owned_by": "grpo"}]})
                elif method == "POST" and what == "chat/completions":
                    request = parse_request(self._body())
                    answer = endpoint.chat(session, request)
                    if request.stream:
                        self._send(200, stream_events(answer, request.include_usage), "text/event-stream")
                    else:
                        self._send(200, answer)
                else:
                    raise RequestError(405, f"{method} is not served on {self.path}")
            except RequestError as e:
                self.close_connection = e.status == 413  # the body was not read
                self._send(e.status, {"error": {"message": str(e), "type": "invalid_request_error",
                                                "code": e.status}})
            except Exception as e:  # noqa: BLE001 - a bug or a sampler failure: the program sees a 500, we log it
                log.warning("agent endpoint: %s: %s", type(e).__name__, e)
                self._send(500, {"error": {"message": f"the sampler failed: {type(e).__name__}", "code": 500}})

        def _session(self) -> tuple[Session, str]:
            if self.headers.get("Authorization", "") != f"Bearer {endpoint.token}":
                raise RequestError(401, "missing or wrong bearer token: use the api_key the program was given")
            match = SESSION_ROUTE.match(self.path.split("?")[0])
            if match is None:
                raise RequestError(404, f"no route {self.path}: /sessions/<id>/v1/chat/completions")
            session = endpoint.sessions.get(match.group(1))
            if session is None:
                raise RequestError(404, f"unknown session {match.group(1)!r}: it never was, or its episode is over")
            return session, match.group(2)

        def _body(self) -> bytes:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise RequestError(411, "a Content-Length is required")
            if int(length) > endpoint.cfg.agent_max_body_bytes:
                raise RequestError(413, f"the body declares {int(length):,} bytes; at most "
                                        f"{endpoint.cfg.agent_max_body_bytes:,} (rollout.agent_max_body_bytes)")
            return self.rfile.read(int(length))

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._route("POST")

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

    return Handler
