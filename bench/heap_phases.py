"""Where a CPU run's resident memory is, phase by phase: glibc's heap, its own mappings, what of them is live, and the
rest (the weights, libraries, Python).

Runs `grpo train RECIPE [overrides]` in this process (grpo_cli.train, with train.keep_freed_memory=true as the
command line has it on a CPU) while a thread samples every --every seconds: VmRSS and RssFile (/proc/self/status) and
glibc's mallinfo2 (`arena`: the heap's size, free or not; `mapped`: blocks above the mmap threshold, each a mapping of
its own; `live`: the heap's allocated bytes plus the mapped blocks). Prints, for each phase of the steps after the
first (the watchdog's phase names: generate, train/forward_backward, ...), the sample of its highest resident memory
and the highest live bytes seen in it. The heap's free part at a phase's peak is memory glibc holds resident that no
tensor uses (bench/RESULTS.md, "Weight gradients in place...").

    python bench/heap_phases.py                                       # the quickstart's model and batch, 4 steps
    python bench/heap_phases.py recipes/quickstart.yaml train.micro_batch_size=8 rollout.max_completion_length=32
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def status_bytes(*fields: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":")[0]
            if name in fields:
                out[name] = int(line.split()[1]) * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", default=str(ROOT / "recipes/quickstart.yaml"))
    ap.add_argument("overrides", nargs="*", default=[])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--every", type=float, default=0.002, help="seconds between samples")
    args = ap.parse_args()

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    import grpo_cli
    import grpo_cli.process.watchdog as watchdog

    phases: list[str] = []
    own = watchdog.phase

    @contextmanager
    def named(name: str):  # the phase every sample is filed under
        phases.append(name)
        try:
            with own(name):
                yield
        finally:
            phases.remove(name)

    watchdog.phase = named
    samples: list[tuple] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            s, m = status_bytes("VmRSS", "RssFile"), libc.mallinfo2()
            samples.append((s["VmRSS"], s["RssFile"], m.arena, m.hblkhd, m.uordblks, "/".join(phases) or "between"))
            time.sleep(args.every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["train.keep_freed_memory=true", f"train.max_steps={args.steps}", "eval=null",
                     "checkpoint.every_steps=0", "logging.rollouts=false", *args.overrides]
        result = grpo_cli.train(args.recipe, overrides=overrides, output_dir=str(Path(tmp) / "run"))
        starts = [m for m in result.metrics if "time/step" in m]
    done.set()
    thread.join()
    first = next(i for i, s in enumerate(samples) if s[5].startswith("train"))  # the first step's training on
    later = samples[first:]
    second = next(i for i, s in enumerate(later) if s[5] == "generate")  # the second step's sampling on
    later = later[second:]
    print(f"{args.recipe} {' '.join(overrides)}: {len(starts)} steps, {len(samples)} samples every "
          f"{args.every * 1000:.0f} ms; the steps after the first")
    print("| phase | resident GiB | of it the heap | mapped blocks | live at that sample | heap free at that sample "
          "| files mapped | highest live in the phase |\n|---|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(s[5] for s in later):
        inside = [s for s in later if s[5] == name]
        rss, files, arena, mapped, used, _ = max(inside, key=lambda s: s[0])
        top = max(s[3] + s[4] for s in inside)
        print(f"| {name} | {rss / GIB:.3f} | {arena / GIB:.3f} | {mapped / GIB:.3f} | {(used + mapped) / GIB:.3f} | "
              f"{(arena - used) / GIB:.3f} | {files / GIB:.3f} | {top / GIB:.3f} |")
    peak = max(later, key=lambda s: s[0])
    print(f"peak resident {peak[0] / GIB:.2f} GiB in {peak[5]}: heap {peak[2] / GIB:.2f} GiB "
          f"({(peak[2] - peak[4]) / GIB:.2f} free), mapped blocks {peak[3] / GIB:.2f}, the rest "
          f"{(peak[0] - peak[2] - peak[3]) / GIB:.2f} (weights, libraries, Python)")


if __name__ == "__main__":
    main()
