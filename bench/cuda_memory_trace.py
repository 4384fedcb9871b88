"""What is alive at a run's CUDA allocator peak, by allocation size (the ground truth the doctor's memory plan is
checked against on a GPU, where tests/tensor_peak.py's CPU tracker does not run).

    python bench/cuda_memory_trace.py RUN_DIR RECIPE [key=value ...]

Runs RECIPE into RUN_DIR in this process with torch.cuda.memory's allocation history on (sizes and addresses only:
recording Python stacks breaks autograd's backward thread, torch 2.11), replays the history to the moment of the
peak and prints what was alive then, grouped by size, the largest first; then the cuBLAS workspaces (allocated by the
caching allocator, one per thread that runs a matmul: the forward's and autograd's). bench/doctor_memory.py --trace
runs every shape through it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch


def peak_alive(events: list[dict]) -> tuple[int, Counter]:
    """Replay alloc/free events -> (the most bytes alive at once, {block size: bytes of that size alive then})."""
    live: dict[int, int] = {}
    now = best = 0
    at_best: Counter = Counter()
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            now += e["size"]
            if now > best:
                best, at_best = now, Counter()
                for size in live.values():
                    at_best[size] += size
        elif e["action"] == "free_requested" and e["addr"] in live:
            now -= live.pop(e["addr"])
    return best, at_best


def cublas_workspaces() -> tuple[float, float]:
    """MiB a first matmul allocates beside its output in this thread, and in autograd's backward thread."""
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    b = a @ a
    torch.cuda.synchronize()
    m1 = torch.cuda.memory_allocated()
    b.sum().backward()
    torch.cuda.synchronize()
    m2 = torch.cuda.memory_allocated()
    return (m1 - m0 - b.untyped_storage().nbytes()) / 2**20, (m2 - m1 - a.grad.untyped_storage().nbytes()) / 2**20


def main(argv: list[str]) -> None:
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine

    fwd, bwd = cublas_workspaces()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None)
    Engine(load_recipe(Path(argv[1]), argv[2:]), Path(argv[0])).fit()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    best, alive = peak_alive(events)
    print(f"cuBLAS workspaces: {fwd:.2f} MiB this thread, {bwd:.2f} MiB autograd's")
    print(f"peak: {(best + base) / 2**20:.1f} MiB ({base / 2**20:.1f} MiB allocated before the run); alive then, "
          "by block size:")
    for size, n in alive.most_common(12):
        print(f"  {n / 2**20:8.2f} MiB in {n // size} x {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
