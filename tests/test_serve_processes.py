"""`grpo serve-vllm` as a process: it dies with no vLLM process left behind, leaves when its engine dies,
explains a failed start in one paragraph, and runs or refuses `--tp` on CPU before loading anything.

These use vLLM's default multiprocess engine (an EngineCore process, plus one worker per TP rank)
where the test is about those processes; the others use the in-process engine, which starts faster.
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

from grpo_cli.train.launch import free_port
from test_vllm_server import _make_model, _wait_healthy

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRPO_SERVER_TOKEN", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env.update(extra)
    return env


def _start(tmp_path, *args: str, **env) -> tuple[subprocess.Popen, str]:
    pytest.importorskip("vllm")
    model_dir, port = _make_model(tmp_path), free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(model_dir), "--port", str(port), *args],
                            env=_env(**env), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"server ({' '.join(args) or 'defaults'}) healthy after {_wait_healthy(url, proc, 240):.1f} s")
    except BaseException:
        proc.kill()
        raise
    return proc, url


def _descendants(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _alive(procs: list) -> list:
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


def _generate(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_sigkill_of_a_tp2_server_leaves_no_vllm_process(tmp_path):
    """Tensor parallelism on this 2-core CPU (one core per worker), then SIGKILL: no orphan survives."""
    proc, url = _start(tmp_path, "--tp", "2")
    try:
        out = _generate(url, {"prompt_token_ids": [[5, 6, 7, 8]], "max_tokens": 6, "temperature": 0, "seed": 0})
        ids, logps = out["outputs"][0][0]["token_ids"], out["outputs"][0][0]["logprobs"]
        ref, best = _reference_logps(tmp_path, [5, 6, 7, 8], ids)
        print(f"tp=2 greedy {ids}: log-probs {[round(x, 4) for x in logps]}, float32 transformers {[round(x, 4) for x in ref]}")
        assert len(ids) == 6 and max(abs(a - b) for a, b in zip(logps, ref)) < 0.05
        assert max(b - r for b, r in zip(best, ref)) < 0.05  # greedy: each token the argmax, up to bf16 noise
        family = _descendants(proc.pid)
        names = sorted(p.name() for p in family)
        assert sum("EngineCore" in n for n in names) == 1 and sum("Worker_TP" in n for n in names) == 2, names
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    t0 = time.monotonic()
    while _alive(family) and time.monotonic() - t0 < 5:
        time.sleep(0.1)
    left = _alive(family)
    print(f"{len(family)} descendants ({', '.join(names)}); {len(left)} alive {time.monotonic() - t0:.1f} s after SIGKILL")
    assert not left, f"orphans after SIGKILL of grpo serve-vllm: {left}"


def _reference_logps(tmp_path, prompt: list[int], ids: list[int]) -> tuple[list[float], list[float]]:
    """float32 transformers: log p(ids[t] | prompt, ids[:t]) and max_v log p(v | ...) at each step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_make_model(tmp_path), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()  # [k, V]
    logps = torch.log_softmax(logits, -1)
    return logps.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist(), logps.max(-1).values.tolist()


def test_a_dead_engine_makes_health_503_and_the_server_exit(tmp_path):
    proc, url = _start(tmp_path)
    try:
        engine_core = [p for p in _descendants(proc.pid) if "EngineCore" in p.name()]
        assert len(engine_core) == 1
        engine_core[0].kill()  # as the OOM killer would
        statuses, body, t0 = [], {}, time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 30:
            try:
                statuses.append(urllib.request.urlopen(url + "/health", timeout=2).status)
            except urllib.error.HTTPError as e:
                statuses.append(e.code)
                body = json.loads(e.read())
            except OSError:
                pass
            time.sleep(0.1)
        print(f"/health after the engine died: {sorted(set(statuses))}; exit {proc.returncode} after {time.monotonic() - t0:.1f} s")
        assert 503 in statuses and body["status"] == "dead" and "engine" in body["detail"].lower()
        assert proc.returncode == 3
        log = (tmp_path / "server.log").read_text()
        assert "vLLM's engine died" in log and "exiting with code 3" in log
    finally:
        proc.kill()
        proc.wait(30)


def test_a_failed_start_is_one_paragraph_with_the_log_file(tmp_path):
    pytest.importorskip("vllm")
    model_dir = _make_model(tmp_path)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(model_dir), "--max-model-len", "100000",
                          "--port", str(free_port())], env=_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
                         capture_output=True, text=True, timeout=180)
    err = out.stderr.strip()
    print(f"exit {out.returncode} after {time.monotonic() - t0:.1f} s; stderr:\n{err}")
    assert out.returncode == 1 and "Traceback" not in err and len(err.splitlines()) <= 12
    paragraph = err[err.index("error: vLLM failed to start"):]
    assert "--max-model-len" in paragraph and "100000" in paragraph
    log_path = paragraph.split("full log: ")[1].split()[0]
    assert "Traceback" in open(log_path).read()


def test_tp_beyond_the_cpu_cores_is_refused_before_vllm_starts(tmp_path):
    cores = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", "builtin:tiny-qwen2", "--tp", str(cores + 1)],
                         env=_env(GRPO_CACHE_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"--tp {cores + 1}" in out.stderr and f"{cores} CPU cores" in out.stderr
    assert time.monotonic() - t0 < 30
