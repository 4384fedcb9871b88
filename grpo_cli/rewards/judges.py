"""LLM-as-judge rewards over any OpenAI-compatible chat endpoint (vLLM's or sglang's server, OpenAI, a gateway): the
built-in reward `judge` (registered in builtin.py; its settings are its kwargs, checked by `judge_settings`).

mode pointwise (the generative reward model of verl and prime-rl's rubrics): one request per completion, holding
  the question, the reference answer when the data has one, the completion and the rubric; the reply must end with a
  line `Score: N`, N a number in [min_score, max_score], and the reward is (N - min_score) / (max_score - min_score).
mode group (ART's RULER: a group is judged together): one request per group (a run of rows with the same prompt,
  as grpo lays out the G completions of a prompt), the completions numbered [1] .. [k]; the reply must end with a
  line `Ranking: 2 > 1 = 4 > 3` that names every number once, best first, "=" for a tie; completion at mean rank
  r gets (k - r) / (k - 1), so the best of a group gets 1 and the worst 0.
Parsing is strict: a reply without that last line, or a number out of range, is a failure, not a 0. A failed
request is retried (rewards/remote.py); what is still unscored is missing (None) and raised as `RowsFailed`, which
stops the run or, with on_error: skip, is counted as rewards/judge/failed.

Requests run `concurrency` at a time; the replies are cached in this process by (model, the request's text:
question, completion, reference, rubric and template), so a completion seen again (a repeated group, an eval of
the same text) is not asked again. The key is read from the environment variable `api_key_env` when a request is
made; a recipe (saved with every run) never holds it.

Importing this module must not import torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_cli.rewards.outcomes import RowsFailed
from grpo_cli.rewards.remote import JsonEndpoint, RequestFailed

POINTWISE = """You are grading a response to a question.

Question:
{question}
{reference}
Response:
{completion}

Rubric: {rubric}

Reason in at most three sentences, then end with a line of the form "Score: N", where N is a number from \
{min_score} to {max_score}."""

GROUP = """You are comparing {k} responses to the same question.

Question:
{question}
{reference}
{responses}

Rubric: {rubric}

Reason in at most three sentences, then end with a line of the form "Ranking: 2 > 1 > 3" that names every \
response number from 1 to {k} exactly once, best first (write "=" between two that are equally good)."""

RUBRIC = "Is the response a correct, complete and direct answer to the question?"
_SCORE = re.compile(r"^[\s*#_>`-]*score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+(?:\.\d+)?)?[\s*.`_]*$",
                    re.IGNORECASE)
_RANKING = re.compile(r"^[\s*#_>`-]*ranking\s*[:=]\s*\**\s*([\d\s>=]+?)[\s*.`_]*$", re.IGNORECASE)
_CACHE_SIZE = 100_000


@dataclass(frozen=True)
class JudgeSettings:
    base_url: str
    model: str
    mode: Literal["pointwise", "group"] = "pointwise"
    rubric: str = RUBRIC
    template: str | None = None
    min_score: float = 0.0
    max_score: float = 10.0
    api_key_env: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict, hash=False)
    request_timeout_s: float = 60.0
    retries: int = 2
    concurrency: int = 8
    cache: bool = True
    question_column: str = "prompt"


def judge_settings(kwargs: dict[str, Any]) -> JudgeSettings:
    """The judge's settings from the reward's kwargs; ValueError `kwargs.KEY: ...` for a bad one."""
    if "api_key" in kwargs:
        raise ValueError("kwargs.api_key: a recipe is saved with every run and checkpoint; put the key in an "
                         "environment variable and name it in kwargs.api_key_env")
    for key in ("base_url", "model"):
        if not isinstance(kwargs.get(key), str) or not kwargs[key]:
            raise ValueError(f"kwargs.{key}: the judge needs it (base_url: an OpenAI-compatible API such as "
                             "http://127.0.0.1:8000/v1; model: the name it serves)")
    s = JudgeSettings(**{k: v for k, v in kwargs.items() if k in JudgeSettings.__dataclass_fields__})
    if not s.base_url.startswith(("http://", "https://")):
        raise ValueError(f"kwargs.base_url: {s.base_url!r} is no http(s) URL")
    if s.mode not in ("pointwise", "group"):
        raise ValueError(f"kwargs.mode: {s.mode!r} is no judge mode; valid: pointwise, group")
    if not s.max_score > s.min_score:
        raise ValueError(f"kwargs.max_score ({s.max_score}) must be > kwargs.min_score ({s.min_score})")
    if s.concurrency < 1 or s.retries < 0 or s.request_timeout_s <= 0 or s.max_tokens < 1:
        raise ValueError("kwargs: concurrency and max_tokens must be >= 1, retries >= 0, request_timeout_s > 0")
    if s.template is not None:
        needed = ("{question}", "{completion}") if s.mode == "pointwise" else ("{question}", "{responses}")
        if missing := [f for f in needed if f not in s.template]:
            raise ValueError(f"kwargs.template: a {s.mode} template must hold {', '.join(missing)}")
        try:
            s.template.format(question="", completion="", responses="", k=2, rubric="", reference="", answer="",
                              min_score="0", max_score="10")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"kwargs.template: {type(e).__name__} {e} when it is filled (write a literal brace as "
                             "{{ or }}; placeholders: question, completion or responses, reference, answer, rubric, "
                             "min_score, max_score, k)") from None
    return s


def parse_score(reply: str, lo: float, hi: float) -> float:
    """The N of the reply's last non-empty line `Score: N`, in [lo, hi]; ValueError saying what is wrong."""
    last = next((line for line in reversed(reply.strip().splitlines()) if line.strip()), "")
    m = _SCORE.match(last)
    if not m:
        raise ValueError(f"the reply does not end with a line 'Score: N': {_tail(reply)}")
    value = float(m.group(1))
    if not lo <= value <= hi:
        raise ValueError(f"the score {m.group(1)} is outside [{lo:g}, {hi:g}]: {_tail(reply)}")
    return value


def parse_ranking(reply: str, k: int) -> list[float]:
    """[k] each response's reward from the reply's last line `Ranking: a > b = c ...`: (k - mean rank) / (k - 1)."""
    last = next((line for line in reversed(reply.strip().splitlines()) if line.strip()), "")
    m = _RANKING.match(last)
    if not m:
        raise ValueError(f"the reply does not end with a line 'Ranking: ...': {_tail(reply)}")
    tiers = [[int(x) for x in tier.split("=")] for tier in m.group(1).replace(" ", "").split(">")] \
        if re.fullmatch(r"\d+(?:[>=]\d+)*", m.group(1).replace(" ", "")) else None
    named = sorted(x for tier in tiers for x in tier) if tiers else None
    if named != list(range(1, k + 1)):
        raise ValueError(f"the ranking must name each of 1..{k} once: {_tail(reply)}")
    rank: dict[int, float] = {}
    place = 1
    for tier in tiers:
        mean = place + (len(tier) - 1) / 2
        rank.update({x: mean for x in tier})
        place += len(tier)
    return [(k - rank[i]) / (k - 1) for i in range(1, k + 1)]


def _tail(reply: str) -> str:
    text = " ".join(reply.split())
    return repr(text if len(text) <= 160 else "..." + text[-157:])


def _text(value: Any) -> str:
    """A question as the judge reads it: a chat prompt's messages as `role: content` lines."""
    if isinstance(value, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value if isinstance(m, dict))
    return str(value)


class Judge:
    """One judge (its settings): a client, a reply cache and its counts, kept for the process's life."""

    def __init__(self, settings: JudgeSettings) -> None:
        self.s = settings
        self.endpoint = JsonEndpoint(settings.base_url, api_key_env=settings.api_key_env,
                                     timeout_s=settings.request_timeout_s, retries=settings.retries)
        self.cache: OrderedDict[str, str] = OrderedDict()
        self.lock = threading.Lock()
        self.counts = {"cache_hits": 0}

    def ask(self, text: str) -> str:
        """The judge's reply to one user message (cached); RequestFailed or ValueError for no usable reply."""
        key = hashlib.sha256(json.dumps([self.s.model, text]).encode()).hexdigest()
        with self.lock:
            if self.s.cache and key in self.cache:
                self.counts["cache_hits"] += 1
                self.cache.move_to_end(key)
                return self.cache[key]
        body = {"model": self.s.model, "messages": [{"role": "user", "content": text}],
                "max_tokens": self.s.max_tokens, "temperature": self.s.temperature, **self.s.extra_body}
        answer = self.endpoint.post("/chat/completions", body)
        try:
            reply = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"the answer is not a chat completion: {str(answer)[:200]}") from None
        if not isinstance(reply, str):
            raise ValueError(f"the chat completion has no text: {str(answer)[:200]}")
        if self.s.cache:
            with self.lock:
                self.cache[key] = reply
                if len(self.cache) > _CACHE_SIZE:
                    self.cache.popitem(last=False)
        return reply

    def _reference(self, answer: Any) -> str:
        return "" if answer is None else f"\nReference answer:\n{answer}\n"

    def pointwise(self, question: Any, completion: str, answer: Any) -> float:
        s = self.s
        text = (s.template or POINTWISE).format(question=_text(question), completion=completion, rubric=s.rubric,
                                                 reference=self._reference(answer), answer="" if answer is None else answer,
                                                 min_score=f"{s.min_score:g}", max_score=f"{s.max_score:g}")
        return (parse_score(self.ask(text), s.min_score, s.max_score) - s.min_score) / (s.max_score - s.min_score)

    def group(self, question: Any, completions: list[str], answer: Any) -> list[float]:
        s, k = self.s, len(completions)
        responses = "\n\n".join(f"[{i}]\n{c}" for i, c in enumerate(completions, 1))
        text = (s.template or GROUP).format(question=_text(question), responses=responses, k=k, rubric=s.rubric,
                                             reference=self._reference(answer), answer="" if answer is None else answer)
        return parse_ranking(self.ask(text), k)

    def score(self, questions: list[Any], completions: list[str], answers: list[Any]) -> list[float | None]:
        """[N] rewards; RowsFailed (the scored rows kept) when some could not be scored."""
        n = len(completions)
        values: list[float | None] = [None] * n
        if self.s.mode == "pointwise":
            jobs = [([i], lambda i=i: [self.pointwise(questions[i], completions[i], answers[i])]) for i in range(n)]
        else:
            jobs = [(rows, lambda rows=rows: self.group(questions[rows[0]], [completions[i] for i in rows],
                                                        answers[rows[0]]))
                    for rows in _groups(questions) if len(rows) > 1]  # a lone completion has nothing to rank against
        failures: list[str] = []
        with ThreadPoolExecutor(min(self.s.concurrency, max(len(jobs), 1))) as pool:
            futures = [(rows, pool.submit(job)) for rows, job in jobs]
            for rows, future in futures:
                try:
                    for i, v in zip(rows, future.result()):
                        values[i] = v
                except (RequestFailed, ValueError) as e:
                    failures += [str(e)] * len(rows)
        if failures:
            raise RowsFailed(values, len(failures), failures[0])
        return values


def _groups(questions: list[Any]) -> list[list[int]]:
    """Runs of consecutive rows with the same question: a prompt's G completions."""
    runs: list[list[int]] = []
    for i, q in enumerate(questions):
        if runs and questions[runs[-1][0]] == q:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


_JUDGES: dict[str, Judge] = {}
_JUDGES_LOCK = threading.Lock()


def judge_for(settings: JudgeSettings) -> Judge:
    """The process's judge for these settings (its cache lives as long as the process)."""
    key = json.dumps(settings.__dict__, sort_keys=True, default=str)
    with _JUDGES_LOCK:
        if key not in _JUDGES:
            _JUDGES[key] = Judge(settings)
        return _JUDGES[key]
