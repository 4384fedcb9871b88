"""Freed host memory kept for reuse while a policy trains on a CPU (`train.keep_freed_memory`).

glibc's malloc serves a block above its mmap threshold with a mapping of its own, unmapped when the block is freed, and
gives the free top of its heap back to the kernel above a trim threshold; both thresholds start at 128 KiB and move
with what the program frees. A training step makes many large blocks anew (every weight gradient of a micro-batch,
the [vocab, hidden] gradient of a tied embedding, the logits and their gradient), and whatever went back to the kernel
has to be faulted in and zeroed again at the next step: on the 2-core machine bench/vs_trl.py's grpo run took
3.4-3.7 M page faults in 7 steps, and its training phase 3.9-6.8 s a step, against 0.96 M faults (most of them the
first step's) and 2.9-3.1 s with the thresholds fixed: blocks up to 32 MiB (glibc's own largest mmap threshold)
from the heap, and the heap's free top kept up to 2 GiB, so a step reuses the pages the last one freed (bench/
RESULTS.md). Larger blocks keep their own mappings, so what stays resident is bounded by the step's own blocks; the
price is the freed memory resident between phases (+0.1 GiB of SmolLM2's 3.6 GiB peak there). The same trade torch's
CPU launcher makes with jemalloc (torch.backends.xeon.run_cpu: memory never returned). glibc only. A process-wide
setting: `auto` takes it for `grpo train`'s and `grpo eval`'s own processes only (a Python program that calls
grpo_cli.train or grpo_cli.evaluate keeps its allocator unless the recipe says true), and leaves an allocator the
user chose alone (MALLOC_* or GLIBC_TUNABLES settings, LD_PRELOAD).
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MAPPED_ABOVE = 32 * 2**20  # bytes: a block this large gets a mapping of its own (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_ABOVE = 2**31 - 1  # bytes of free heap top before it goes back to the kernel: mallopt takes an int
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD")
KEPT = "freed memory kept for reuse (train.keep_freed_memory)"


def keep_freed_memory(setting: bool | str, device_type: str, own_process: bool) -> str | None:
    """Apply `train.keep_freed_memory` to this process: True, or `auto` where the policy trains on a CPU in a process
    of `grpo train`'s own (`own_process`) whose allocator the user left alone. -> the start line's words for it, None
    where glibc's defaults stay."""
    users = any(os.environ.get(name) for name in USER_SETTINGS)  # the user tuned or replaced the C allocator
    if setting is False or (setting == "auto" and (device_type != "cpu" or not own_process or users)):
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None  # musl, macOS: another allocator with other settings
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MAPPED_ABOVE) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE) != 1:
        return None
    return KEPT


def return_freed_memory() -> None:
    """Give the free pages the C allocator holds back to the system now (glibc's malloc_trim; elsewhere nothing):
    after a large part of what it held was freed once, e.g. a checkpoint's loaded tensors copied elsewhere."""
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).malloc_trim(0)
