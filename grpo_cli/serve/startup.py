"""Starting vLLM for `grpo serve-vllm`: checks made before it starts, the processes it leaves, its output.

- KV cache on CPU: sized from the model (layers x KV heads x head dim x dtype bytes x K and V, for
  KV_SEQUENCES sequences of the full context), not from `gpu_memory_utilization` x the machine's RAM,
  which vLLM's CPU worker reserves up front and refuses to start without (cpu_worker.py) as soon as
  other programs use 10% of it. `--kv-cache-gib` or VLLM_CPU_KVCACHE_SPACE override the estimate.
- `--tp N` on CPU: one vLLM worker per rank, each bound to its own cores. vLLM's automatic binding
  wants one NUMA node per rank ("Not enough allowed NUMA nodes to bind threads of 2 local
  CPUWorkers"); with fewer nodes the usable cores are split evenly (VLLM_CPU_OMP_THREADS_BIND), and
  with fewer cores than ranks the server refuses to start.
- No orphans: every process vLLM spawns (engine core, workers) is started through a launcher that
  asks the kernel to SIGKILL it when its parent dies (PR_SET_PDEATHSIG), then runs multiprocessing's
  spawn entry point; forked children get the same through os.register_at_fork. Killing the server
  however (SIGKILL, the OOM killer) takes its engine core, and with it the workers, down.
- vLLM's start-up output goes to a log file; a failed start is one paragraph naming the cause, the
  flag to change and the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

from grpo_cli.errors import StartError

KV_SEQUENCES = 8  # full-context sequences the automatic CPU KV cache holds
KV_MAX_SHARE_OF_FREE_RAM = 0.25
PARENT_PID_ENV = "GRPO_SERVE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- what the model needs


@dataclass(frozen=True)
class ModelShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int  # --max-model-len, or the model's max_position_embeddings


def model_shape(model: str, max_model_len: int | None) -> ModelShape | None:
    """The attention shape from the model's config.json; None when it is not a standard decoder."""
    from transformers import AutoConfig

    try:
        c = AutoConfig.from_pretrained(model).get_text_config()
        heads = int(c.num_attention_heads)
        return ModelShape(int(c.num_hidden_layers), heads, int(getattr(c, "num_key_value_heads", None) or heads),
                          int(getattr(c, "head_dim", None) or c.hidden_size // heads),
                          int(max_model_len or c.max_position_embeddings))
    except (AttributeError, TypeError, ValueError, OSError):
        return None


def check_tp(tp: int, shape: ModelShape | None, on_gpu: bool, gpus: int) -> dict[str, str]:
    """Refuse a --tp that cannot work (exit 2) before vLLM starts; -> environment for the CPU workers."""
    cpus = sorted(os.sched_getaffinity(0))
    if on_gpu and tp > gpus:
        raise StartError(f"--tp {tp} needs {tp} GPUs; this machine shows {gpus} (CUDA_VISIBLE_DEVICES?)")
    if not on_gpu and tp > len(cpus):
        raise StartError(f"--tp {tp} on CPU runs one vLLM worker per rank, each on its own cores: it needs at least "
                         f"{tp} CPU cores and this process may use {len(cpus)} CPU cores. Use --tp {len(cpus)} or less "
                         "(--tp 1 runs one worker on all cores)")
    if shape is not None and shape.heads % tp:
        raise StartError(f"--tp {tp}: the model's {shape.heads} attention heads cannot be split evenly over {tp} "
                         f"ranks; use a --tp that divides {shape.heads}")
    if on_gpu:
        return {}
    if tp == 1 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or _numa_nodes() >= tp:
        return {}  # the user's binding, or vLLM's own (one NUMA node per rank)
    per = len(cpus) // tp
    bind = "|".join(",".join(map(str, cpus[r * per:(r + 1) * per])) for r in range(tp))
    return {"VLLM_CPU_OMP_THREADS_BIND": bind}


def _numa_nodes() -> int:
    nodes = Path("/sys/devices/system/node")
    return max(1, len(list(nodes.glob("node[0-9]*")))) if nodes.exists() else 1


@dataclass(frozen=True)
class KVPlan:
    bytes: int | None  # kv_cache_memory_bytes for vLLM, per worker; None: vLLM decides (GPU) or the env does
    message: str
    env_bytes: int | None = None  # what VLLM_CPU_KVCACHE_SPACE gives it

    @property
    def size(self) -> int | None:
        return self.bytes if self.bytes is not None else self.env_bytes


def plan_kv_cache(shape: ModelShape | None, dtype: str, tp: int, kv_cache_gib: float | None, on_gpu: bool,
                  available: int) -> KVPlan:
    """How much memory the KV cache gets, and a line saying so (printed at start)."""
    flag = "; change it with --kv-cache-gib"
    if kv_cache_gib is not None:
        b = int(kv_cache_gib * 2**30)
        return KVPlan(b, f"KV cache: {_size(b)} (--kv-cache-gib){_tokens(shape, dtype, tp, b)}")
    if on_gpu:
        return KVPlan(None, "KV cache: what --gpu-memory-utilization leaves after the weights (or set --kv-cache-gib)")
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if env.strip().isdigit() and int(env) > 0:
        b = int(env) * 2**30
        return KVPlan(None, f"KV cache: {_size(b)} from VLLM_CPU_KVCACHE_SPACE{_tokens(shape, dtype, tp, b)}{flag}", b)
    if shape is None:
        return KVPlan(2**30, f"KV cache: 1 GiB (the model's config does not say its attention shape){flag}")
    per_token = _bytes_per_token(shape, dtype, tp)
    one = per_token * shape.context
    if one > 0.9 * available:
        raise StartError(f"one sequence of {shape.context:,} tokens needs {_size(one)} of KV cache and only "
                         f"{_size(available)} of memory is free; lower --max-model-len")
    b = max(one, min(one * KV_SEQUENCES, int(KV_MAX_SHARE_OF_FREE_RAM * available)))
    per = " per worker" if tp > 1 else ""
    why = (f"{per_token} B per token = {shape.layers} layers x {_kv_heads(shape, tp)} KV heads x {shape.head_dim} "
           f"head dim x {_dtype_bytes(dtype)} bytes x K and V")
    return KVPlan(b, f"KV cache: {_size(b)}{per} = {b // per_token:,} tokens ({b // one} sequences of "
                     f"{shape.context:,} tokens; {why}){flag}")


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2  # "auto" runs float32 checkpoints in bf16/fp16 (vLLM's dtype rule)


def _kv_heads(shape: ModelShape, tp: int) -> int:
    return max(1, shape.kv_heads // tp)  # fewer KV heads than ranks: each rank keeps a copy


def _bytes_per_token(shape: ModelShape, dtype: str, tp: int) -> int:
    return 2 * shape.layers * _kv_heads(shape, tp) * shape.head_dim * _dtype_bytes(dtype)


def _tokens(shape: ModelShape | None, dtype: str, tp: int, b: int) -> str:
    return "" if shape is None else f" = {b // _bytes_per_token(shape, dtype, tp):,} tokens"


def _size(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


# ---------------------------------------------------------------- processes die with the server


LAUNCHER = '''#!{python}
# Written by grpo serve-vllm. Processes it spawns start here: the kernel SIGKILLs them when their
# parent dies (PR_SET_PDEATHSIG), then this runs what `python -c PROG` would. Their own spawns start
# here too, so a whole tree of vLLM processes goes when the server goes.
import ctypes, os, signal, sys
if "--multiprocessing-fork" in sys.argv:  # not multiprocessing's resource tracker: it cleans up after the others
    ctypes.CDLL(None).prctl({option}, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get("{env}", str(os.getppid())):
        sys.exit(1)  # the parent died before prctl: nobody would kill this process
    os.environ["{env}"] = str(os.getpid())
    import multiprocessing
    multiprocessing.set_executable(__file__)
i = sys.argv.index("-c")
prog, sys.argv = sys.argv[i + 1], ["-c"] + sys.argv[i + 2:]
exec(compile(prog, "<string>", "exec"), {{"__name__": "__main__"}})
'''


def die_with_this_process(workdir: Path) -> str | None:
    """Make every process spawned or forked from here on die with this one; -> a warning, or None."""
    import multiprocessing.spawn

    os.environ[PARENT_PID_ENV] = str(os.getpid())
    os.register_at_fork(after_in_child=_set_pdeathsig)
    python = multiprocessing.spawn.get_executable()
    python = os.fsdecode(python) if python else sys.executable
    if " " in python or os.statvfs(workdir).f_flag & os.ST_NOEXEC:
        return f"vLLM's processes may outlive this server if it is killed (cannot run a launcher from {workdir})"
    launcher = workdir / "spawn-launcher"
    launcher.write_text(LAUNCHER.format(python=python, option=_PR_SET_PDEATHSIG, env=PARENT_PID_ENV))
    launcher.chmod(0o700)
    multiprocessing.set_executable(str(launcher))
    return None


def make_workdir() -> Path:
    """A private (0700) directory for this server's launcher and uploads, named by its pid; those of
    servers that were killed (SIGKILL leaves them behind) are removed."""
    import shutil
    import tempfile

    for d in Path(tempfile.gettempdir()).glob("grpo-serve-*-*"):
        m = re.match(r"grpo-serve-(\d+)-", d.name)
        if m and d.is_dir() and d.stat().st_uid == os.getuid() and not _running(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"grpo-serve-{os.getpid()}-"))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _set_pdeathsig() -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get(PARENT_PID_ENV, str(os.getppid())):
        os._exit(1)
    os.environ[PARENT_PID_ENV] = str(os.getpid())


# ---------------------------------------------------------------- vLLM's output and failures


def log_path_for(port: int) -> Path:
    """vLLM's output of the server on `port`, kept after the server exits: under grpo's cache folder (the
    user's own), not a predictable name in the shared /tmp that another user could plant a symlink at."""
    from grpo_cli.models.loading import cache_dir

    folder = cache_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"serve-vllm-{port}.log"


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout and stderr (file descriptors 1 and 2, so vLLM's C++ output and the
    processes it spawns too) to `path` while the body runs; a traceback raised inside goes there as well."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


# (pattern in the cause, what to change)
_ADVICE = [
    (r"head size|head_size|head_dim|Head size",
     "vLLM's CPU attention does not support this model's head size; serve it on a GPU"),
    (r"NUMA|bind threads|OMP", "lower --tp, or set VLLM_CPU_OMP_THREADS_BIND to one core list per rank, e.g. 0-3|4-7"),
    (r"tensor parallel|divisible", "use a --tp that divides the model's attention heads"),
    (r"memory|KV cache|OOM|Cannot allocate", "a KV cache too small for one sequence needs a larger --kv-cache-gib or a "
                                             "smaller --max-model-len; out of memory, a smaller --kv-cache-gib"),
    (r"max_model_len|max_position_embeddings|maximum number of tokens",
     "set --max-model-len to at most the model's context"),
    (r"dtype|bfloat16|float16", "set --dtype (bfloat16, float16 or float32)"),
    (r"not found|No such file|does not appear|Repository|config\.json|Unrecognized model",
     "check --model: a model folder or a hub id"),
]


def start_failure(model: str, exc: BaseException, log: Path) -> str:
    """One paragraph: what failed, the flag to change, where the full trace is."""
    cause = _root_cause(exc, log)
    advice = next((a for pattern, a in _ADVICE if re.search(pattern, cause)), "see the log for the details")
    text = f"error: vLLM failed to start {model}: {cause}. To fix: {advice}. The full log: {log}"
    return textwrap.fill(text, width=110, break_long_words=False, break_on_hyphens=False)


# what vLLM's own exception says when the cause is in another process's output (the log)
_GENERIC = re.compile(r"initialization failed|See root cause|See stack trace|check the stack trace|EngineDeadError")


def _root_cause(exc: BaseException, log: Path) -> str:
    """The exception's own message, or with the multiprocess engine (whose exception only says
    "Engine core initialization failed. See root cause above") the last error in the log."""
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    if _GENERIC.search(lines[0]):
        try:
            logged = log.read_text(errors="replace").splitlines()
        except OSError:
            logged = []
        starts = [i for i, line in enumerate(logged) if re.search(r"\w(Error|Exception): ", line)
                  and not _GENERIC.search(line) and not re.search(r" (WARNING|INFO|DEBUG) ", line)]
        if starts:
            lines = [re.sub(r"^.*?(\w+(Error|Exception): )", r"\1", logged[starts[-1]])] + logged[starts[-1] + 1:]
    cause = lines[0]
    if re.match(r"\w*ValidationError: \d+ validation error", cause):  # pydantic: the reason is on the lines after
        detail = next((line for line in lines[1:] if "error," in line), None)
        cause = re.sub(r"^\s*\w+ error, ", "", detail or cause)
    cause = re.sub(r"\s*\[type=.*$", "", re.sub(r"\s+", " ", cause)).strip()
    sentences = re.split(r"(?<=\.) ", cause)
    short = ""
    for sentence in sentences:  # whole sentences, about 300 characters
        if short and len(short) + len(sentence) > 300:
            break
        short = f"{short} {sentence}".strip()
    return short.rstrip(".")
