"""`grpo serve-vllm` against hostile requests: one real server (CPU vLLM, in-process engine, tiny model),
started with the server's defaults (no VLLM_CPU_KVCACHE_SPACE: the server sizes the KV cache itself).

Every client mistake must be a 4xx naming the field or tensor, never a 500, a hang or a dead engine;
afterwards the same server must still sample the right distribution (log-probs vs a float32 model).

Checkpoints served: A training checkpoint is served by the real vLLM unchanged: `vllm serve CKPT`, `grpo serve-vllm --model CKPT`
and `grpo eval CKPT --backend vllm` (issue 9: the trainer's *.safetensors beside the model's broke vLLM's loader).

Each server's log-probs of its own greedy completion are compared with a float32 transformers forward of the
checkpoint (and of the base model, which must be farther away): the checkpoint's weights were loaded, not
only something that starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.trainer.launch import free_port

from helpers import ROOT, cli, popen
from servers import PROMPTS, bearer, make_model, max_diff, trainer_logps, wait_healthy

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("model_cache")]


TOKEN = "hostile-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VOCAB, CONTEXT = 768, 1024  # builtin:tiny-qwen2: vocab_size, max_position_embeddings


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = make_model(tmp_path_factory.mktemp("model"))
    port, log_path = free_port(), tmp_path_factory.mktemp("log") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_SERVER_TOKEN", "VLLM_CPU_KVCACHE_SPACE")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", GRPO_SERVER_TOKEN=TOKEN)  # in-process engine: starts in seconds
    with open(log_path, "w") as log:
        proc = popen("serve-vllm", "--model", model_dir, "--port", str(port), env=env, stdout=log,
                     stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"server healthy after {wait_healthy(url, proc, 180):.1f} s")
        yield {"url": url, "proc": proc, "model_dir": model_dir, "log": log_path}
    finally:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def info(server) -> dict:
    return _call(server, "GET", "/info")[1]


@pytest.fixture(scope="module")
def hf_model(server):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(server["model_dir"], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def client(server):
    from transformers import AutoTokenizer

    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    os.environ["GRPO_SERVER_TOKEN"] = TOKEN
    cfg = RolloutConfig(backend="vllm", vllm={"mode": "server", "server_url": server["url"], "request_timeout_s": 30},
                        max_completion_length=12, temperature=0.8)
    yield VLLMServerGenerator(AutoTokenizer.from_pretrained(server["model_dir"]), cfg, seed=0)
    os.environ.pop("GRPO_SERVER_TOKEN", None)


def _call(server, method: str, route: str, body: bytes | dict | None = None, headers: dict | None = None,
          auth: bool = True) -> tuple[int, dict]:
    """-> (HTTP status, JSON body); a hang fails the test after 20 s instead of blocking the suite."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = {"Content-Type": "application/json", **(AUTH if auth else {}), **(headers or {})}
    req = urllib.request.Request(server["url"] + route, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"detail": raw.decode(errors="replace")}


def _gen(**overrides) -> dict:
    return {"prompt_token_ids": [[5, 6, 7]], "max_tokens": 3, **overrides}


def _js(**overrides) -> bytes:
    return json.dumps(_gen(**overrides)).encode()


# (what it tries, route, body, extra headers, expected status, words the message must contain)
HOSTILE = [
    ("malformed JSON", "/generate", b'{"prompt_token_ids": [[5, 6', {}, 400, ["not valid JSON"]),
    ("JSON nested 100k deep", "/generate", b"[" * 100_000, {}, 400, ["not valid JSON"]),
    ("body is a list", "/generate", b"[1, 2]", {}, 422, ["JSON object"]),
    ("no prompts", "/generate", _js(prompt_token_ids=[]), {}, 422, ["prompt_token_ids"]),
    ("an empty prompt", "/generate", _js(prompt_token_ids=[[5], []]), {}, 422, ["prompt_token_ids[1]"]),
    ("a negative token id", "/generate", _js(prompt_token_ids=[[5, -1]]), {}, 422, ["prompt_token_ids[0][1]", "768"]),
    ("token id = vocab size", "/generate", _js(prompt_token_ids=[[VOCAB]]), {}, 422, ["prompt_token_ids[0][0]", "768"]),
    ("a 10^30 token id", "/generate", _js(prompt_token_ids=[[10**30]]), {}, 422, ["prompt_token_ids[0][0]"]),
    ("token id as a string", "/generate", _js(prompt_token_ids=[["5"]]), {}, 422, ["prompt_token_ids[0][0]"]),
    ("token id as a float", "/generate", _js(prompt_token_ids=[[5.5]]), {}, 422, ["prompt_token_ids[0][0]"]),
    ("token id as a bool", "/generate", _js(prompt_token_ids=[[True]]), {}, 422, ["prompt_token_ids[0][0]"]),
    ("prompt as long as the context", "/generate", _js(prompt_token_ids=[[5] * CONTEXT]), {}, 422, ["prompt_token_ids[0]", "1024"]),
    ("seed above 2^63", "/generate", _js(seed=2**63 + 5), {}, 422, ["seed"]),
    ("negative seed", "/generate", _js(seed=-7), {}, 422, ["seed"]),
    ("n = 0", "/generate", _js(n=0), {}, 422, ["n"]),
    ("n as a string", "/generate", _js(n="4"), {}, 422, ["n"]),
    ("10^6 sequences", "/generate", _js(prompt_token_ids=[[5]] * 1000, n=1000), {}, 422, ["sequences"]),
    ("max_tokens = 0", "/generate", _js(max_tokens=0), {}, 422, ["max_tokens"]),
    ("max_tokens = 10^9", "/generate", _js(max_tokens=10**9), {}, 422, ["max_tokens"]),
    ("temperature NaN", "/generate", _js().replace(b"}", b', "temperature": NaN}'), {}, 422, ["temperature"]),
    ("temperature 1e9", "/generate", _js(temperature=1e9), {}, 422, ["temperature"]),
    ("top_p 0", "/generate", _js(top_p=0), {}, 422, ["top_p"]),
    ("top_k 10^9", "/generate", _js(top_k=10**9), {}, 422, ["top_k"]),
    ("repetition_penalty 0", "/generate", _js(repetition_penalty=0), {}, 422, ["repetition_penalty"]),
    ("stop token out of vocabulary", "/generate", _js(stop_token_ids=[99_999]), {}, 422, ["stop_token_ids[0]"]),
    ("unknown field", "/generate", _js(evil=1), {}, 422, ["evil"]),
    ("expected_version as text", "/generate", _js(expected_version="latest"), {}, 422, ["expected_version"]),
    ("a 1 TB Content-Length", "/generate", _js(), {"Content-Length": str(10**12)}, 413, ["bytes"]),
    # sampling_kwargs (rollout.generation_kwargs): only what the server supports, each checked (issue 35)
    ("sampling_kwargs: unknown", "/generate", _js(sampling_kwargs={"no_such_setting": 1}), {}, 422,
     ["sampling_kwargs.no_such_setting", "min_tokens"]),
    ("sampling_kwargs: allowed id out of vocabulary", "/generate", _js(sampling_kwargs={"allowed_token_ids": [99_999]}),
     {}, 422, ["sampling_kwargs.allowed_token_ids[0]", "768"]),
    ("sampling_kwargs: logit_bias id out of vocabulary", "/generate",
     _js(sampling_kwargs={"logit_bias": {"99999": 5.0}}), {}, 422, ["sampling_kwargs.logit_bias", "768"]),
    ("sampling_kwargs: logit_bias of 1e30", "/generate", _js(sampling_kwargs={"logit_bias": {"5": 1e30}}), {}, 422,
     ["sampling_kwargs.logit_bias"]),
    ("sampling_kwargs: min_tokens past max_tokens", "/generate", _js(sampling_kwargs={"min_tokens": 50}), {}, 422,
     ["sampling_kwargs.min_tokens", "max_tokens"]),
    ("sampling_kwargs: min_tokens as text", "/generate", _js(sampling_kwargs={"min_tokens": "2"}), {}, 422,
     ["sampling_kwargs.min_tokens"]),
    ("sampling_kwargs: presence_penalty NaN", "/generate",
     _js(sampling_kwargs={"presence_penalty": 1}).replace(b"1}", b"NaN}"), {}, 422, ["sampling_kwargs.presence_penalty"]),
    ("sampling_kwargs: stop strings", "/generate", _js(sampling_kwargs={"stop": ["\n"]}), {}, 422,
     ["sampling_kwargs.stop"]),
    ("sampling_kwargs: prompt log-probs", "/generate", _js(sampling_kwargs={"prompt_logprobs": 10**6}), {}, 422,
     ["sampling_kwargs.prompt_logprobs"]),
    ("sampling_kwargs: an own field", "/generate", _js(sampling_kwargs={"logprobs": 20}), {}, 422,
     ["sampling_kwargs", "logprobs"]),
    ("update: malformed JSON", "/update_weights", b'{"path": ', {}, 400, ["not valid JSON"]),
    ("update: no version", "/update_weights", b'{"path": "/tmp/x.safetensors"}', {}, 422, ["version"]),
    ("update: path is a number", "/update_weights", b'{"path": 5, "version": 9}', {}, 422, ["path"]),
    ("update: /etc/passwd", "/update_weights", b'{"path": "/etc/passwd", "version": 9}', {}, 403, ["weights directory"]),
    ("update: missing file", "/update_weights", b'{"path": "/nonexistent/w.safetensors", "version": 9}', {}, 403, ["weights directory"]),
    ("upload: version abc", "/update_weights", b"x", {"Content-Type": "application/octet-stream", "X-Weight-Version": "abc"}, 400, ["X-Weight-Version"]),
    ("upload: garbage bytes", "/update_weights", b"\x00" * 100, {"Content-Type": "application/octet-stream", "X-Weight-Version": "9"}, 422, ["safetensors"]),
]


def test_hostile_requests_are_4xx_naming_the_field_and_the_server_still_samples_right(server, client, hf_model):
    outcomes = []
    for what, route, body, headers, status, words in HOSTILE:
        code, out = _call(server, "POST", route, body, headers)
        detail = str(out.get("detail"))
        outcomes.append((what, code, detail[:100]))
        ok = code == status and all(w in detail for w in words)
        assert ok, f"{what}: HTTP {code} {detail!r}; expected {status} mentioning {words}"
    print("\n".join(f"  {code}  {what:<32} {detail}" for what, code, detail in outcomes))
    assert len(HOSTILE) >= 20
    health = urllib.request.urlopen(server["url"] + "/health", timeout=5)
    assert health.status == 200 and json.loads(health.read())["status"] == "ok"
    # still the same policy: the trainer's float32 log-probs of what the server samples (bf16 on the server)
    r = client.generate(PROMPTS, ["a", "b"], n=3)
    diff = max_diff(trainer_logps(hf_model, r, 0.8), r.sampling_logps, r.completion_mask)
    print(f"after {len(HOSTILE)} hostile requests: max |trainer - server| log-prob {diff:.4f} nats")
    assert diff < 0.05 and r.completion_ids.shape[0] == 6


def test_an_over_long_generation_is_capped_at_the_context(server):
    # the longest prompt allowed leaves room for one token: vLLM stops there ("length"), no error
    code, out = _call(server, "POST", "/generate", _gen(prompt_token_ids=[[5] * (CONTEXT - 1)], max_tokens=50))
    assert code == 200, out
    assert len(out["outputs"][0][0]["token_ids"]) == 1 and out["outputs"][0][0]["finish_reason"] == "length"


def test_defaults_size_the_kv_cache_from_the_model(server, info):
    # 2 layers x 1 KV head x head dim 32 x 2 bytes (bf16) x 2 (K and V) = 256 B per token;
    # 8 sequences of the full 1024-token context = 8192 tokens = 2 MiB, far below the machine's RAM
    log = Path(server["log"]).read_text()
    assert "KV cache: 2.0 MiB = 8,192 tokens" in log, log[-3000:]
    assert info["kv_cache_bytes"] == 2 * 2**20 and info["max_model_len"] == CONTEXT and info["vocab_size"] == VOCAB


def _state(hf_model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}


def _push(server, info, tensors: dict[str, torch.Tensor], version: int, name="w.safetensors", **extra) -> tuple[int, dict]:
    from safetensors.torch import save_file

    path = Path(info["weights_dir"]) / name
    save_file(tensors, str(path))
    try:
        return _call(server, "POST", "/update_weights", {"path": str(path), "version": version, **extra})
    finally:
        path.unlink()


def test_bad_weight_files_are_refused_before_they_reach_the_engine(server, info, hf_model, client, tmp_path):
    good = _state(hf_model)
    v = client.version + 1
    q0 = "model.layers.0.self_attn.q_proj.weight"
    cases = [  # (what, tensors, extra request fields, words the 422 must contain)
        ("wrong shape", {**good, q0: torch.zeros(64, 63)}, {}, [q0, "(64, 63)", "(64, 64)"]),
        ("integer dtype", {**good, q0: good[q0].to(torch.int32)}, {}, [q0, "I32"]),
        ("float64 dtype", {**good, q0: good[q0].double()}, {}, [q0, "F64"]),
        ("unknown name", {**good, "model.evil.weight": torch.zeros(2)}, {}, ["model.evil.weight"]),
        ("one tensor, no partial flag", {q0: good[q0]}, {}, ["missing", "model.embed_tokens.weight"]),
        ("partial: q without k and v", {q0: good[q0]}, {"partial": True}, ["model.layers.0.self_attn.k_proj.weight"]),
    ]
    for what, tensors, extra, words in cases:
        code, out = _push(server, info, tensors, v, **extra)
        assert code == 422 and all(w in out["detail"] for w in words), f"{what}: HTTP {code} {out}"
    # paths: only files inside the announced weights directory, after resolving symlinks and '..'
    wdir = Path(info["weights_dir"])
    link = wdir / "link.safetensors"
    link.symlink_to("/etc/passwd")
    try:
        for path in (str(link), f"{wdir}/../../etc/passwd", str(tmp_path / "w.safetensors")):
            code, out = _call(server, "POST", "/update_weights", {"path": path, "version": v})
            assert code == 403 and "weights directory" in out["detail"], (path, code, out)
    finally:
        link.unlink()
    (tmp_path / "junk.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{not json")
    with open(tmp_path / "junk.safetensors", "rb") as f:
        code, out = _call(server, "POST", "/update_weights", f.read(),
                          {"Content-Type": "application/octet-stream", "X-Weight-Version": str(v)})
    assert code == 422 and "safetensors" in out["detail"], out
    _, health = _call(server, "GET", "/health", auth=False)
    assert {k: health[k] for k in ("status", "model", "weight_version")} == \
        {"status": "ok", "model": str(server["model_dir"]), "weight_version": client.version}
    r = client.generate(PROMPTS, ["a", "b"], n=2)  # nothing of the refused files was loaded
    assert max_diff(trainer_logps(hf_model, r, 0.8), r.sampling_logps, r.completion_mask) < 0.05


def test_one_upload_at_a_time_and_each_one_declares_its_size(server, info, client):
    """Issue 35: concurrent uploads could fill the server's disk. A second upload while one is streaming is a 409;
    an upload without Content-Length a 411; the first one still completes."""
    import socket
    from urllib.parse import urlparse

    from safetensors.torch import save

    body = save({"x": torch.zeros(4)})  # any bytes: the file is checked (and refused) after the upload
    where = urlparse(server["url"])
    slow = socket.create_connection((where.hostname, where.port), timeout=20)
    try:  # the headers and half the body, then nothing: an upload in progress
        head = (f"POST /update_weights HTTP/1.1\r\nHost: {where.hostname}\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/octet-stream\r\nX-Weight-Version: {client.version + 7}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")
        slow.sendall(head.encode() + body[: len(body) // 2])
        import time

        time.sleep(1.0)  # the server has taken the upload slot
        octet = {"Content-Type": "application/octet-stream", "X-Weight-Version": str(client.version + 8)}
        code, out = _call(server, "POST", "/update_weights", body, octet)
        assert code == 409 and "another weights upload is in progress" in out["detail"], (code, out)
        slow.sendall(body[len(body) // 2 :])
        reply = slow.recv(4096).decode()
        assert reply.startswith("HTTP/1.1 422"), reply[:300]  # taken whole, then refused: not this model's tensors
    finally:
        slow.close()
    # the slot is free again; a chunked upload (no Content-Length) is refused before a byte is stored
    req = urllib.request.Request(server["url"] + "/update_weights", data=iter([body]), method="POST",
                                 headers={**AUTH, **octet, "Transfer-Encoding": "chunked"})
    try:
        urllib.request.urlopen(req, timeout=20)
        raise AssertionError("a chunked upload was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 411 and "Content-Length" in e.read().decode()


def test_a_partial_update_of_whole_fused_groups_changes_only_them(server, info, hf_model, client):
    torch.manual_seed(3)
    changed = type(hf_model).from_pretrained(server["model_dir"], dtype=torch.float32).eval()
    layer = "model.layers.1.self_attn."
    names = [layer + f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
    with torch.no_grad():
        sd = changed.state_dict()
        for n in names:
            sd[n].add_(torch.randn_like(sd[n]) * 0.5)
    v = client.version + 1
    code, out = _push(server, info, {n: changed.state_dict()[n].to(torch.bfloat16).contiguous() for n in names}, v, partial=True)
    assert code == 200 and out["updated"] and out["weight_version"] == v, out
    client.version = v
    r = client.generate(PROMPTS, ["a", "b"], n=2)
    new = max_diff(trainer_logps(changed, r, 0.8), r.sampling_logps, r.completion_mask)
    old = max_diff(trainer_logps(hf_model, r, 0.8), r.sampling_logps, r.completion_mask)
    print(f"partial update of {len(names)} tensors: vs changed model {new:.4f}, vs original {old:.3f} nats")
    assert new < 0.05 and old > 0.1
    client.sync_weights(hf_model)  # back to the original weights for the other tests


def test_the_client_writes_its_weights_into_the_announced_directory(server, info, hf_model, client, monkeypatch):
    def no_upload(*a, **k):
        raise AssertionError("uploaded the bytes although the server's weights directory is writable")

    with monkeypatch.context() as m:
        m.setattr(client.http, "upload", no_upload)
        client.sync_weights(hf_model)
    assert client.weights_dir == info["weights_dir"] and list(Path(info["weights_dir"]).iterdir()) == []
    client.weights_dir = "/proc/not-writable"  # e.g. a server run by another user: the bytes are uploaded
    v = client.version
    client.sync_weights(hf_model)
    assert client.version == v + 1 == _call(server, "GET", "/health")[1]["weight_version"]


PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    pytest.importorskip("vllm")
    run = tmp_path_factory.mktemp("vllm-ckpt") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "grpo-cache"))
        p = cli("train", str(ROOT / "recipes/ci-tiny.yaml"), "-o", str(run), "train.max_steps=2",
                "train.learning_rate=0.02")  # far enough from the base model to tell the two apart
    assert p.returncode == 0, p.stderr
    return run / "checkpoints/step-2"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SERVER_TOKEN"}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", **extra)
    return env


def _logps(model_dir: Path | str, completion: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _check_weights(ckpt: Path, completion: list[int], served_logps: list[float]) -> None:
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    served = torch.tensor(served_logps)
    to_ckpt = (_logps(ckpt, completion) - served).abs().max().item()
    to_base = (_logps(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")), completion) - served).abs().max().item()
    print(f"served log-probs vs the checkpoint: {to_ckpt:.4f} nats, vs the base model: {to_base:.4f}")
    assert to_ckpt < 0.05 and to_base > 3 * to_ckpt


def _serve(cmd: list[str], url: str, log: Path, env: dict, deadline_s: float = 180):
    with open(log, "w") as out:
        if cmd[1:3] == ["-m", "grpo_cli"]:
            proc = popen(*cmd[3:], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        else:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        print(f"{cmd[2]} healthy after {wait_healthy(url, proc, deadline_s):.1f} s")
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        raise AssertionError(f"{e}:\n{log.read_text()[-4000:]}") from None
    return proc


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **bearer(url.rsplit("/", 1)[0])})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


def test_vllm_serve_loads_a_checkpoint(ckpt, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt), "--port", str(port),
           "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "256"]
    proc = _serve(cmd, url, tmp_path / "vllm.log", _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"))  # the engine in the server
    try:
        out = _post(url + "/v1/completions", {"model": str(ckpt), "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                              "logprobs": 0, "return_token_ids": True})
    finally:
        proc.terminate()
        proc.wait(60)
    choice = out["choices"][0]
    _check_weights(ckpt, choice["token_ids"], choice["logprobs"]["token_logprobs"])


def test_grpo_serve_vllm_loads_a_checkpoint(ckpt, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(ckpt), "--port", str(port), "--dtype", "bfloat16"]
    proc = _serve(cmd, url, tmp_path / "serve.log", _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    try:
        out = _post(url + "/generate", {"prompt_token_ids": [PROMPT], "n": 1, "max_tokens": 6, "temperature": 0})
    finally:
        proc.terminate()
        proc.wait(60)
    [sample] = out["outputs"][0]
    _check_weights(ckpt, sample["token_ids"], sample["logprobs"])


def test_grpo_eval_with_vllm_on_a_checkpoint(ckpt, tmp_path):
    p = cli("eval", str(ckpt), "--backend", "vllm", "--limit", "4", "--max-new-tokens", "8", "-o", str(tmp_path / "ev"),
            env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "ev/eval.json").read_text())
    assert report["settings"]["backend"] == "vllm" and report["settings"]["problems"] == 4
    assert report["targets"][0]["model"] == str(ckpt) and 0 <= report["targets"][0]["metrics"]["accuracy"] <= 1
