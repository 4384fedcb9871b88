"""`grpo serve-vllm` as a process: it dies with no vLLM process left behind, leaves when its engine dies,
explains a failed start in one paragraph, and runs or refuses `--tp` on CPU before loading anything.

These use vLLM's default multiprocess engine (an EngineCore process, plus one worker per TP rank)
where the test is about those processes; the others use the in-process engine, which starts faster."""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from grpo_cli.errors import StartError
from grpo_cli.serve import startup
from grpo_cli.serve.startup import ModelShape, check_tp, plan_kv_cache
from grpo_cli.trainer.launch import free_port

from helpers import cli, popen
from servers import bearer, make_model, wait_healthy

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRPO_SERVER_TOKEN", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env.update(extra)
    return env


def _start(tmp_path, *args: str, **env) -> tuple[subprocess.Popen, str]:
    """The server, healthy. A port `free_port` found can be taken by another process before the server binds it (the
    server then exits 2, "cannot listen on"): that is tried again with another; any other failure shows the log."""
    pytest.importorskip("vllm")
    model_dir, log_path = make_model(tmp_path), tmp_path / "server.log"
    for attempt in range(3):
        port = free_port()
        with open(log_path, "w") as log:
            proc = popen("serve-vllm", "--model", model_dir, "--port", str(port), *args, env=_env(**env), stdout=log,
                         stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            print(f"server ({' '.join(args) or 'defaults'}) healthy after {wait_healthy(url, proc, 240):.1f} s")
            return proc, url
        except (RuntimeError, TimeoutError) as e:
            proc.kill()
            proc.wait(30)
            text = log_path.read_text()
            if proc.returncode == 2 and "cannot listen on" in text and attempt < 2:
                continue
            raise AssertionError(f"{e}; the server's log:\n{text[-3000:]}") from None
        except BaseException:
            proc.kill()
            raise
    raise AssertionError("unreachable")


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
                                 headers={"Content-Type": "application/json", **bearer(url)})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.mark.vllm
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

    model = AutoModelForCausalLM.from_pretrained(make_model(tmp_path), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()  # [k, V]
    logps = torch.log_softmax(logits, -1)
    return logps.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist(), logps.max(-1).values.tolist()


@pytest.mark.vllm
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


@pytest.mark.vllm
def test_a_failed_start_is_one_paragraph_with_the_log_file(tmp_path):
    pytest.importorskip("vllm")
    model_dir = make_model(tmp_path)
    t0 = time.monotonic()
    out = cli("serve-vllm", "--model", model_dir, "--max-model-len", "100000", "--port", str(free_port()),
              env=_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"), timeout=180)
    err = out.stderr.strip()
    print(f"exit {out.returncode} after {time.monotonic() - t0:.1f} s; stderr:\n{err}")
    assert out.returncode == 1 and "Traceback" not in err and len(err.splitlines()) <= 12
    paragraph = err[err.index("error: vLLM failed to start"):]
    assert "--max-model-len" in paragraph and "100000" in paragraph
    log_path = paragraph.split("full log: ")[1].split()[0]
    assert "Traceback" in open(log_path).read()


@pytest.mark.vllm
def test_tp_beyond_the_cpu_cores_is_refused_before_vllm_starts(tmp_path):
    cores = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    out = cli("serve-vllm", "--model", "builtin:tiny-qwen2", "--tp", str(cores + 1), env=_env(GRPO_CACHE_DIR=str(tmp_path)),
              timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"--tp {cores + 1}" in out.stderr and f"{cores} CPU cores" in out.stderr
    assert time.monotonic() - t0 < 30


GiB, MiB = 2**30, 2**20
QWEN_05B = ModelShape(layers=24, heads=14, kv_heads=2, head_dim=64, context=32768)  # Qwen2.5-0.5B's config


def test_cpu_kv_cache_is_sized_from_the_model_and_the_free_memory(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    # 2 (K, V) x 24 layers x 2 KV heads x 64 head dim x 2 bytes (bf16) = 12,288 B per token;
    # one 32,768-token sequence = 384 MiB; 8 of them = 3 GiB, when that is under a quarter of the free RAM
    plan = plan_kv_cache(QWEN_05B, "auto", 1, None, on_gpu=False, available=64 * GiB)
    assert plan.bytes == 3 * GiB and "3.0 GiB = 262,144 tokens (8 sequences of 32,768 tokens; 12288 B" in plan.message
    assert plan_kv_cache(QWEN_05B, "auto", 1, None, False, available=4 * GiB).bytes == 1 * GiB  # a quarter of 4 GiB
    assert plan_kv_cache(QWEN_05B, "auto", 1, None, False, available=1 * GiB).bytes == 384 * MiB  # one sequence at least
    with pytest.raises(StartError, match=r"one sequence of 32,768 tokens needs 384.0 MiB .* lower --max-model-len"):
        plan_kv_cache(QWEN_05B, "auto", 1, None, False, available=400 * MiB)
    # float32: 4 bytes; --tp 2: each worker holds 1 of the 2 KV heads
    assert plan_kv_cache(QWEN_05B, "float32", 2, None, False, available=64 * GiB).bytes == 3 * GiB
    assert plan_kv_cache(QWEN_05B, "auto", 1, 0.5, False, available=64 * GiB).bytes == GiB // 2  # --kv-cache-gib
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    plan = plan_kv_cache(QWEN_05B, "auto", 1, None, False, available=64 * GiB)
    assert plan.bytes is None and plan.size == 2 * GiB and "2.0 GiB from VLLM_CPU_KVCACHE_SPACE = 174,762 tokens" in plan.message


def test_cpu_tp_gets_its_own_cores_or_is_refused(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(startup.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(startup, "_numa_nodes", lambda: 1)
    assert check_tp(2, QWEN_05B, False, 0) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1,2,3|4,5,6,7"}
    assert check_tp(1, QWEN_05B, False, 0) == {}
    monkeypatch.setattr(startup, "_numa_nodes", lambda: 2)
    assert check_tp(2, QWEN_05B, False, 0) == {}  # one NUMA node per rank: vLLM's own binding
    with pytest.raises(StartError, match=r"--tp 16 on CPU .* needs at least 16 CPU cores .* may use 8 CPU cores"):
        check_tp(16, None, False, 0)
    with pytest.raises(StartError, match=r"--tp 4: the model's 14 attention heads cannot be split evenly"):
        check_tp(4, QWEN_05B, False, 0)
    with pytest.raises(StartError, match=r"--tp 2 needs 2 GPUs; this machine shows 1"):
        check_tp(2, QWEN_05B, True, 1)


def test_a_failed_multiprocess_start_reports_the_worker_error_from_the_log(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(  # as vLLM 0.32 writes them when a worker process fails (abridged)
        "(Worker pid=9959) WARNING 11-22 [utils.py:597] Failed to create oneDNN linear. Exception: could not create\n"
        "(Worker pid=9959) ERROR 11-22 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention "
        "configuration: head_dim=16 isa=2 kv_cache_idx=0\n"
        "(EngineCore pid=9947) ERROR 11-22 [core.py:1512] RuntimeError: Worker failed with error 'Unsupported', "
        "please check the stack trace above for the root cause\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above)\n")
    exc = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    text = startup.start_failure("/models/m", exc, Path(log))
    assert text.replace("\n", " ").startswith("error: vLLM failed to start /models/m: RuntimeError: Unsupported CPU "
                                               "attention configuration: head_dim=16")
    assert "does not support this model's head size" in text and text.endswith(f"The full log: {log}")
