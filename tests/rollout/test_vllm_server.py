"""`grpo serve-vllm` and its client against one real server process on 127.0.0.1 (CPU vLLM, tiny model).

The vLLM tests skip when vLLM is not installed; the bind-refusal test needs neither vLLM nor a model.
builtin:tiny-qwen2 has head_dim 16, which vLLM's CPU attention does not support (32, 64, ...), so the
server serves a same-sized variant with 2 heads (head_dim 32) built from its config and tokenizer.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.trainer.launch import free_port

from helpers import cli, popen
from servers import PROMPTS, make_model, max_diff, trainer_logps, wait_healthy

TOKEN = "test-token-7f3a"


def _server_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SERVER_TOKEN"}
    # In-process engine: ready in seconds and a single process to kill.
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = make_model(tmp_path_factory.mktemp("tiny-qwen2-h32"))
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    cmd = [sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(model_dir), "--port", str(port),
           "--dtype", "bfloat16", "--enforce-eager"]
    proc = popen(*cmd[3:], env=_server_env(GRPO_SERVER_TOKEN=TOKEN), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        startup_s = wait_healthy(url, proc, 120)
        print(f"server healthy after {startup_s:.1f} s")
        yield {"url": url, "proc": proc, "model_dir": model_dir, "log": log}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        log.seek(0)
        assert TOKEN not in log.read(), "the token leaked into the server's log"
        log.close()


@pytest.fixture(scope="module")
def client(server):
    from transformers import AutoTokenizer

    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    os.environ["GRPO_SERVER_TOKEN"] = TOKEN
    tok = AutoTokenizer.from_pretrained(server["model_dir"])
    cfg = RolloutConfig(backend="vllm", vllm={"mode": "server", "server_url": server["url"], "request_timeout_s": 30},
                        max_completion_length=12, temperature=0.8)
    yield VLLMServerGenerator(tok, cfg, seed=0)
    os.environ.pop("GRPO_SERVER_TOKEN", None)


@pytest.fixture(scope="module")
def hf_model(server):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(server["model_dir"], dtype=torch.float32).eval()


def _post(url: str, headers: dict) -> int:
    req = urllib.request.Request(url, data=b'{"prompt_token_ids": [[5]], "max_tokens": 2}', method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.vllm
def test_health_is_open_and_routes_need_the_token(server):
    health = urllib.request.urlopen(server["url"] + "/health", timeout=5)
    assert health.status == 200
    assert _post(server["url"] + "/generate", {}) == 401
    assert _post(server["url"] + "/generate", {"Authorization": "Bearer wrong"}) == 401
    assert _post(server["url"] + "/reset_prefix_cache", {}) == 401
    assert _post(server["url"] + "/generate", {"Authorization": f"Bearer {TOKEN}"}) == 200
    for dev_route in ("/collective_rpc", "/docs", "/openapi.json"):  # none of vLLM's own routes
        assert _post(server["url"] + dev_route, {"Authorization": f"Bearer {TOKEN}"}) in (404, 405)


@pytest.mark.vllm
def test_generate_contract_and_logprobs_match_the_trainer(client, hf_model):
    r = client.generate(PROMPTS, ["a", "b"], n=3)
    N, T = 6, r.completion_ids.shape[1]
    assert r.prompt_ids.shape == r.prompt_mask.shape == (N, 4)
    assert r.prompt_mask[3:].tolist() == [[0, 0, 1, 1]] * 3  # left padding of the short prompt
    assert r.prompt_ids[3:, 2:].tolist() == [[9, 10]] * 3
    assert 1 <= T <= 12 and r.completion_mask.shape == r.sampling_logps.shape == (N, T)
    assert r.sampling_logps.dtype == torch.float32 and len(r.completions) == N and r.prompts == ["a"] * 3 + ["b"] * 3
    assert (r.completion_ids[r.completion_mask == 0] == client.pad_id).all()
    assert len({tuple(row.tolist()) for row in r.completion_ids[:3]}) == 3  # the n samples are not copies
    ref = trainer_logps(hf_model, r, temperature=0.8)
    diff = max_diff(ref, r.sampling_logps, r.completion_mask)
    print(f"max |trainer fp32 - server bf16| log-prob: {diff:.4f} nats (mean logp {ref[r.completion_mask.bool()].mean():.2f})")
    assert diff < 0.05  # bf16 weights and activations on the server; ~-6.6 nats per token here


@pytest.mark.vllm
def test_sync_weights_changes_what_the_server_samples(client, hf_model, server):
    perturbed = type(hf_model).from_pretrained(server["model_dir"], dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # init std is 0.02: a clearly different policy
    before = client.generate(PROMPTS, ["a", "b"], n=2)
    stale = max_diff(trainer_logps(perturbed, before, 0.8), before.sampling_logps, before.completion_mask)
    v0 = client.version
    seconds = client.sync_weights(perturbed)
    after = client.generate(PROMPTS, ["a", "b"], n=2)
    fresh = max_diff(trainer_logps(perturbed, after, 0.8), after.sampling_logps, after.completion_mask)
    print(f"sync {seconds:.3f} s; vs perturbed model: before sync {stale:.3f}, after {fresh:.4f} nats")
    assert client.version == v0 + 1 == client.health()["weight_version"]
    assert stale > 0.3 and fresh < 0.05
    # Re-sending the loaded version is a no-op (idempotent retries); an older one is refused.
    status, out = _update_weights(server, {"path": "/nonexistent", "version": client.version})
    assert (status, out) == (200, {"weight_version": client.version, "updated": False, "seconds": 0.0})
    status, out = _update_weights(server, {"path": "/nonexistent", "version": 0})
    assert status == 409 and out["detail"] == "weight version 0 is older than the loaded version 1"


def _update_weights(server, body: dict) -> tuple[int, dict]:
    """POST /update_weights as any client would -> (HTTP status, JSON body)."""
    req = urllib.request.Request(server["url"] + "/update_weights", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.vllm
def test_remote_style_upload_of_the_weights_bytes(client, hf_model):
    client.loopback = False  # as if the server were on another machine: the file's bytes go over HTTP
    try:
        seconds = client.sync_weights(hf_model)  # back to the original weights
    finally:
        client.loopback = True
    r = client.generate(PROMPTS, ["a", "b"], n=2)
    diff = max_diff(trainer_logps(hf_model, r, 0.8), r.sampling_logps, r.completion_mask)
    print(f"upload sync {seconds:.3f} s; vs original model {diff:.4f} nats")
    assert diff < 0.05


@pytest.mark.vllm
def test_stale_version_is_a_409_not_a_silent_rollout(client):
    from grpo_cli.errors import VLLMServerError

    client.version -= 1
    try:
        with pytest.raises(VLLMServerError, match=r"HTTP 409: stale weights: the request expects weight version"):
            client.generate(PROMPTS, ["a", "b"])
    finally:
        client.version += 1
    assert client.generate(PROMPTS, ["a", "b"]).completion_ids.shape[0] == 2


@pytest.mark.vllm
def test_structured_outputs_and_sampling_kwargs_reach_the_server(client):
    import re

    from grpo_cli.errors import VLLMServerError

    cfg = client.cfg
    vllm = cfg.vllm.model_copy(update={"structured_outputs_regex": r"[0-9]{2,4}"})
    client.cfg = cfg.model_copy(update={"vllm": vllm, "generation_kwargs": {"min_tokens": 2}})
    try:
        r = client.generate(PROMPTS, ["a", "b"], n=3)
        for row in range(len(r)):
            ids = r.completion_ids[row][r.completion_mask[row].bool()].tolist()
            text = client.tokenizer.decode([t for t in ids if t not in client.eos_ids])
            assert re.fullmatch(r"[0-9]{2,4}", text), text  # min_tokens 2: never fewer than two digits
        client.cfg = cfg.model_copy(update={"generation_kwargs": {"n": 2}})
        with pytest.raises(VLLMServerError, match="HTTP 422: sampling_kwargs: may not set n: the request has fields"):
            client.generate(PROMPTS, ["a", "b"])
        client.cfg = cfg.model_copy(update={"generation_kwargs": {"no_such_setting": 1}})
        with pytest.raises(VLLMServerError, match="HTTP 422: sampling_kwargs.no_such_setting: not supported by this "
                                                  "server"):
            client.generate(PROMPTS, ["a", "b"])
    finally:
        client.cfg = cfg
    assert client.generate(PROMPTS, ["a", "b"]).completion_ids.shape[0] == 2  # the server took the bad requests


@pytest.mark.vllm
def test_a_long_generate_on_the_server_is_progress_for_the_trainers_watchdog(client, monkeypatch, tmp_path):
    """Issue 35: one /generate request is silent until it ends; the client watches the server's /health activity
    (engine steps) while it waits, so a request longer than train.stall_timeout_s is not a stall."""
    from grpo_cli.process.watchdog import Watchdog, phase

    monkeypatch.setattr(client, "cfg", client.cfg.model_copy(update={"generation_kwargs": {"ignore_eos": True}}))
    client.sample([[5, 6, 7]] * 64, [384] * 64)  # warm-up: the first step of a new batch shape takes seconds
    before = json.loads(urllib.request.urlopen(client.url + "/health", timeout=5).read())["activity"]
    t0 = time.monotonic()
    with Watchdog(tmp_path, 0.5, poll_s=0.05, interrupt=True), phase("generate"):
        samples = client.sample([[5, 6, 7]] * 64, [384] * 64)
    took = time.monotonic() - t0
    after = json.loads(urllib.request.urlopen(client.url + "/health", timeout=5).read())["activity"]
    assert len(samples.tokens) == 64 and after - before >= 384  # an engine step per token at least
    assert took > 2 * 0.5, took
    assert not (tmp_path / "stalls").exists()


@pytest.mark.vllm
def test_hung_then_dead_server_raises_within_the_timeout(client, server):
    from grpo_cli.errors import VLLMServerError

    client.http.timeout = 2.0
    proc = server["proc"]
    os.kill(proc.pid, signal.SIGSTOP)  # hung: the connection is accepted by the kernel, no answer comes
    try:
        t0 = time.monotonic()
        with pytest.raises(VLLMServerError, match=r"while generating \(timed out after 2 s\).*grpo serve-vllm --model") as hung:
            client.generate(PROMPTS, ["a", "b"])
        hung_s = time.monotonic() - t0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait(30)
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"could not reach grpo serve-vllm at http://127.0.0.1:\d+ while generating") as dead:
        client.generate(PROMPTS, ["a", "b"])
    dead_s = time.monotonic() - t0
    print(f"hung server: error after {hung_s:.2f} s; dead server: {dead_s:.2f} s")
    assert hung_s < 2.0 + 1.0 and dead_s < 2.0 + 1.0
    assert TOKEN not in str(hung.value) + str(dead.value)


def test_public_bind_without_token_refuses_before_loading_anything():
    env = _server_env()
    t0 = time.monotonic()
    out = cli("serve-vllm", "--model", "/does/not/exist", "--host", "0.0.0.0", env=env, timeout=60)
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in out.stderr and "GRPO_SERVER_TOKEN" in out.stderr
    assert "Traceback" not in out.stderr and time.monotonic() - t0 < 30
