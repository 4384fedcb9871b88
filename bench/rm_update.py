"""Does updating the reward model during the run (rewards[].update) keep the policy on the verifiable goal?

A tiny random policy (ci-tiny) is trained only by a tiny random reward model (weight 1); a verifiable reward,
`digit_fraction` (the share of digits in the completion, in [0, 1]), has weight 0: it is logged and, with
updates, labels the reward model's training samples. Same seed and steps, two runs:

  fixed     the reward model as built: the policy learns whatever its random preferences are
  updated   `update: {every_steps, label: digit_fraction, objective: pointwise, ...}`: the reward model learns
            digit_fraction from the policy's own completions (with replay), and the policy follows it

Printed: digit_fraction (the goal) over the first and last 10 steps of each run, and the reward model's
accuracy on each period's fresh completions before each update (`accuracy_before`).

    python bench/rm_update.py                 # ~30 s on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_reward_model(folder: Path) -> None:
    """A random 1-layer Qwen2ForSequenceClassification (num_labels 1) with grpo's builtin byte-level tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from grpo_cli.models.builtin import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, num_labels=1,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)


def run(rm: Path, out: Path, args, update: bool) -> list[dict]:
    label = str(ROOT / "recipes/rewards/toy.py:digit_fraction")
    upd = (f", update: {{every_steps: {args.every}, label: digit_fraction, learning_rate: {args.rm_lr}, "
           f"epochs: {args.epochs}}}") if update else ""
    rewards = f'rewards=[{{name: "{label}", weight: 0.0}}, {{name: "model:{rm}", weight: 1.0{upd}}}]'
    cmd = [sys.executable, "-m", "grpo_cli", "train", "recipes/ci-tiny.yaml", rewards, f"train.max_steps={args.steps}",
           "checkpoint.every_steps=0", "logging.rollouts=false", f"logging.output_dir={out}", f"train.seed={args.seed}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=2, help="update.every_steps")
    ap.add_argument("--rm-lr", type=float, default=3e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    key, p = "rewards/digit_fraction/mean", "reward_model/rm_tiny-rm/"
    with tempfile.TemporaryDirectory(prefix="grpo-rm-update-") as tmp:
        rm = Path(tmp) / "tiny-rm"
        build_reward_model(rm)
        runs = {name: run(rm, Path(tmp) / name, args, update) for name, update in (("fixed", False), ("updated", True))}
    print(f"ci-tiny policy rewarded by a tiny random reward model only; digit_fraction (weight 0) is the goal; "
          f"{args.steps} steps, seed {args.seed}; updates every {args.every} steps, lr {args.rm_lr:g}, {args.epochs} "
          "epochs, pointwise, replay 0.1")
    print("| reward model | digit_fraction, first 10 steps | last 10 steps | reward model score, first 10 | last 10 |")
    print("|---|---|---|---|---|")
    means = {}
    for name, m in runs.items():
        d = [x[key] for x in m]
        s = [x["rewards/rm_tiny-rm/mean"] for x in m]
        means[name] = (statistics.fmean(d[:10]), statistics.fmean(d[-10:]))
        print(f"| {name} | {means[name][0]:.3f} | {means[name][1]:.3f} | {statistics.fmean(s[:10]):.3f} | "
              f"{statistics.fmean(s[-10:]):.3f} |")
    acc = [x[p + "accuracy_before"] for x in runs["updated"] if p + "accuracy_before" in x]
    held = [x[p + "accuracy"] for x in runs["updated"] if p + "accuracy" in x]
    loss = [x[p + "loss"] for x in runs["updated"] if p + "loss" in x]
    print(f"reward model accuracy on each period's fresh completions before its update: "
          f"{' '.join(f'{a:.2f}' for a in acc)}")
    print(f"after the update, on held-back groups: {' '.join(f'{a:.2f}' for a in held)}; loss {loss[0]:.3f} -> {loss[-1]:.3f}")
    (f0, f1), (u0, u1) = means["fixed"], means["updated"]
    print(f"digit_fraction first -> last 10 steps: fixed reward model {f0:.3f} -> {f1:.3f}, updated {u0:.3f} -> {u1:.3f}; "
          f"updated reward model's accuracy on fresh completions, first -> last 5 updates: "
          f"{statistics.fmean(acc[:5]):.2f} -> {statistics.fmean(acc[-5:]):.2f}")


if __name__ == "__main__":
    main()
