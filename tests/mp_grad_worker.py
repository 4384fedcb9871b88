"""Run by tests/trainer/test_distributed.py, alone or under `accelerate launch`: the accumulated gradient, the weights
and the metrics of one update on fixed rollouts.

    python tests/mp_grad_worker.py OUT CASES.json

Every process builds the same fixed B*G rollout and rewards, keeps its own rows (as the engine does), runs the
engine's update (mu accumulation windows) and, on the main process, saves the gradient of every window, the
weights after the update and the update's metrics (see `main`).
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

torch.set_num_threads(1)

from safetensors.torch import save_file  # noqa: E402

from grpo_cli.algo.advantages import compute_advantages  # noqa: E402
from grpo_cli.algo.distillation import TeacherTerm  # noqa: E402
from grpo_cli.datatypes import Rollout  # noqa: E402
from grpo_cli.recipe.files import load_recipe  # noqa: E402
from grpo_cli.trainer.engine import Engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
B, G, P, T = 3, 4, 7, 9  # 12 rows: with 2 processes group 1 (rows 4-7) spans both


def fixed_rollout(vocab: int, full_length: bool = False, split: bool = False) -> tuple[Rollout, torch.Tensor]:
    """B*G rows of random ids; completion lengths 1..T at random, or all T (`full_length`: every micro-batch then
    holds as many tokens, where TRL's per-micro-batch means equal the token mean of the whole window). `split`:
    episodes split where their history changed (grpo_cli/trainer/samples.py), the first half of the rows in two
    samples each (with 2 processes the first process has twice the other's samples)."""
    g = torch.Generator().manual_seed(1234)
    N = B * G
    prompt_ids = torch.randint(3, vocab, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[::3, :2] = 0  # some left padding
    completion_ids = torch.randint(3, vocab, (N, T), generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    if full_length:
        lengths = torch.full((N,), T)
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    rollout = Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, lengths == T, [""] * N, [""] * N)
    rewards = torch.rand(N, generator=g).round(decimals=1)
    if split:
        contexts = torch.randint(3, vocab, (N, P + 2), generator=g).tolist()
        rollout.segments = [[[int(n) // 2, contexts[r]]] if r < N // 2 and n >= 2 else []
                            for r, n in enumerate(lengths)]
    return rollout, rewards


def rows_of(rollout: Rollout, rows: range) -> Rollout:
    sl = slice(rows.start, rows.stop)
    tensors = {k: getattr(rollout, k)[sl] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")}
    return replace(rollout, **tensors, prompts=rollout.prompts[sl], completions=rollout.completions[sl],
                   segments=rollout.segments[sl] if rollout.segments is not None else None)


def capture_grads(e: Engine) -> list[dict[str, torch.Tensor]]:
    """Every accumulation window's gradient, before it is clipped (accelerate's clipping, wrapped on this engine)."""
    grads, clip = [], e.accelerator.clip_grad_norm_

    def capture(parameters, max_norm):
        grads.append({n: p.grad.detach().clone() for n, p in e.accelerator.unwrap_model(e.policy).named_parameters()})
        return clip(parameters, max_norm)

    e.accelerator.clip_grad_norm_ = capture
    return grads


def main(out: Path, cases: list[dict]) -> None:
    """Each case: {"name", "overrides" (of recipes/ci-tiny.yaml), "micro_batch_size", "full_length", "split"
    (optional), "teacher" (optional: a fixed teacher's log-probs, distillation's term added in the update)}: one
    PolicyUpdate of the fixed
    rollout; the main process writes OUT/<name>.safetensors (every window's gradient, `<window>.<param>`, and the
    weights after the update, `weights.<param>`) and OUT/<name>.json (the update's metrics)."""
    for case in cases:
        r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [
            f"train.prompts_per_step={B}", f"algorithm.num_generations={G}", "algorithm.num_iterations=2",
            "algorithm.beta=0.1", "train.learning_rate=0.05", "logging.rollouts=false",
            # one layout on both sides: auto picks it by each micro-batch's tokens, and 12 rows and 3 pick differently
            # (the same numbers to float rounding, which Adam's step amplifies past this test's bound)
            "train.packing=false",
            f"train.micro_batch_size={case['micro_batch_size']}", *case["overrides"],
        ])
        e = Engine(r, out / f"run-{case['name']}")
        grads = capture_grads(e)
        rollout, rewards = fixed_rollout(e.accelerator.unwrap_model(e.policy).config.vocab_size,
                                         case.get("full_length", False), case.get("split", False))
        adv = compute_advantages(rewards, G, r.algorithm.scale_rewards)[e.rows.start : e.rows.stop]
        local = rows_of(rollout, e.rows)
        term = None
        if case.get("teacher"):  # every row's teacher log-probs, this process's rows of them
            teacher = -5 * torch.rand(rollout.completion_ids.shape, generator=torch.Generator().manual_seed(7))
            term = TeacherTerm(teacher[e.rows.start : e.rows.stop], 0.5)
        metrics = e.update(local, adv, local.completion_mask.clone(), None, term).means(e.procs)
        if e.accelerator.is_main_process:
            weights = {f"weights.{n}": p.detach().clone() for n, p in e.accelerator.unwrap_model(e.policy).named_parameters()}
            save_file({**{f"{i}.{n}": g for i, window in enumerate(grads) for n, g in window.items()}, **weights},
                      str(out / f"{case['name']}.safetensors"))
            (out / f"{case['name']}.json").write_text(json.dumps(metrics))
        e.close()
    e.accelerator.end_training()  # destroys the process group before interpreter exit


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
