"""Products of a few rows against a large weight on the CPU, at the memory's speed rather than the library's.

A decode step multiplies a batch of a few rows (a group's 16 completions: 16 x 576) by every weight of the model, so
its time is reading the weights once (SmolLM2-135M's 0.54 GB at a 2-core machine's 25-34 GB/s: 16-22 ms a step) or,
at 16 rows, their multiply-adds (2 x 16 x 135 M: 27-40 ms on two AVX2 cores). torch's float32 product (MKL's
sgemm) reads them at 4-15 GB/s at 4-24 rows, which made its products most of a generate (bench/RESULTS.md). With
AVX-512, `few_rows.c` reads each block of 4 rows of the weight once, multiplies it from the L1 cache by 4 rows of the
batch at a time, and prefetches the next block while it does: 15-22 GB/s at 4-16 rows; with AVX2 (16 registers),
it packs the batch transposed and multiplies each weight element, broadcast, by up to 24 rows at once: 6-18 GB/s at
24-4 rows, 1.3-2.5x torch's rate (`python bench/few_rows.py`); at 1-3 rows and past 24 torch's product is as fast
or faster.

The sums are the same products in another order (AVX-512: each output's partial sums in 16 lanes over K, then their
reduction; AVX2: each output one lane's sum over K in order), so the results equal torch's to float rounding (bit
for bit at times), and differ between the two builds; each output is one thread's sum in a fixed order, so they do
not depend on the number of threads. Used by models/linear.py's forward of a plain `nn.Linear` outside autograd
while a thread samples (`sampling()`: the hf backend's `generate`, for training and `grpo eval`), in float32 on a
CPU with AVX2 and FMA or AVX-512, at `FEW_ROWS` rows; not in the trainer's forwards without autograd (an old
policy's, a reference's), whose log-probs are the training forward's bit for bit.

The C sources (this product's and models/decode_layer.c's, which uses it, both written in simd.h's vector
operations) are compiled once per machine into one library (`cc -O3 -march=native -fopenmp`, about a second) in
`cache_dir()/kernels/`, keyed by the sources, the compiler and the CPU's flags; where that fails (no compiler,
neither AVX2 with FMA nor AVX-512, not Linux on x86-64) or GRPO_CPU_KERNELS=off, every product is torch's and every
layer the model's own.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

from grpo_cli.models.builtin import cache_dir

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("few_rows.c", "decode_layer.c"))
HEADERS = (Path(__file__).with_name("simd.h"),)  # the vector operations both are written in (AVX-512 or AVX2)
FEW_ROWS = range(4, 25)  # rows where the kernel reads faster than torch's product on the 2-core CI machine
OFF_ENV = "GRPO_CPU_KERNELS"  # "off" or "0": torch's products and the layers' own forwards everywhere
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")  # and -march: the machine's own (native), or one a test names
_sampling = threading.local()  # .on: this thread is sampling (a rollout thread beside a training one has its own)
_contexts = itertools.count(1)  # each `sampling()` context's own number (.context)


def is_sampling() -> bool:
    """Whether this thread is inside `sampling()`."""
    return getattr(_sampling, "on", False)


def sampling_context() -> int:
    """The number of this thread's innermost `sampling()` context (0 outside one): no two contexts share one. The
    weights do not move within one (a sampler's generate), so what is checked of a module once in a context holds
    for the rest of it (models/decode_layer.py's plans)."""
    return getattr(_sampling, "context", 0) if is_sampling() else 0


@contextmanager
def sampling():
    """Within: this thread's products of few rows (a sampler's decode steps) go through the kernel where it applies."""
    before, context = is_sampling(), getattr(_sampling, "context", 0)
    _sampling.on, _sampling.context = True, next(_contexts)
    try:
        yield
    finally:
        _sampling.on, _sampling.context = before, context


def cpu_flags() -> str:
    """The CPU's flags line of /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build(target_dir: Path, compiler: str, march: str = "native") -> Path:
    """Compile the `SOURCES` with `compiler` for `march` (`-march=`: x86-64-v3 is AVX2, x86-64-v4 AVX-512) into one
    library in `target_dir` (once: the name is the hash of what it depends on) -> the shared library; raises OSError
    or subprocess.CalledProcessError where it cannot."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    flags = (*FLAGS, f"-march={march}")
    texts = [source.read_text() for source in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, version, " ".join(flags), cpu_flags()]).encode())
    target = target_dir / f"few_rows-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".few_rows.", suffix=".so", dir=target_dir)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True, check=True)
        os.replace(tmp, target)  # atomic: a process racing this one loads a whole library either way
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def vectors(flags: str) -> str | None:
    """The vector instructions simd.h builds the kernels with on a CPU of these /proc/cpuinfo flags, or None."""
    have = set(flags.split())
    if "avx512f" in have:
        return "AVX-512"
    return "AVX2" if {"avx2", "fma"} <= have else None


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be had (logged once)."""
    if os.environ.get(OFF_ENV, "").lower() in ("off", "0", "false"):
        return None
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not vectors(cpu_flags()):
        return None
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler: the CPU's few-row products are torch's")
        return None
    try:
        return load(build(cache_dir() / "kernels", compiler))
    except (OSError, subprocess.CalledProcessError) as e:
        log.warning("the few-row product kernel could not be built (%s): torch's products instead",
                    getattr(e, "stderr", None) or e)
        return None


def load(path: Path) -> ctypes.CDLL:
    """The library `build` made, its functions' arguments declared."""
    lib = ctypes.CDLL(str(path))
    lib.few_rows_product.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                     ctypes.c_void_p, ctypes.c_int]
    lib.few_rows_product.restype = None
    lib.decode_layer.argtypes = [ctypes.c_void_p]
    lib.decode_layer.restype = None
    return lib


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """F.linear(x, weight, bias) by the kernel where it is faster (float32 on a CPU, `FEW_ROWS` rows, inside
    `sampling()`; outside autograd: the caller's to check); else -> None."""
    if not is_sampling() or not x.is_cpu or x.dtype != torch.float32 or x.dim() == 0:
        return None
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if (rows not in FEW_ROWS or weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] != k
            or weight.shape[0] == 0 or not weight.is_contiguous()
            or (bias is not None and bias.dtype != torch.float32)):
        return None
    lib = library()
    if lib is None:
        return None
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=torch.float32)
    lib.few_rows_product(x.data_ptr(), rows, weight.data_ptr(), weight.shape[0], k, y.data_ptr(),
                         torch.get_num_threads())
    if bias is not None:
        y.add_(bias)
    return y
