"""The HTTP a trainer speaks to `grpo serve-vllm` (grpo_cli/rollout/vllm_server.py's transport), with the stdlib's
urllib only: every request with a timeout and the server's bearer token, retried with backoff where that is safe,
watched by the stall watchdog, and its failures said for people.

Retries, with exponential backoff and never past the request's own timeout in total: an idempotent request on
connection errors and timeouts; any request only when the connection was refused (it never reached the server). The
token is $GRPO_SERVER_TOKEN, or the file a loopback server wrote for its port (serve/auth.py), read again after a 401
(a restarted server made a new one). While a request runs, the server's /health `activity` (engine steps and
weight loads) is progress for the watchdog, and an upload's every block read.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

from grpo_cli.errors import VLLMServerError
from grpo_cli.process.watchdog import phase, progress_of, tick
from grpo_cli.serve.auth import TOKEN_ENV, client_token

HEALTH_TIMEOUT_S = 5.0
MAX_RETRIES = 4


class _NotSent(Exception):
    """The connection was refused: the request never reached the server (safe to retry anything)."""


class ServerHTTP:
    """Requests to the server at `url`; `timeout`: rollout.vllm.request_timeout_s (settable); `model_hint`: the
    model named in the advice to start a server."""

    def __init__(self, url: str, timeout: float, model_hint: str) -> None:
        self.url, self.timeout, self.model_hint = url.rstrip("/"), timeout, model_hint
        self.token: str | None = None
        self.token_source = ""
        self.read_token()

    def read_token(self) -> bool:
        """The token this trainer sends ($GRPO_SERVER_TOKEN, else a loopback server's file); -> whether it changed."""
        where = urlparse(self.url)
        token, self.token_source = client_token(where.hostname or "", where.port or 80)
        changed, self.token = token is not None and token != self.token, token
        return changed

    @property
    def short_timeout(self) -> float:
        """For questions the server answers at once (/health, /info): HEALTH_TIMEOUT_S, or less if the requests' is."""
        return min(HEALTH_TIMEOUT_S, self.timeout)

    def request(self, method: str, route: str, *, doing: str, payload: dict | None = None,
                timeout: float | None = None, idempotent: bool = True) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        return self._send(method, route, data, headers, doing, timeout or self.timeout, idempotent)

    def upload(self, path: str, version: int, route: str = "/update_weights") -> dict:
        size = os.path.getsize(path)
        headers = {"Content-Type": "application/octet-stream", "X-Weight-Version": str(version),
                   "Content-Length": str(size)}
        return self._send("POST", route, lambda: _TickingReader(open(path, "rb")), headers,
                          "uploading the weights", self.timeout, True)

    def _send(self, method, route, data, headers, doing, timeout, idempotent) -> dict:
        """One request, retried with backoff 0.25, 0.5, 1, ... s while the total stays within `timeout`."""
        start, delay = time.monotonic(), 0.25
        for attempt in range(MAX_RETRIES + 1):
            try:
                # the watchdog names a server that went quiet; one still sampling or loading shows its activity
                with phase(f"server request {method} {route} at {self.url} ({doing})"), \
                        progress_of(self._activity) if route != "/health" else contextlib.nullcontext():
                    return self._once(method, route, data, headers, timeout, doing)
            except (_NotSent, TimeoutError, ConnectionError, urllib.error.URLError, OSError) as e:
                retry = idempotent or isinstance(e, _NotSent)
                if not retry or attempt == MAX_RETRIES or time.monotonic() - start + delay > timeout:
                    raise self._unreachable(doing, e, timeout) from None
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _activity(self) -> int | None:
        """The server's count of engine steps and weight loads (GET /health answers while a request runs)."""
        with urllib.request.urlopen(self.url + "/health", timeout=HEALTH_TIMEOUT_S) as resp:
            return json.loads(resp.read()).get("activity")

    def _once(self, method, route, data, headers, timeout, doing) -> dict:
        body = data() if callable(data) else data  # a file is reopened on each attempt
        req = urllib.request.Request(self.url + route, data=body, method=method, headers=dict(headers))
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            # a server (re)started since: its token file is new ($GRPO_SERVER_TOKEN's is fixed)
            if e.code == 401 and not os.environ.get(TOKEN_ENV) and self.read_token():
                return self._once(method, route, data, headers, timeout, doing)
            raise self._refused(doing, e) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                raise _NotSent(str(e.reason)) from e
            raise
        finally:
            if hasattr(body, "close"):
                body.close()

    # ------------------------------------------------------------ messages for people

    def _unreachable(self, doing: str, e: Exception, timeout: float) -> VLLMServerError:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, (TimeoutError, socket.timeout)):
            why = f"timed out after {timeout:g} s"
        elif isinstance(e, _NotSent):
            why = "connection refused"
        else:
            why = f"{type(reason).__name__}: {reason}"
        return VLLMServerError(
            f"could not reach grpo serve-vllm at {self.url} while {doing} ({why}); is it running? "
            f"start it with: grpo serve-vllm --model {self.model_hint}"
        )

    def _refused(self, doing: str, e: urllib.error.HTTPError) -> VLLMServerError:
        try:
            detail = json.loads(e.read()).get("detail", "")
        except (ValueError, AttributeError, OSError):
            detail = ""
        hint = {
            401: f"; the trainer's token: {self.token_source}. Set {TOKEN_ENV} in the trainer's environment to the "
                 "server's (a server on this machine without it writes its own token to a file that a trainer run by "
                 "the same user reads)",
            409: "; the trainer and the server disagree on the weight version (was the server restarted or "
                 "shared with another run?)",
            503: "; its vLLM engine died and the server exits: restart it (a supervisor does) and resume with "
                 "--resume auto",
        }.get(e.code, "")
        return VLLMServerError(f"grpo serve-vllm at {self.url} refused a request while {doing} "
                               f"(HTTP {e.code}: {detail or e.reason}){hint}", status=e.code)


class _TickingReader:
    """A weight file as an upload body: each block http.client reads is progress for the watchdog."""

    def __init__(self, f) -> None:
        self.f = f

    def read(self, n: int = -1) -> bytes:
        tick()
        return self.f.read(n)

    def close(self) -> None:
        self.f.close()
