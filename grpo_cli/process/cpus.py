"""CPU threads: how many torch may use, chosen from the cores actually free, and the one line that says when a step
runs far slower than the first ones did.

On a shared CPU, torch's OpenMP threads that outnumber the free cores do not just share them: by default they
spin while they wait at the barrier that ends every parallel region, for a thread the OS descheduled, and a step
takes several times longer (bench/threads_contention.py, 2 cores, another job running: 43.9 s a quickstart step
with 2 threads, 10.1 s alone). `train.threads: auto` (the default, for `grpo train` and `grpo eval`) samples
/proc/stat for a moment before torch is imported (this process's own time taken out). Idle: as many threads as
cores (split between the processes of one run). Shared: OpenMP's passive wait policy (OMP_WAIT_POLICY=PASSIVE:
waiting threads sleep instead of spinning), which measured best there (15.6-16.4 s a step with 2 threads; 17.6 s
with 1 thread), but which costs 12-18% on an idle machine (11.3 s vs 10.1 s), so it is only set when the CPU is
shared at start (and never over a value you set). A machine that gets busy later is caught by `SlowSteps`' line.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass


def _mine() -> set[int] | None:
    """The CPUs this process may run on (its affinity), None where the OS does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; the machine's count where there is none)."""
    mine = _mine()
    return len(mine) if mine else os.cpu_count() or 1


def cpu_times() -> tuple[float, float, int] | None:
    """(busy, total) jiffies of the CPUs this process may run on, from /proc/stat's per-CPU lines, and how many
    they are; None off Linux."""
    mine, busy, total, count = _mine(), 0.0, 0.0, 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if mine is not None and int(name[3:]) not in mine:
                    continue
                fields = [float(x) for x in values[:8]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
                busy, total, count = busy + sum(fields) - idle, total + sum(fields), count + 1
    except (OSError, ValueError):
        return None
    return (busy, total, count) if count else None


def busy_elsewhere(window_s: float = 0.3) -> float | None:
    """Of the cores this process may run on, how many other processes kept busy over `window_s` seconds (this
    process's own CPU time taken out); None where /proc/stat cannot be read."""
    before, own0, t0 = cpu_times(), time.process_time(), time.perf_counter()
    if before is None:
        return None
    time.sleep(window_s)
    after, own, wall = cpu_times(), time.process_time() - own0, time.perf_counter() - t0
    if after is None or after[1] <= before[1]:
        return None
    busy = (after[0] - before[0]) / (after[1] - before[1]) * after[2]  # of our cores, this process included
    return max(0.0, busy - own / max(wall, 1e-9))


SHARED = 0.5  # cores busy elsewhere from which the CPU counts as shared
# The cores busy elsewhere when the run started, measured once by prepare_openmp: choose_threads and the run's
# launched workers read it instead of sampling /proc/stat again (0.3 s each, and the workers would see each other).
BUSY_ENV = "GRPO_CPU_BUSY"


def _busy_at_start() -> float | None:
    seen = os.environ.get(BUSY_ENV)
    return float(seen) if seen else None


def prepare_openmp(setting: int | str | None) -> float | None:
    """Before torch is imported: with `auto` threads on a CPU other processes keep busy, OpenMP's passive wait
    policy (unless OMP_WAIT_POLICY is set already). -> the cores busy elsewhere (None: not measured)."""
    if setting != "auto" or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return None
    busy = _busy_at_start()
    if busy is None:
        busy = busy_elsewhere()
        if busy is None:
            return None
        os.environ[BUSY_ENV] = f"{busy:.3f}"
    if busy >= SHARED:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return busy


@dataclass(frozen=True)
class Threads:
    count: int
    why: str  # for the start-up line: "auto: 2 of 2 cores free" or "train.threads: 4"

    def __str__(self) -> str:
        """What train's start-up line and eval say: "2 CPU threads (auto: 2 of 2 cores free ...)"."""
        return f"{self.count} CPU thread{'s' if self.count > 1 else ''} ({self.why})"


def choose_threads(setting: int | str | None, processes: int = 1) -> Threads:
    """The torch threads of one of `processes` processes: `setting` when a number, else (auto / None) the free
    cores split between them, at least 1."""
    if isinstance(setting, int):
        return Threads(setting, f"train.threads: {setting}")
    cores, seen = usable_cores(), _busy_at_start()
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":  # waiting threads sleep: every core is usable
        count = max(1, cores // max(processes, 1))
        shared = f"shared CPU ({seen:.1f} cores busy elsewhere): " if seen is not None and seen >= SHARED else ""
        return Threads(count, f"auto: {shared}{cores} cores, OMP_WAIT_POLICY=PASSIVE")
    busy = seen if seen is not None else busy_elsewhere()
    free = cores if busy is None else max(1, cores - round(busy))
    count = max(1, free // max(processes, 1))
    shared = f", split between {processes} processes" if processes > 1 else ""
    seen = "" if busy is None else f" ({busy:.1f} busy with other processes)"
    return Threads(count, f"auto: {free} of {cores} cores free{seen}{shared}")


def apply_threads(setting: int | str | None, processes: int = 1) -> Threads:
    """Choose (`choose_threads`) and set torch's intra-op threads."""
    import torch

    chosen = choose_threads(setting, processes)
    torch.set_num_threads(chosen.count)
    return chosen


class SlowSteps:
    """Watches step times: the baseline is the median of steps 2-4 (step 1 warms up); a step `factor` times slower
    than it gets one line naming the likely cause and the setting, at most once every `every` steps."""

    def __init__(self, threads: int, device: str, factor: float = 3.0, every: int = 20) -> None:
        self.threads, self.device, self.factor, self.every = threads, device, factor, every
        self.times: list[float] = []
        self.last_warned: int | None = None

    def __call__(self, step: int, seconds: float) -> str | None:
        self.times.append(seconds)
        if len(self.times) <= 4:
            return None
        first = sorted(self.times[1:4])[1]
        if seconds < self.factor * first or (self.last_warned is not None and step - self.last_warned < self.every):
            return None
        self.last_warned = step
        line = f"step {step} took {seconds:.1f} s, {seconds / first:.0f}x the first steps' {first:.1f} s"
        if self.device != "cpu":
            return line + ": is another job using this GPU? (nvidia-smi shows the processes)"
        busy = busy_elsewhere()
        load = f"{busy:.1f} of {usable_cores()} cores are busy with other processes" if busy is not None else \
            "the CPU is probably shared with another process"
        return (f"{line}: {load}, and {self.threads} torch thread{'s' if self.threads > 1 else ''} that outnumber "
                "the free cores wait on each other; stop the other job, or set train.threads to the free cores "
                "(train.threads=1 on a busy 2-core machine)")


def allow_amx() -> bool:
    """Ask Linux for this process's AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM), as a process must before its
    first tile instruction. oneDNN asks for torch's own products; vLLM's CPU attention kernel does not, so on a CPU
    with AMX (Sapphire Rapids and newer) a vLLM engine whose linears have not yet asked dies with SIGILL at its first
    forward. Permission is per process and reset by exec: every process that hosts a vLLM worker asks. -> whether
    AMX is usable (False on CPUs without it, and on torch builds without the call)."""
    import torch

    init = getattr(getattr(torch, "cpu", None), "_init_amx", None)
    return bool(init()) if init is not None else False
