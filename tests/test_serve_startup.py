"""`grpo serve-vllm`'s start-up decisions as numbers, without vLLM: KV cache size, CPU core binding
for --tp, and the cause a failed start reports when it is only in vLLM's log."""

from pathlib import Path

import pytest

from grpo_cli.serve import startup
from grpo_cli.errors import StartError
from grpo_cli.serve.startup import ModelShape, check_tp, plan_kv_cache

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
