"""The vLLM engine behind `grpo serve-vllm`: started with the checks that need no vLLM first, then driven
one request at a time (a lock), holding the version of the weights it serves.

Log-probs are vLLM's `processed_logprobs`: after temperature and top-k/top-p/min-p, i.e. log pi_K(. | T), what
the trainer's `token_logprobs(..., temperature=T, truncation=...)` computes (grpo_cli/algo/sampling.py). A request vLLM refuses up front is the
client's (400); any other failure may have left the engine half-done, so it counts as dead (503).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_cli.errors import RequestError, StartError

if TYPE_CHECKING:
    from grpo_cli.serve.requests import GenerateRequest

log = logging.getLogger("grpo.serve")

WORKER_EXTENSION = "grpo_cli.rollout.vllm_worker.WeightSyncExtension"


def say(message: str) -> None:
    print(f"grpo serve-vllm: {message}", file=sys.stderr, flush=True)


class ServedEngine:
    """A vLLM `LLM` with a lock, the version of the weights it holds (0 = the model folder's) and what
    it accepts. `spec` is None when the model's tensor names could not be read: updates are refused."""

    def __init__(self, llm: Any, model: str, limits: Any, spec: Any, weights_dir: Path,
                 upload_dir: Path, kv_cache_bytes: int | None = None, spec_problem: str = "", lora_rank: int = 0) -> None:
        self.llm, self.model, self.limits, self.spec = llm, model, limits, spec
        self.weights_dir, self.upload_dir, self.kv_cache_bytes = weights_dir, upload_dir, kv_cache_bytes
        self.spec_problem, self.lora_rank = spec_problem, lora_rank  # lora_rank 0: adapters off
        self.version = 0
        self.adapter: Any = None  # vLLM's LoRARequest of the adapter version `version` samples with, if any
        self.base_replaced = False  # a full weight update replaced the model folder's weights adapters apply to
        self.base_fingerprint: dict | None = None  # of the model folder's weights (adapters.fingerprint)
        self.lock = threading.Lock()
        self.dead: str | None = None  # why the engine is unusable
        self.activity = 0  # engine steps and weight loads so far: /health shows them to a client's watchdog

    def info(self) -> dict:
        from grpo_cli.serve.requests import SamplingKwargs

        lim = self.limits
        return {"model": self.model, "weight_version": self.version, "weights_dir": str(self.weights_dir),
                "max_model_len": lim.max_model_len, "vocab_size": lim.vocab_size, "kv_cache_bytes": self.kv_cache_bytes,
                "max_sequences": lim.max_sequences, "max_body_bytes": lim.max_body_bytes,
                "max_upload_bytes": lim.max_upload_bytes, "tensors": len(self.spec.shapes) if self.spec else None,
                "lora_rank": self.lora_rank, "base_replaced": self.base_replaced,
                "sampling_kwargs": list(SamplingKwargs.model_fields), "base_fingerprint": self.base_fingerprint}

    def count_step(self) -> None:
        self.activity += 1

    def dead_reason(self) -> str | None:
        if self.dead is None:
            self.dead = _engine_dead(self.llm)
        return self.dead

    def generate(self, req: GenerateRequest) -> dict:
        from grpo_cli.serve.requests import check_generate

        extra = check_generate(req, self.limits)  # every field checked: none can fail inside the engine
        with self.lock:
            self._alive()
            self._check_version(req.expected_version)
            prompts = [{"prompt_token_ids": ids} for ids in req.prompt_token_ids]
            params = [_sampling_params(req, i * req.n, extra) for i in range(len(prompts))]
            outs = self._call("generating", self.llm.generate, prompts, params, use_tqdm=False,
                              lora_request=self.adapter)
            return {"weight_version": self.version, "outputs": [_completions(o) for o in outs]}

    def update_weights(self, path: str, version: int, partial: bool = False, uploaded: bool = False) -> dict:
        """Load a safetensors file as weight version `version` once it passed every check (weights.py)."""
        from grpo_cli.serve.weights import check_weights_file

        with self.lock:
            real = self._incoming(path, version, uploaded, "weight")
            if real is None:
                return {"weight_version": self.version, "updated": False, "seconds": 0.0}
            count = check_weights_file(real, self.spec, partial)
            t0 = time.perf_counter()
            self.activity += 1
            self._call("loading weights", self.llm.collective_rpc, "grpo_load_weights_from_file",
                       args=(str(real), version))
            self.activity += 1
            self._drop_adapter()  # trained on other base weights
            self.base_replaced = True
            self._call("resetting the prefix cache", self.llm.reset_prefix_cache)  # KV computed with the old weights
            self.version = version
            return {"weight_version": version, "updated": True, "seconds": time.perf_counter() - t0, "tensors": count}

    def update_adapter(self, path: str, version: int, uploaded: bool = False) -> dict:
        """Serve a LoRA adapter file (adapters.py) on the loaded base weights as weight version `version`: loaded
        into vLLM now (a bad one fails here, not at the next generate), the previous adapter removed."""
        from vllm.lora.request import LoRARequest

        from grpo_cli.serve.adapters import check_adapter_file, write_peft_folder

        with self.lock:
            real = self._incoming(path, version, uploaded, "adapter")
            if real is None:
                return {"weight_version": self.version, "updated": False, "seconds": 0.0}
            if self.base_replaced:
                raise RequestError(409, "a full weight update replaced the model's own weights, which an adapter "
                                        "applies to: sync full weights, or restart the server to sync adapters")
            config, count = check_adapter_file(real, self.spec.shapes, self.lora_rank)
            folder = self.upload_dir / f"adapter-{version}"  # the server's own copy: vLLM may read it again
            write_peft_folder(real, config, folder)
            t0 = time.perf_counter()
            request = LoRARequest(f"grpo-{version}", version, str(folder))
            try:  # vLLM's engine answers a failed add_lora and lives on (a utility call): the client's adapter
                self.llm.llm_engine.add_lora(request)
            except Exception as e:
                shutil.rmtree(folder, ignore_errors=True)
                if self.dead_reason():
                    raise RequestError(503, f"{self.dead}; the server is exiting so that it can be restarted") from e
                raise RequestError(422, f"vLLM refused the adapter ({type(e).__name__}: {str(e)[:300]})",
                                   "weights") from None
            self._drop_adapter()
            self.adapter = request
            self._call("resetting the prefix cache", self.llm.reset_prefix_cache)
            self.version = version
            return {"weight_version": version, "updated": True, "seconds": time.perf_counter() - t0, "tensors": count}

    def _incoming(self, path: str, version: int, uploaded: bool, what: str) -> Path | None:
        """Under the lock: the file of an update to `version` -> its real path (a client-named one must lie in the
        weights directory); None when that version is loaded already (a re-sent update is a no-op)."""
        from grpo_cli.serve.weights import authorize_path

        self._alive()
        if version == self.version:
            return None
        if version < self.version:
            raise RequestError(409, f"weight version {version} is older than the loaded version {self.version}")
        real = Path(path) if uploaded else authorize_path(path, self.weights_dir)
        if self.spec is None:
            raise RequestError(422, f"{what} updates are off: {self.spec_problem}", "weights")
        return real

    def _drop_adapter(self) -> None:
        if self.adapter is not None:
            self._call("removing the adapter", self.llm.llm_engine.remove_lora, self.adapter.lora_int_id)
            shutil.rmtree(self.adapter.lora_path, ignore_errors=True)
            self.adapter = None

    def reset_prefix_cache(self) -> dict:
        with self.lock:
            self._alive()
            return {"reset": bool(self._call("resetting the prefix cache", self.llm.reset_prefix_cache))}

    def _alive(self) -> None:
        if self.dead_reason():
            raise RequestError(503, f"{self.dead}; the server is exiting so that it can be restarted")

    def _check_version(self, expected: int | None) -> None:
        if expected is not None and expected != self.version:
            raise RequestError(
                409,
                f"stale weights: the request expects weight version {expected} but the server holds "
                f"version {self.version}; sync the weights (POST /update_weights) before generating",
            )

    def _call(self, doing: str, fn, *args, **kwargs):
        """Call vLLM. A request it refuses up front is the client's (400); anything else may have left
        the engine with a half-done request or a dead process, so the engine counts as dead."""
        from vllm.exceptions import VLLMValidationError

        try:
            return fn(*args, **kwargs)
        except VLLMValidationError as e:
            raise RequestError(400, f"vLLM refused the request: {e}") from e
        except Exception as e:
            log.exception("vLLM failed while %s", doing)
            self.dead = _engine_dead(self.llm) or f"vLLM failed while {doing} ({type(e).__name__}: {str(e)[:300]})"
            raise RequestError(503, f"{self.dead}; the server is exiting so that it can be restarted") from e


def _engine_dead(llm: Any) -> str | None:
    """Whether vLLM itself knows its engine is gone: the engine-core process (multiprocess engine)
    or a worker process (tensor parallel) died."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if getattr(getattr(core, "resources", None), "engine_dead", False):
        return "vLLM's engine-core process died"
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    if getattr(executor, "is_failed", False):
        return "a vLLM worker process died"
    return None


def _sampling_params(req: GenerateRequest, seed_offset: int, extra: dict[str, Any]):
    """One prompt's SamplingParams (`extra`: the request's checked sampling_kwargs). vLLM seeds the n samples seed,
    seed+1, ... so rows never share a seed."""
    from vllm import SamplingParams

    own = dict(
        n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k or 0,
        min_p=req.min_p or 0.0, repetition_penalty=req.repetition_penalty,
        max_tokens=req.max_tokens, seed=None if req.seed is None else req.seed + seed_offset,
        stop_token_ids=req.stop_token_ids or None, logprobs=0, detokenize=False,
    )
    if req.structured_outputs_regex is not None:
        from grpo_cli.rollout.vllm_colocate import structured_outputs

        extra = {**extra, **structured_outputs(req.structured_outputs_regex)}
    try:
        return SamplingParams(**own, **extra)
    except (TypeError, ValueError) as e:
        raise RequestError(422, f"vLLM's SamplingParams refused them ({type(e).__name__}: {str(e)[:300]})",
                           "sampling_kwargs") from None


def _completions(out: Any) -> list[dict]:
    """vLLM RequestOutput -> n dicts of token ids, the sampled tokens' log-probs, finish reason."""
    rows = []
    for c in sorted(out.outputs, key=lambda c: c.index):
        ids = list(c.token_ids)
        logps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids)]
        rows.append({"token_ids": ids, "logprobs": logps, "finish_reason": c.finish_reason})
    return rows


def start_engine(model: str, tp: int, gpu_memory_utilization: float, max_model_len: int | None, dtype: str,
                 enforce_eager: bool | None, seed: int, kv_cache_gib: float | None, workdir: Path,
                 weights_dir: Path, log_path: Path, lora_rank: int = 0) -> ServedEngine:
    """Checks that need no vLLM (exit 2), then vLLM with its output in `log_path` (failure: exit 1). `lora_rank` > 0:
    LoRA adapters up to that rank (vLLM's max_lora_rank, one adapter at a time) can be synced instead of weights."""
    import psutil
    import torch

    from grpo_cli.models.loading import quiet_vllm
    from grpo_cli.rollout.vllm_colocate import eager_default
    from grpo_cli.serve import startup

    quiet_vllm(level=None)  # vLLM's INFO lines stay (in its log file), each distinct one once (--verbose: all)

    on_gpu = torch.cuda.is_available()
    shape = startup.model_shape(model, max_model_len)
    os.environ.update(startup.check_tp(tp, shape, on_gpu, torch.cuda.device_count() if on_gpu else 0))
    if kv_cache_gib is not None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU platform would override the flag with it
    kv = startup.plan_kv_cache(shape, dtype, tp, kv_cache_gib, on_gpu, psutil.virtual_memory().available)
    say(kv.message)
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ and tp > 1 and not on_gpu:
        say(f"--tp {tp} on CPU: worker cores {os.environ['VLLM_CPU_OMP_THREADS_BIND']} (VLLM_CPU_OMP_THREADS_BIND)")
    warning = startup.die_with_this_process(workdir)
    if warning:
        say(f"warning: {warning}")
    say(f"starting vLLM (its output: {log_path}) ...")
    t0 = time.perf_counter()
    try:
        with startup.output_to(log_path):
            engine = _load(model, tp, gpu_memory_utilization, max_model_len, dtype, eager_default(enforce_eager),
                           seed, kv.bytes, workdir, weights_dir, lora_rank)
    except Exception as e:
        raise StartError(startup.start_failure(model, e, log_path), exit_code=1) from None
    engine.kv_cache_bytes = kv.size
    say(f"vLLM ready in {time.perf_counter() - t0:.1f} s")
    return engine


def _load(model, tp, gpu_memory_utilization, max_model_len, dtype, enforce_eager, seed, kv_bytes,
          workdir: Path, weights_dir: Path, lora_rank: int = 0) -> ServedEngine:
    from vllm import LLM, SamplingParams

    from grpo_cli.rollout.vllm_colocate import on_every_step
    from grpo_cli.serve.adapters import folder_fingerprint
    from grpo_cli.serve.requests import ServerLimits
    from grpo_cli.serve.weights import weight_spec

    llm = LLM(
        model=model, tensor_parallel_size=tp, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
        worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs", kv_cache_memory_bytes=kv_bytes,
        **({"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1, "max_cpu_loras": 2} if lora_rank else {}),
    )
    # the first request pays for lazy initialisation (seconds on CPU): not the trainer's first, with its timeout
    llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1), use_tqdm=False)
    config = llm.llm_engine.model_config
    spec, problem = None, ""
    try:
        spec = weight_spec(model, llm.collective_rpc("grpo_packed_modules")[0])
    except Exception as e:  # an architecture transformers cannot build: serving still works
        problem = f"the server could not list the model's tensors at start ({type(e).__name__}: {e})"
    limits = ServerLimits(vocab_size=config.get_vocab_size(), max_model_len=config.max_model_len,
                          max_upload_bytes=(spec.numel * 4 if spec else 0) + 16 * 2**20)
    upload_dir = workdir / "uploads"
    upload_dir.mkdir(mode=0o700)
    engine = ServedEngine(llm, model, limits, spec, weights_dir, upload_dir, spec_problem=problem, lora_rank=lora_rank)
    engine.base_fingerprint = folder_fingerprint(model)  # a trainer syncing adapters checks it is its base
    on_every_step(llm, engine.count_step)
    return engine
