"""Peak memory: of the process so far (`memory/peak_gib`), and of each phase of a step (`memory/<phase>_gib`), so that
a run says where its peak comes from: sampling, scoring, the reference's forwards, forward and backward, the
optimizer step, the weight sync.

A GPU counts the CUDA allocator's peak (torch.cuda.max_memory_allocated: tensors, not the allocator's cache). The CPU
counts resident memory, Linux's high-water mark (VmHWM), which a phase resets by writing 5 to /proc/self/clear_refs;
memory a phase freed but the C allocator kept still counts as resident in the next one. Where the counter cannot be
reset (not Linux), phases are not measured and only the process peak is reported.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import torch

from grpo_cli.process import watchdog

# per device type, the highest counter value seen before a reset: the process peak is this or the counter's now
_process_peak: dict[str, float] = {}


def status_kib(field: str) -> int | None:
    """A memory field of Linux's /proc/self/status (VmRSS, VmHWM, ...) in KiB; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def host_available_bytes() -> float | None:
    """The host memory Linux says is available for new allocations without swapping (MemAvailable); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return float(info["MemAvailable"])
    except (OSError, KeyError, ValueError, IndexError):
        return None


def peak_rss_gib() -> float:
    """This process's peak resident memory since its counter was last reset: Linux's VmHWM (the high-water mark of
    its own address space), not ru_maxrss, which keeps the peak of the process that launched it across fork and
    exec (a run started from a 1 GiB notebook or test worker reported 1 GiB however small it was). ru_maxrss off
    Linux."""
    hwm = status_kib("VmHWM")
    if hwm is not None:
        return hwm / 2**20
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # macOS reports bytes, the BSDs KiB


def _counter(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_gib()


def _reset(device: torch.device) -> bool:
    """Restart the peak counter from what is in use now; -> False where it cannot be."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS to the current RSS (Linux 4.0+)
        return True
    except OSError:
        return False


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocator peak on a GPU, peak RSS on the CPU (phases included)."""
    return max(_process_peak.get(device.type, 0.0), _counter(device))


class PhasePeaks:
    """`with peaks("train"): ...` records the peak memory inside the block as memory/train_gib (the highest over a
    step's blocks of that name). Phases nest: a phase inside another counts in both."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peaks, self.open = device, {}, []
        self.enabled = True

    def _fold(self) -> None:
        """The counter's value into every open phase and the process peak, before it is reset or a phase closes."""
        now = _counter(self.device)
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0.0), now)
        _process_peak[self.device.type] = max(_process_peak.get(self.device.type, 0.0), now)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Measure the block as `phase`; the watchdog sees it as that phase too (no progress in it for
        train.stall_timeout_s stops the run: grpo_cli/process/watchdog.py)."""
        with watchdog.phase(phase), self._measured(phase):
            yield

    @contextmanager
    def _measured(self, phase: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._fold()
        if not _reset(self.device):
            self.enabled = False
            yield
            return
        self.open.append(phase)
        try:
            yield
        finally:
            self._fold()
            self.open.remove(phase)

    def metrics(self) -> dict[str, float]:
        """memory/<phase>_gib of every phase measured (none where the counter cannot be reset)."""
        out = {}
        for phase, gib in self.peaks.items() if self.enabled else ():
            out[f"memory/{phase}_gib"] = gib
        return out
