"""A training checkpoint is served by the real vLLM unchanged: `vllm serve CKPT`, `grpo serve-vllm --model CKPT`
and `grpo eval CKPT --backend vllm` (issue 9: the trainer's *.safetensors beside the model's broke vLLM's loader).

Each server's log-probs of its own greedy completion are compared with a float32 transformers forward of the
checkpoint (and of the base model, which must be farther away): the checkpoint's weights were loaded, not
only something that starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from grpo_cli.train.launch import free_port

from helpers import ROOT, cli
from test_vllm_server import _wait_healthy

pytestmark = pytest.mark.usefixtures("model_cache")
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
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        print(f"{cmd[2]} healthy after {_wait_healthy(url, proc, deadline_s):.1f} s")
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        raise AssertionError(f"{e}:\n{log.read_text()[-4000:]}") from None
    return proc


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


def test_vllm_serve_loads_a_checkpoint(ckpt, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt), "--port", str(port),
           "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "256"]
    proc = _serve(cmd, url, tmp_path / "vllm.log", _env())
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
