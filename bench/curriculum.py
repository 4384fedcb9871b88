"""data.curriculum on the quickstart (issue 39 item 3): the share of groups without signal, the training reward and
the held-out accuracy, with and without the curriculum, seed by seed.

The quickstart draws 2,000 problems and a 40-step run sees 80 of them once: a curriculum acts when rows come back,
so the runs here draw `--rows` problems (32: 2.5 epochs in 40 steps). The training reward is not comparable between
the sides (the curriculum passes over solved rows, which lowers it); the eval at steps 20 and 40 (64 problems of
the generator under seed 1234, greedy) is.

    .venv/bin/python bench/curriculum.py [--rows 32] [--steps 40] [--seeds 0 1] [--weight 0.25]

Run it alone on the machine: about 6 minutes a run on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(out: Path, rows: int, steps: int, seed: int, weight: float | None) -> list[dict]:
    args = [sys.executable, "-m", "grpo_cli", "train", "recipes/quickstart.yaml", "-o", str(out), "--start-over",
            f"data.generator_kwargs.size={rows}", f"train.seed={seed}", f"train.max_steps={steps}",
            "checkpoint.every_steps=0", "eval.every_steps=20"]
    if weight is not None:
        args.append(f"data.curriculum={{no_signal_weight: {weight}}}")
    t0 = time.monotonic()
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    print(f"  {out.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def windows(metrics: list[dict], key: str, size: int = 10) -> list[float]:
    values = [m[key] for m in metrics if m.get(key) is not None]
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in range(0, len(values), size)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--weight", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/.runs/curriculum")
    a = ap.parse_args()
    table = ["| seed | side | no-signal groups, by 10 steps | reward, by 10 steps | eval@20 | eval@40 | passed over |",
             "|---|---|---|---|---|---|---|"]
    summary: dict[str, list[float]] = {"plain": [], "curriculum": []}
    evals: dict[str, list[float]] = {"plain": [], "curriculum": []}
    for seed in a.seeds:
        for side, weight in (("plain", None), ("curriculum", a.weight)):
            ms = run(a.out / f"{side}-s{seed}", a.rows, a.steps, seed, weight)
            zero, reward = windows(ms, "frac_reward_zero_std"), windows(ms, "reward")
            ev = [m["eval/accuracy"] for m in ms if "eval/accuracy" in m]
            passed = sum(m.get("curriculum/passed_over", 0) for m in ms)
            first_epoch = max(1, a.rows // 2)  # 2 prompts a step: the steps of the first epoch
            later = [m["frac_reward_zero_std"] for m in ms[first_epoch:]]
            summary[side].append(sum(later) / max(len(later), 1))
            evals[side].append(ev[-1] if ev else float("nan"))
            table.append(f"| {seed} | {side} | {' / '.join(f'{x:.2f}' for x in zero)} | "
                         f"{' / '.join(f'{x:.3f}' for x in reward)} | {ev[0] if ev else float('nan'):.3f} | "
                         f"{ev[-1] if ev else float('nan'):.3f} | {passed:.0f} |")
    print("\n".join(table))
    mean = {k: sum(v) / len(v) for k, v in summary.items()}
    ev = {k: sum(v) / len(v) for k, v in evals.items()}
    print(f"no-signal groups after the first epoch: {mean['curriculum']:.2f} with the curriculum against "
          f"{mean['plain']:.2f} without; eval@{a.steps} {ev['curriculum']:.3f} against {ev['plain']:.3f} "
          f"({len(a.seeds)} seed{'s' * (len(a.seeds) > 1)}, {a.rows} problems, weight {a.weight})")


if __name__ == "__main__":
    main()
