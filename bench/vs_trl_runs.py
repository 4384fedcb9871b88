"""Whole runs of `grpo train` against TRL's GRPOTrainer, seed by seed (issue 39 item 6): does grpo learn as well?

Each step's loss equals TRL's on identical rollouts (bench/vs_trl_loss.py); this compares what users see, whole runs
tried as a user comparing the two would: SmolLM2-135M-Instruct in float32, 64 two-digit sums in file order, one
reward file for both (1 if the last number is the answer: bench/vs_trl_reward.py:last_number), G = 8, 2 prompts a
step, 32 new tokens, temperature 0.7, learning rate 2e-5 constant, dapo, beta 0, 40 steps. The sides alternate
(grpo seed s, TRL seed s, grpo seed s+1, ...), each a fresh process (bench/vs_trl.py's run_grpo and run_trl).

The table gives each run's mean reward over 10-step windows; the test compares the final windows' means of the two
sides with a two-sided permutation test (every split of the runs into two sides when that is under 200,000, else
200,000 seeded draws): p < 0.05 says the sides differ. A seed is "lost" when its final window is below 0.1.

    python bench/vs_trl_runs.py --seeds 0 1 2 3 4 5          # ~10 minutes a seed (both sides) on 2 cores
    python bench/vs_trl_runs.py --seeds 0 --grpo-set algorithm.entropy_bonus=0.01   # a remedy on grpo's side only
    python bench/vs_trl_runs.py --report bench/.runs/vs-trl-runs                     # the table of runs already made

Run it alone on the machine. TRL lives in bench/.venv-trl (python bench/vs_trl.py --setup).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from vs_trl import check_trl_venv, machine, model_folder, run_grpo, run_trl  # noqa: E402

SETTINGS = dict(dtype="float32", gradient_checkpointing=None, G=8, B=2, micro_batch=16, new_tokens=32, lr=2e-5,
                adam_beta2=0.99, threads=2, device="cpu", trl_python=None, temperature=0.7, reward="last_number")


def write_sums(path: Path, n: int = 64, seed: int = 0) -> None:
    """n two-digit sums ("What is 47 + 18?") as chat messages with their answer, JSONL, in a fixed order."""
    from grpo_cli.data.generators import arithmetic

    with open(path, "w") as f:
        for r in arithmetic(n=n, seed=seed, ops=["+"], min_value=10, max_value=99):
            f.write(json.dumps({"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}) + "\n")


def windows(rewards: list[float], size: int = 10) -> list[float]:
    return [sum(rewards[i : i + size]) / len(rewards[i : i + size]) for i in range(0, len(rewards), size)]


def permutation_p(a: list[float], b: list[float], draws: int = 200_000) -> float:
    """Two-sided p of |mean(a) - mean(b)| under relabelling the runs (exact when the splits are few)."""
    pooled, k = a + b, len(a)
    observed = abs(sum(a) / len(a) - sum(b) / len(b))

    def gap(idx: set[int]) -> float:
        left = [pooled[i] for i in idx]
        right = [pooled[i] for i in range(len(pooled)) if i not in idx]
        return abs(sum(left) / len(left) - sum(right) / len(right))

    splits = list(itertools.combinations(range(len(pooled)), k)) if len(pooled) <= 20 else None
    if splits is not None and len(splits) <= draws:
        return sum(gap(set(s)) >= observed - 1e-12 for s in splits) / len(splits)
    rng = random.Random(0)
    return sum(gap(set(rng.sample(range(len(pooled)), k))) >= observed - 1e-12 for _ in range(draws)) / draws


def report(out: Path) -> str:
    runs = {}
    for f in sorted(out.glob("*/rewards.json")):
        side, seed = f.parent.name.rsplit("-s", 1)
        runs[(int(seed), side)] = json.loads(f.read_text())
    lines = ["| seed | side | steps 1-10 | 11-20 | 21-30 | 31-40 |", "|---|---|---|---|---|---|"]
    final: dict[str, list[float]] = {"grpo": [], "TRL": []}
    for (seed, side), rewards in sorted(runs.items()):
        w = windows(rewards)
        lines.append(f"| {seed} | {side} | " + " | ".join(f"{x:.3f}" for x in w) + " |")
        final.setdefault(side, []).append(w[-1])  # a remedy (grpo+key=value) is listed, not in the test
    if final["grpo"] and final["TRL"]:
        g, t = final["grpo"], final["TRL"]
        p = permutation_p(g, t)
        lost = {k: sum(x < 0.1 for x in v) for k, v in final.items()}
        lines.append("")
        lines.append(f"final window (steps 31-40), mean over seeds: grpo {sum(g) / len(g):.3f} ({len(g)} seeds, "
                     f"{lost['grpo']} lost), TRL {sum(t) / len(t):.3f} ({len(t)} seeds, {lost['TRL']} lost); "
                     f"permutation test p = {p:.3f}: " + ("the sides differ at 5%" if p < 0.05 else
                                                         "no difference at 5%"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sides", nargs="+", default=["grpo", "TRL"], choices=["grpo", "TRL"])
    ap.add_argument("--grpo-set", nargs="*", default=[], help="grpo overrides (a remedy), key=value")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/.runs/vs-trl-runs")
    ap.add_argument("--report", type=Path, help="print the table of the runs under this folder and stop")
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return
    if "TRL" in a.sides:
        check_trl_venv()
    a.out = a.out.resolve()  # the recipes written in a temporary folder name the prompts file by this path
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder("smollm2", Path(tmp))
        prompts = a.out / "sums.jsonl"
        write_sums(prompts)
        for seed in a.seeds:
            for side in a.sides:
                args = argparse.Namespace(**SETTINGS, seed=seed, grpo_set=a.grpo_set)
                tag = "grpo" + ("+" + "+".join(a.grpo_set) if a.grpo_set else "") if side == "grpo" else "TRL"
                work = Path(tmp) / f"{tag}-s{seed}"
                run = run_grpo(args, folder, prompts, work, a.steps) if side == "grpo" else \
                    run_trl(args, folder, prompts, work, a.steps)
                keep = a.out / f"{tag.replace('/', '_')}-s{seed}"
                keep.mkdir(parents=True, exist_ok=True)
                (keep / "rewards.json").write_text(json.dumps(run["reward"]))
                print(f"{tag} seed {seed}: " + " / ".join(f"{x:.3f}" for x in windows(run["reward"])), flush=True)
    print(f"\n{machine('cpu')}\n")
    print(report(a.out))


if __name__ == "__main__":
    main()
