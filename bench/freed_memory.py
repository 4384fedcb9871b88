"""`train.keep_freed_memory` on and off: the same `grpo train` run, alternating, each a fresh process.

Each run trains the quickstart's model and batch (recipes/quickstart.yaml: SmolLM2-135M-Instruct, float32, 16 rows)
for --steps steps without eval or checkpoints, and reports its median training phase (`time/train`) and step over
the steps after the first two (the heap fills during those), its peak RSS and the page faults it took (the child's
minor faults, from getrusage). The tokens, rewards and weights are the same either way; the rewards are checked.

    python bench/freed_memory.py                 # 2 rounds x (on, off) x 7 steps, ~5 minutes on 2 cores
    python bench/freed_memory.py --rounds 3 --steps 10
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTLING = 2  # first steps not counted: the first makes AdamW's moments, the heap grows during both


def run(folder: Path, keep: bool, steps: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    cmd = [sys.executable, "-m", "grpo_cli", "train", "recipes/quickstart.yaml", "-o", str(folder),
           f"train.max_steps={steps}", "eval=null", "checkpoint.every_steps=0", "logging.rollouts=false",
           f"train.keep_freed_memory={str(keep).lower()}"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "time/step" in m]
    counted = metrics[SETTLING:]
    return {"train": statistics.median(m["time/train"] for m in counted),
            "step": statistics.median(m["time/step"] for m in counted),
            "peak": max(m["memory/peak_gib"] for m in metrics), "faults": faults,
            "rewards": [m["reward"] for m in metrics]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    results: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for keep in (True, False):
                out = run(Path(tmp) / f"{r}-{keep}", keep, args.steps)
                results[keep].append(out)
                print(f"round {r + 1} keep_freed_memory={str(keep).lower()}: train {out['train']:.2f} s, step "
                      f"{out['step']:.2f} s, peak RSS {out['peak']:.2f} GiB, {out['faults'] / 1e6:.2f} M page faults",
                      flush=True)
    assert all(o["rewards"] == results[True][0]["rewards"] for v in results.values() for o in v), "rewards differ"
    print(f"| train.keep_freed_memory | train s (median) | step s (median) | peak RSS GiB | page faults (M) |\n"
          f"|---|---|---|---|---|")
    rows = {}
    for keep, outs in results.items():
        rows[keep] = {k: statistics.median(o[k] for o in outs) for k in ("train", "step", "peak", "faults")}
        v = rows[keep]
        print(f"| {str(keep).lower()} | {v['train']:.2f} | {v['step']:.2f} | {v['peak']:.2f} | {v['faults'] / 1e6:.2f} |")
    on, off = rows[True], rows[False]
    print(f"keep_freed_memory on/off: training {on['train'] / off['train']:.2f}x, step {on['step'] / off['step']:.2f}x, "
          f"peak RSS {on['peak'] / off['peak']:.2f}x, page faults {on['faults'] / off['faults']:.2f}x "
          f"(quickstart's batch, {args.steps} steps, same rewards)")


if __name__ == "__main__":
    main()
