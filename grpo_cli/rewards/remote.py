"""Rewards over HTTP: the transport a judge and a remote reward function share, and the remote reward itself.

A reward named by a URL (`http://host:port/path`, `https://...`) is a function on another machine or in another
language (OpenRLHF's `--remote_rm_url`, slime's `--rm-url`): each scoring call POSTs one JSON object holding what a
Python reward receives (`prompts`, `completions`, `completion_ids`, every dataset column, the reward's `kwargs`) and
reads back a JSON list of N numbers or nulls, or `{"rewards": [...]}`. The reward's `timeout_s` bounds each request
(default 60 s; no child process); `$GRPO_REWARD_API_KEY`, when set, is sent as `Authorization: Bearer ...`.

Requests (`JsonEndpoint.post`): a refused connection, a timeout, HTTP 429 and 5xx are retried with exponential backoff
(0.5 s, 1 s, 2 s ... at most 8 s); any other answer is final. A key is only ever put in the request's header: every
error text has it replaced by `***`, so no log, exception or saved file carries it.

Importing this module must not import torch.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from grpo_cli.rewards.outcomes import RowsFailed

API_KEY_ENV = "GRPO_REWARD_API_KEY"
_RETRIED = {408, 429, 500, 502, 503, 504}


class RequestFailed(Exception):
    """A request that got no usable answer after its retries; the message names the URL and what came back."""


class JsonEndpoint:
    """POST JSON to one URL with a timeout, retries and a bearer key read from an environment variable."""

    def __init__(self, url: str, *, api_key_env: str | None = None, timeout_s: float = 60.0, retries: int = 2) -> None:
        self.url, self.api_key_env, self.timeout_s, self.retries = url.rstrip("/"), api_key_env, timeout_s, retries
        self.counts = {"requests": 0, "retries": 0}

    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None

    def _redacted(self, text: str) -> str:
        key = self._key()
        return text.replace(key, "***") if key else text

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer of POST url + path; RequestFailed once retries are spent or the answer is final."""
        url = self.url + path
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if key := self._key():
            headers["Authorization"] = f"Bearer {key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.counts["retries"] += 1
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            self.counts["requests"] += 1
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                            timeout=self.timeout_s) as r:
                    raw = r.read()
            except urllib.error.HTTPError as e:
                text = e.read()[:300].decode(errors="replace")
                last = f"HTTP {e.code} {e.reason}: {text}"
                if e.code in _RETRIED:
                    continue
                break
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = f"no answer within {self.timeout_s:g} s" if isinstance(reason, (socket.timeout, TimeoutError)) \
                    else f"{type(reason).__name__}: {reason}"
                continue
            try:
                return json.loads(raw)
            except ValueError:
                last = f"the answer is not JSON: {raw[:200].decode(errors='replace')!r}"
                break
        tries = f"after {attempt + 1} attempt{'s' * bool(attempt)}"
        raise RequestFailed(self._redacted(f"POST {url}: {last} ({tries})"))


class RemoteReward:
    """A reward function behind a URL: one POST per scoring call with the call's arguments as JSON."""

    def __init__(self, url: str, timeout_s: float | None = None) -> None:
        self.endpoint = JsonEndpoint(url, api_key_env=API_KEY_ENV, timeout_s=timeout_s or 60.0)

    def __call__(self, **kwargs: Any) -> list[float | None]:
        n = len(kwargs["completions"])
        try:
            answer = self.endpoint.post("", kwargs)
        except RequestFailed as e:
            raise RowsFailed([None] * n, n, str(e)) from None
        values = answer.get("rewards") if isinstance(answer, dict) else answer
        if values is None:
            raise RowsFailed([None] * n, n, f"the answer of {self.endpoint.url} has no \"rewards\": {str(answer)[:200]}")
        return values

