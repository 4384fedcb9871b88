"""Judge rewards over an OpenAI-compatible endpoint and remote reward functions (issue 39 item 1).

The judge is a real model behind vLLM's own OpenAI server on loopback (the tiny model, started once for the module);
its replies are held to the judge's format with vLLM's structured outputs where a test needs them to parse, and left
free where a test needs them not to. What a real model cannot be made to do on cue (answer 503 once, hang, refuse a
key, take its time to show the concurrency limit) is a real HTTP server in this process that behaves so."""

import json
import logging
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from grpo_cli.errors import RewardError
from grpo_cli.recipe.schema import RewardConfig
from grpo_cli.rewards import REWARDS, score
from grpo_cli.rewards.judges import POINTWISE, judge_for, judge_settings, parse_ranking, parse_score
from grpo_cli.rewards.kwargs import check_kwargs
from grpo_cli.rewards.scoring import check_reward
from grpo_cli.rewards.outcomes import reset_reports

from helpers import cli, read_jsonl
from servers import make_model, openai_server

QUESTIONS = ["What is 2 + 2?"] * 2 + ["Name a primary colour."] * 2
ANSWERS = ["4", "4", "red", "red"]
COMPLETIONS = ["4", "It is 5.", "Red.", "The sky."]
DIGIT = {"structured_outputs": {"regex": "Score: [0-9]"}}


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    """vLLM's OpenAI-compatible server with the tiny model, served under the name `judge`."""
    pytest.importorskip("vllm")
    model = make_model(tmp_path_factory.mktemp("judge"))
    with openai_server(model, "judge", "bfloat16", tmp_path_factory.mktemp("judge-log") / "vllm.log") as url:
        yield url


def _spec(name: str = "judge", on_error: str = "raise", **kwargs) -> RewardConfig:
    return RewardConfig(name=name, kwargs=kwargs, on_error=on_error)


def _score(spec, completions=COMPLETIONS, questions=QUESTIONS, answers=ANSWERS, **columns):
    n = len(completions)
    return score([spec], [f"<user>{q}" for q in questions], list(completions), [[1, 2]] * n,
                 {"prompt": list(questions), "answer": list(answers), **columns})


def _ask(url: str, text: str, **extra) -> str:
    body = {"model": "judge", "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0.0,
            **extra}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["message"]["content"]


# --------------------------------------------------------------------------- a real judge model


@pytest.mark.vllm
def test_pointwise_scores_are_the_judges_own_scaled_and_cached(judge_url):
    settings = dict(base_url=judge_url, model="judge", max_tokens=8, extra_body=DIGIT, rubric="Is it right?")
    r = _score(_spec(**settings))
    values = r.per_function["judge"]
    assert all(v in [k / 10 for k in range(10)] for v in values), values
    # each value is what the judge says to the request grpo makes, read as N / 10 (min 0, max 10)
    for q, c, a, v in zip(QUESTIONS, COMPLETIONS, ANSWERS, values):
        text = POINTWISE.format(question=q, reference=f"\nReference answer:\n{a}\n", completion=c, rubric="Is it right?",
                                min_score="0", max_score="10")
        assert _ask(judge_url, text, **DIGIT) == f"Score: {round(v * 10)}"
    judge = judge_for(judge_settings(settings))
    asked, hits = judge.endpoint.counts["requests"], judge.counts["cache_hits"]
    assert _score(_spec(**settings)).per_function["judge"] == values  # the same texts: from the cache
    assert (judge.endpoint.counts["requests"], judge.counts["cache_hits"]) == (asked, hits + 4)
    scaled = _score(_spec(**settings, min_score=0, max_score=9)).per_function["judge"]
    assert scaled == [v * 10 / 9 for v in values]


@pytest.mark.vllm
def test_group_mode_ranks_each_prompts_completions_together(judge_url):
    tie_or_order = {"structured_outputs": {"regex": "Ranking: (1 > 2|2 > 1|1 = 2)"}}
    r = _score(_spec(mode="group", base_url=judge_url, model="judge", max_tokens=32, extra_body=tie_or_order),
               completions=COMPLETIONS + ["alone"], questions=QUESTIONS + ["Why?"], answers=ANSWERS + [None])
    values = r.per_function["judge"]
    for group in (values[0:2], values[2:4]):  # best 1, worst 0, a tie 0.5 each
        assert sorted(group) in ([0.0, 1.0], [0.5, 0.5]), values
    assert values[4] is None and not r.failed  # a lone completion has nothing to be ranked against: no reward
    three = {"structured_outputs": {"regex": "Ranking: (3 > 1 > 2|2 = 3 > 1)"}}
    r = _score(_spec(mode="group", base_url=judge_url, model="judge", max_tokens=32, extra_body=three),
               completions=["a", "b", "c"], questions=["Q"] * 3, answers=["x"] * 3)
    assert r.per_function["judge"] in ([0.5, 0.0, 1.0], [0.0, 0.75, 0.75])


@pytest.mark.vllm
def test_replies_that_do_not_parse_are_failures_never_zeros(judge_url, caplog):
    """The tiny model's free text ends with no `Score: N` line: every row is missing and counted, or the run stops."""
    settings = dict(base_url=judge_url, model="judge", max_tokens=6)
    reset_reports()  # a reward's first failure of a kind is logged once a process
    with caplog.at_level(logging.WARNING):
        r = _score(_spec(on_error="skip", **settings))
    assert r.per_function["judge"] == [None] * 4 and r.failed == {"judge": 4}
    assert "could not score 4 of 4 completions" in caplog.text and "does not end with a line 'Score: N'" in caplog.text
    with pytest.raises(RewardError, match=r"(?s)does not end with a line 'Score: N'.*rewards/judge/failed"):
        _score(_spec(**settings))


@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_train_with_a_judge(judge_url, tmp_path):
    kwargs = json.dumps({"base_url": judge_url, "model": "judge", "max_tokens": 8, "extra_body": DIGIT})
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "run"), "train.max_steps=2",
            "checkpoint.every_steps=0", f"rewards=[{{name: judge, weight: 1.0, kwargs: {kwargs}}}]")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    rows = read_jsonl(tmp_path / "run/rollouts.jsonl")
    assert len(rows) == 16 and all(r["rewards"]["judge"] in [k / 10 for k in range(10)] for r in rows)
    for step in (1, 2):
        mine = [r["rewards"]["judge"] for r in rows if r["step"] == step]
        assert metrics[step - 1]["rewards/judge/mean"] == pytest.approx(sum(mine) / 8)
    assert "rewards/judge/failed" not in metrics[0]


# --------------------------------------------------------------------------- parsing


def test_parsing_is_strict():
    assert parse_score("The answer is right.\nScore: 8", 0, 10) == 8
    assert parse_score("**Score:** 7/10\n\n", 0, 10) == 7
    assert parse_score("Score = 2.5", 1, 5) == 2.5
    for reply, why in [("Score: 8\nThat is all.", "does not end"), ("I give it 8", "does not end"),
                       ("Score: 11", r"outside \[0, 10\]"), ("Score: eight", "does not end")]:
        with pytest.raises(ValueError, match=why):
            parse_score(reply, 0, 10)
    assert parse_ranking("Ranking: 2 > 1 > 3", 3) == [0.5, 1.0, 0.0]
    assert parse_ranking("ranking: 1 = 2 > 3 = 4", 4) == [5 / 6, 5 / 6, 1 / 6, 1 / 6]  # mean ranks 1.5 and 3.5
    for reply in ["Ranking: 1 > 2", "Ranking: 1 > 1 > 2", "Ranking: 1 > 2 > 4", "Ranking: best is 2", "1 > 2 > 3"]:
        with pytest.raises(ValueError):
            parse_ranking(reply, 3)


def test_settings_are_checked_at_validate(tmp_path):
    fn = REWARDS["judge"]
    base = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    check_kwargs("judge", fn, base)
    for kwargs, message in [
        ({}, "kwargs.base_url: the judge needs it"),
        ({**base, "mod": "group"}, "kwargs.mod: not a parameter of the built-in reward 'judge' (did you mean 'mode'?)"),
        ({**base, "mode": "pairs"}, "kwargs.mode: 'pairs' is no judge mode; valid: pointwise, group"),
        ({**base, "api_key": "sk-secret"}, "kwargs.api_key: a recipe is saved with every run"),
        ({**base, "min_score": 5, "max_score": 5}, "kwargs.max_score (5) must be > kwargs.min_score (5)"),
        ({**base, "template": "{question} only"}, "kwargs.template: a pointwise template must hold {completion}"),
        ({**base, "template": 'Q: {question} A: {completion} JSON: {"score": 1}'}, "kwargs.template: KeyError"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            check_kwargs("judge", fn, kwargs)
    p = cli("validate", "recipes/ci-tiny.yaml", "rewards=[{name: judge, kwargs: {model: m}}]")
    assert p.returncode == 2 and "rewards.0.kwargs.base_url: the judge needs it" in p.stderr, p.stderr


def test_timeout_s_is_refused_for_the_judge_whose_cache_lives_in_this_process():
    """A reward with timeout_s runs each call in a child process: the judge's client and reply cache would start
    empty every step, so validate refuses it and names the judge's own bound on each request."""
    base = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(ValueError, match=r"^timeout_s: .*kwargs\.request_timeout_s"):
        check_reward("judge", base, timeout_s=5)
    check_reward("judge", base)
    p = cli("validate", "recipes/ci-tiny.yaml",
            "rewards=[{name: judge, timeout_s: 5, kwargs: {base_url: 'http://127.0.0.1:1/v1', model: m}}]")
    assert p.returncode == 2 and "rewards.0.timeout_s: " in p.stderr and "request_timeout_s" in p.stderr, p.stderr


# --------------------------------------------------------------------------- transport: a server that misbehaves


class _Stage(BaseHTTPRequestHandler):
    """POST /v1/chat/completions answers as `self.server.plan` says for the n-th request; POST /reward is a remote
    reward (each completion's length, 0 when it equals the answer column)."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.seen.append((self.path, self.headers.get("Authorization"), body))
            server.inflight += 1
            server.most = max(server.most, server.inflight)
            n = len(server.seen)
        self.counted = True
        try:
            if self.path == "/reward":
                rewards = [0.0 if c == a else float(len(c)) for c, a in zip(body["completions"], body["answer"])]
                return self._send(200, {"rewards": rewards} if body.get("shape", "dict") == "dict" else rewards)
            kind = server.plan(n, body)
            if kind == "slow":
                time.sleep(0.3)
                kind = "ok"
            if kind == "hang":
                time.sleep(3)
                return
            if kind == "ok":
                return self._send(200, {"choices": [{"message": {"role": "assistant", "content": "Fine.\nScore: 7"}}]})
            code = int(kind)
            self._send(code, {"error": f"refused; you sent {self.headers.get('Authorization')}"})
        finally:
            self._done()

    def _done(self):
        # leave the in-flight count before the reply is written: the client may send its next request as soon as
        # it reads this one, before this handler's thread runs again
        if self.counted:
            self.counted = False
            with self.server.lock:
                self.server.inflight -= 1

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self._done()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stage():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stage)
    server.lock, server.seen, server.inflight, server.most = threading.Lock(), [], 0, 0
    server.plan = lambda n, body: "ok"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _url(server, path="/v1"):
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_retries_timeouts_and_the_key_never_shown(stage, monkeypatch, caplog):
    monkeypatch.setenv("JUDGE_KEY", "sk-very-secret-123")
    stage.plan = lambda n, body: "503" if n == 1 else "ok"  # the first request fails, its retry is answered
    settings = dict(base_url=_url(stage), model="m", api_key_env="JUDGE_KEY", cache=False)
    r = _score(_spec(**settings), completions=["a"], questions=["q"], answers=["x"])
    assert r.per_function["judge"] == [0.7] and len(stage.seen) == 2
    assert {auth for _, auth, _ in stage.seen} == {"Bearer sk-very-secret-123"}
    stage.plan = lambda n, body: "401"  # final: not retried; the server echoes the key back
    reset_reports()
    with caplog.at_level(logging.WARNING):
        r = _score(_spec(on_error="skip", **settings), completions=["a", "b"], questions=["q", "q"], answers=["x"] * 2)
    assert r.per_function["judge"] == [None, None] and r.failed == {"judge": 2}
    assert "HTTP 401" in caplog.text and "Bearer ***" in caplog.text and "sk-very-secret" not in caplog.text
    stage.plan = lambda n, body: "hang"
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"no answer within 0.5 s \(after 2 attempts\)") as e:
        _score(_spec(request_timeout_s=0.5, retries=1, **settings), completions=["a"], questions=["q"], answers=["x"])
    assert time.monotonic() - t0 < 2.5 and "sk-very-secret" not in str(e.value)


def test_requests_run_concurrency_at_a_time(stage):
    stage.plan = lambda n, body: "slow"
    settings = dict(base_url=_url(stage), model="m", concurrency=2, cache=False)
    r = _score(_spec(**settings), completions=[str(i) for i in range(6)], questions=["q"] * 6, answers=["x"] * 6)
    assert r.per_function["judge"] == [0.7] * 6 and stage.most == 2
    stage.most = 0
    _score(_spec(**{**settings, "concurrency": 6}), completions=[str(i) for i in range(6)], questions=["q"] * 6,
           answers=["x"] * 6)
    assert stage.most > 2


def test_a_remote_reward_gets_what_a_python_reward_gets(stage):
    spec = RewardConfig(name=_url(stage, "/reward"), kwargs={"shape": "list"})
    r = score([spec], ["p1", "p2"], ["abc", "4"], [[1], [2]], {"answer": ["x", "4"], "prompt": ["q1", "q2"]})
    assert r.per_function == {"reward": [3.0, 0.0]}
    _, _, body = stage.seen[-1]
    assert body == {"answer": ["x", "4"], "prompt": ["q1", "q2"], "prompts": ["p1", "p2"], "completions": ["abc", "4"],
                    "completion_ids": [[1], [2]], "shape": "list"}
    stage.shutdown()
    stage.server_close()
    with pytest.raises(RewardError, match=r"POST http://127.0.0.1:\d+/reward: ConnectionRefusedError"):
        score([RewardConfig(name=spec.name, timeout_s=1)], ["p"], ["a"], [[1]], {"answer": ["x"]})


@pytest.mark.slow
def test_grpo_train_with_a_remote_reward(stage, tmp_path):
    url = _url(stage, "/reward")
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "run"), "train.max_steps=2",
            "checkpoint.every_steps=0", f"rewards=[{{name: '{url}', weight: 1.0}}]")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run/rollouts.jsonl")
    assert [r["rewards"]["reward"] for r in rows] == [float(len(r["completion"])) for r in rows]
    assert len(stage.seen) == 2 and all(path == "/reward" for path, _, _ in stage.seen)
    saved = (tmp_path / "run/recipe.yaml").read_text()
    assert url in saved  # the URL is kept as written (not made a path relative to the recipe)
    assert Path(tmp_path / "run/metrics.jsonl").exists()
