"""The quickstart's step time when another process keeps the CPU busy: torch threads fixed at 2 (what the
quickstart pinned), 1, `auto` (the default: all cores when idle; on a shared CPU all cores with OpenMP's passive
wait policy), and the passive policy set by hand.

    python bench/threads_contention.py            # ~10 minutes on 2 cores; run it with nothing else running

Each row is a real `grpo train recipes/quickstart.yaml train.max_steps=3` (no eval, no checkpoints) whose steps 2-3
are timed (`time/step` in metrics.jsonl; step 1 warms up). "busy" rows start a competitor first: another torch
process with as many threads as cores, multiplying matrices for the whole run (what a second training job or a
test suite does). Prints a table and ends with one line: the busy step time at the old setting (2 threads) over
the one at the new default (auto).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPETITOR = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a * 0.01)
"""


def run(threads: str, busy: bool, policy: str | None, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    competitor = None
    if busy:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR, str(os.cpu_count() or 2)])
        time.sleep(3)  # its threads are spinning before the run starts, as a job already running would be
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "grpo_cli", "train", "recipes/quickstart.yaml", "train.max_steps=3",
                            f"train.threads={threads}", "eval=null", "checkpoint.every_steps=0", "logging.rollouts=false",
                            "--output-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    start = next((line for line in p.stderr.splitlines() if line.startswith("policy:")), "")
    chosen = start.split("; ")[3] if start.count("; ") >= 4 else ""
    return {"step_s": sum(s["time/step"] for s in steps[1:]) / len(steps[1:]), "wall_s": time.perf_counter() - t0,
            "chosen": chosen, "warned": "took" in p.stderr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args()
    rows = [("alone", "2", None), ("alone", "2", "PASSIVE"), ("alone", "auto", None),
            ("busy", "2", None), ("busy", "2", "PASSIVE"), ("busy", "1", None), ("busy", "auto", None)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (where, threads, policy) in enumerate(rows):
            r = run(threads, where == "busy", policy, Path(tmp) / f"run{i}")
            results.append((where, threads, policy or "default", r))
            print(f"  {where} threads={threads} {policy or 'default'}: {r['step_s']:.1f} s a step", file=sys.stderr)
    print(f"quickstart steps 2-3 on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print("| CPU | train.threads | OMP_WAIT_POLICY | s a step | run wall s | what auto chose |")
    print("|---|---|---|---|---|---|")
    for where, threads, policy, r in results:
        print(f"| {where} | {threads} | {policy} | {r['step_s']:.1f} | {r['wall_s']:.0f} | "
              f"{r['chosen'] if threads == 'auto' else '-'} |")
    busy = {(t, p): r["step_s"] for w, t, p, r in results if w == "busy"}
    print(f"\nbusy CPU: 2 threads {busy[('2', 'default')]:.1f} s a step, auto {busy[('auto', 'default')]:.1f} s: "
          f"{busy[('2', 'default')] / busy[('auto', 'default')]:.1f}x faster with auto")


if __name__ == "__main__":
    main()
