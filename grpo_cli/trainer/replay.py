"""`grpo replay RUN --step N [key=value ...]`: step N's update again, from the checkpoint before it and the recorded
batches (grpo_cli/run/replays.py), without generating.

The run's own recipe, with the overrides, builds an Engine that resumes from the newest checkpoint before step N
(or starts from the base model when there is none: the state before step 1) in a folder of its own; each recorded
step from there to N goes through `Engine.train_step`, the engine built with the recorded rollouts
(grpo_cli/rollout/recorded.py). Without overrides the result is the original run's: its loss and gradient norm,
and, where the run kept a checkpoint at step N, its weights (byte for byte on the CPU). With overrides it shows how
the same data would have moved the model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_cli.errors import RunFolderError

COMPARED = ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "kl", "advantages/abs_mean", "reward")
SAMPLER = {("rollout", "backend"): "hf", ("logging", "trackers"): []}  # nothing samples, nothing reports to a tracker


@dataclass
class ReplayResult:
    step: int
    start: str  # the checkpoint it resumed from, or "the base model"
    steps: list[int]  # the steps it replayed, up to `step`
    out: Path
    rows: list[tuple[str, float | None, float | None]] = field(default_factory=list)  # metric, original, replayed
    weights: str = ""  # how the weights compare with the run's checkpoint at `step`
    equal: bool | None = None  # every compared metric and weight equal (None: nothing to compare)


def replay(run_dir: Path, step: int, overrides: list[str], out: Path | None = None, say=print) -> ReplayResult:
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.rollout.recorded import recorded_rollouts
    from grpo_cli.run import lock
    from grpo_cli.run.checkpoints import list_checkpoints, step_of
    from grpo_cli.run.replays import processes_of, recorded_steps
    from grpo_cli.trainer.engine import Engine

    run_dir = Path(run_dir)
    recorded = set(recorded_steps(run_dir))
    if step not in recorded:
        have = sorted(recorded)
        raise RunFolderError(f"{run_dir} has no record of step {step} to replay"
                             + (f" (it holds steps {have[0]}-{have[-1]})" if have else
                                " (nothing recorded: a run with logging.replay true records each step)"))
    if processes_of(run_dir, step) != 1:
        raise RunFolderError(f"step {step} of {run_dir} was trained by {processes_of(run_dir, step)} processes; "
                             "replaying a multi-process step is not supported yet")
    before = [c for c in list_checkpoints(run_dir) if step_of(c) < step]
    start = before[-1] if before else None
    first = step_of(start) + 1 if start is not None else 1
    missing = [t for t in range(first, step + 1) if t not in recorded]
    if missing:
        raise RunFolderError(f"replaying step {step} from {start.name if start else 'the base model'} needs the records "
                             f"of steps {first}-{step}; missing: {', '.join(map(str, missing))}")
    recipe = load_recipe(run_dir / "recipe.yaml", overrides)
    changed = [f"{a}.{b}={_yaml(v)}" for (a, b), v in SAMPLER.items() if getattr(getattr(recipe, a), b) != v]
    if changed:
        recipe = load_recipe(run_dir / "recipe.yaml", [*overrides, *changed])
    out = out or run_dir / "replays" / f"step-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    held = lock.acquire(out)  # the replay's own folder: one writer
    try:
        engine = Engine(recipe, out, resume=str(start) if start is not None else None, allow_recipe_change=True,
                        rollouts=recorded_rollouts(run_dir), record=False)  # the records are the run's
        try:
            result = _replayed(engine, run_dir, step, first, start, out)
        finally:
            engine.close(end_distributed=True)
    finally:
        lock.release(held)
    return result


def _replayed(engine, run_dir: Path, step: int, first: int, start: Path | None, out: Path) -> ReplayResult:
    """Steps `first` to `step` through the engine; -> the comparison with the original run."""
    from grpo_cli.views.run_metrics import load_run_records

    metrics: dict = {}
    for t in range(first, step + 1):
        metrics = engine.train_step(t)
        engine.log(t, metrics)
    policy = engine.accelerator.unwrap_model(engine.policy)
    result = ReplayResult(step, start.name if start is not None else "the base model", list(range(first, step + 1)), out)
    original = {r["step"]: r for r in load_run_records(run_dir)}.get(step, {})
    for key in COMPARED:
        if key in original or key in metrics:
            result.rows.append((key, original.get(key), metrics.get(key)))
    result.weights, same_weights = compare_weights(policy, run_dir, step)
    same_metrics = all(_same(a, b) for _, a, b in result.rows)
    result.equal = same_metrics and same_weights is not False
    return result


def _yaml(v) -> str:
    import json

    return "null" if v is None else json.dumps(v)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def compare_weights(policy, run_dir: Path, step: int) -> tuple[str, bool | None]:
    """The replayed policy against the run's checkpoint at `step`: -> (a line, equal or None when there is none)."""
    import torch
    from safetensors.torch import load_file

    from grpo_cli.models.lora import weights_file
    from grpo_cli.run.checkpoints import CHECKPOINTS

    folder = run_dir / CHECKPOINTS / f"step-{step}"
    saved_file = weights_file(folder)
    if saved_file is None:
        return f"no checkpoint at step {step} to compare the weights with", None
    saved = load_file(str(saved_file))
    if saved_file.name.startswith("adapter"):
        from peft import get_peft_model_state_dict

        mine = get_peft_model_state_dict(policy)
    else:
        mine = policy.state_dict()
    common = [k for k in saved if k in mine]
    if not common:
        return f"no tensor of {saved_file} matches the replayed model's names", False
    unequal = [k for k in common if not torch.equal(saved[k], mine[k].detach().cpu().to(saved[k].dtype))]
    if not unequal:
        return f"equal to {folder.name}'s, byte for byte ({len(common)} tensors)", True
    worst = max((saved[k].float() - mine[k].detach().cpu().float()).abs().max().item() for k in unequal)
    return f"{len(unequal)} of {len(common)} tensors differ from {folder.name}'s (largest difference {worst:.3g})", False


def replay_text(result: ReplayResult, run_dir: Path, overrides: list[str]) -> str:
    span = f"step {result.step}" if len(result.steps) == 1 else f"steps {result.steps[0]}-{result.step}"
    lines = [f"replayed {span} of {run_dir} from {result.start}, nothing generated"
             + (f"; overrides: {' '.join(overrides)}" if overrides else ""),
             f"{'metric':24} {'original':>14} {'replayed':>14}  difference"]
    for key, a, b in result.rows:
        diff = "" if a is None or b is None else ("equal" if _same(a, b) else f"{b - a:+.3g}")
        lines.append(f"{key:24} {_fmt(a):>14} {_fmt(b):>14}  {diff}")
    lines.append(f"weights: {result.weights}")
    lines.append(f"the replay's metrics: {result.out / 'metrics.jsonl'}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.6g}"
