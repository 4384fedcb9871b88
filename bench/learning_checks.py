"""Learning checks with a control (issue 39 item 6): does training on the task's scorer lift held-out accuracy, and
does a reward that knows nothing of the task not?

Two tasks, each trained two ways from the same model, seed and data:
  task     the recipe as written: its reward is the task's own scorer.
  control  a coin (bench/random_reward.py: 1 with probability 0.5, whatever was written) is the whole reward; the
           task's scorer stays in the recipe at weight 0, so it is logged and evaluated but steers nothing.
Random rewards alone are known to lift some models (arXiv 2506.10947): a control that gains as much as the task
says the gain is not the task's reward at work.

    quickstart  recipes/quickstart.yaml: sums up to 20, the `accuracy` reward; eval/accuracy (the same rule) on 64
                problems of the generator under seed 1234, greedy.
    chain_sum   recipes/reasoning-gym.yaml: reasoning-gym's chain_sum (sums and differences of two numbers up to
                99), its own `score_answer` on grpo's final answer (reward `reasoning_gym`, extract: auto); the eval is that scorer's mean on 64 problems of the generator under seed 1234,
                greedy (eval/rewards/reasoning_gym/mean).

The held-out score is measured before training (`grpo eval base`, once per task) and every `--eval-every` steps.
The table gives, per run, the task's scorer on the training completions by 10-step windows (under the control too:
what the coin's policy happens to score) and the held-out score at each eval; the last line compares the gains.

    .venv/bin/python bench/learning_checks.py [--tasks quickstart chain_sum] [--seeds 0 1] [--steps 40]
    .venv/bin/python bench/learning_checks.py --report bench/results/learning_checks   # the table of runs made

Run it alone on the machine: about 5 minutes a run on 2 cores. Each run's metrics are kept under --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from vs_trl_runs import permutation_p, windows  # noqa: E402

EVAL = "eval={{every_steps: {every}, limit: 64, seed: 1234, num_samples: 1, batch_size: 32}}"
TASKS = {
    "quickstart": dict(recipe="recipes/quickstart.yaml", scorer="{name: accuracy, weight: 0.0}",
                       train="rewards/accuracy/mean", held_out="eval/accuracy", base="accuracy"),
    "chain_sum": dict(recipe="recipes/reasoning-gym.yaml",
                      scorer="{name: reasoning_gym, weight: 0.0, kwargs: {extract: auto}}",
                      train="rewards/reasoning_gym/mean", held_out="eval/rewards/reasoning_gym/mean",
                      base="rewards/reasoning_gym/mean"),
}
SIDES = ("task", "control")


def grpo(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "grpo_cli", *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"grpo {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def train(task: str, side: str, seed: int, steps: int, every: int, out: Path) -> Path:
    t = TASKS[task]
    run = out / f"{task}-{side}-s{seed}"
    args = ["train", t["recipe"], "-o", str(run / "run"), "--start-over", f"train.seed={seed}",
            f"train.max_steps={steps}", "checkpoint.every_steps=0", EVAL.format(every=every)]
    if side == "control":
        coin = f"{{name: '{ROOT / 'bench/random_reward.py'}:coin', weight: 1.0, kwargs: {{seed: {seed}}}}}"
        args.append(f"rewards=[{coin}, {t['scorer']}]")
    t0 = time.monotonic()
    grpo(*args)
    for name in ("metrics.jsonl", "recipe.yaml"):  # kept; the run folder (weights, rollouts) is not
        (run / name).write_text((run / "run" / name).read_text())
    shutil.rmtree(run / "run")
    print(f"  {run.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return run


def base_score(task: str, out: Path) -> float:
    """The held-out score of the untrained model, on the eval problems and settings of the task's runs."""
    t, kept = TASKS[task], out / f"{task}-base.json"
    if not kept.exists():
        recipe = next(out.glob(f"{task}-*-s*/recipe.yaml"))  # the scorer is in both sides' recipes
        grpo("eval", "base", "--recipe", str(recipe), "-o", str(out / f"{task}-base"))
        metrics = json.loads((out / f"{task}-base" / "eval.json").read_text())["targets"][0]["metrics"]
        kept.write_text(json.dumps(metrics))
    return json.loads(kept.read_text())[t["base"]]


def report(out: Path) -> str:
    table = ["| task | seed | side | task's scorer in training, by 10 steps | held-out score by step |",
             "|---|---|---|---|---|"]
    gains: dict[tuple[str, str], list[float]] = {}
    finals: dict[tuple[str, str], list[float]] = {}
    for task, t in TASKS.items():
        runs = sorted(out.glob(f"{task}-*-s*/metrics.jsonl"))
        if not runs:
            continue
        base = json.loads((out / f"{task}-base.json").read_text())[t["base"]]
        for side in SIDES:
            for f in sorted(out.glob(f"{task}-{side}-s*/metrics.jsonl"), key=lambda p: int(p.parent.name.rsplit("s", 1)[1])):
                ms = [json.loads(line) for line in f.read_text().splitlines()]
                seed = f.parent.name.rsplit("-s", 1)[1]
                train_score = windows([m[t["train"]] for m in ms if m.get(t["train"]) is not None])
                evals = [(0, base)] + [(m["step"], m[t["held_out"]]) for m in ms if t["held_out"] in m]
                gains.setdefault((task, side), []).append(evals[-1][1] - base)
                finals.setdefault((task, side), []).append(evals[-1][1])
                table.append(f"| {task} | {seed} | {side} | {' / '.join(f'{x:.3f}' for x in train_score)} | "
                             + ", ".join(f"{s}: {v:.3f}" for s, v in evals) + " |")
    lines = ["\n".join(table), ""]
    for task in TASKS:
        if (task, "task") not in gains:
            continue
        g = {side: sum(v) / len(v) for (name, side), v in gains.items() if name == task}
        n = len(gains[(task, "task")])
        both = (task, "control") in finals
        test = "too few seeds for a test"
        if both and min(len(finals[(task, "task")]), len(finals[(task, "control")])) >= 3:
            test = f"final scores task against control, permutation p = " \
                   f"{permutation_p(finals[(task, 'task')], finals[(task, 'control')]):.3f}"
        lines.append(f"{task}: held-out gain {g['task']:+.3f} trained on the task's scorer, "
                     f"{g.get('control', float('nan')):+.3f} on the coin ({n} seed{'s' * (n > 1)}; {test})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/.runs/learning-checks")
    ap.add_argument("--report", type=Path, help="print the table of the runs under this folder and stop")
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:
        for task in a.tasks:
            for side in a.sides:
                train(task, side, seed, a.steps, a.eval_every, out)
    for task in a.tasks:
        base_score(task, out)
    print(report(out))


if __name__ == "__main__":
    main()
