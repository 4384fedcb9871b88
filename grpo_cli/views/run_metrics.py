"""A run folder's metrics as data for `grpo report`: the records of metrics.jsonl, series of one metric, the
reward's windows and the summary numbers, the steps its resumes started at. Pure functions; no torch, no matplotlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_cli.errors import ReportError
from grpo_cli.run.logs import METRICS, RESUMES, read_records

TIME_KEYS = ("time/generate", "time/score", "time/train")


@dataclass(frozen=True)
class Run:
    label: str  # legend label: folder name, or recipe name when folder names collide
    path: Path
    records: list[dict[str, Any]]
    resumes: tuple[int, ...] = ()  # the steps a resume started at (resumes.jsonl), marked on every plot


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl in file order (grpo_cli/run/logs.py reads them).

    A cut last line (a run killed mid-write) is skipped; a bad line anywhere else is an error,
    because then the file is not what `grpo train` writes."""
    lines = read_records(path)
    bad = [n for n in lines.bad if n != lines.last]
    if bad:
        raise ReportError(f"{path}, line {bad[0]}: not a metrics record (a JSON object with an integer step); "
                          "fix or delete that line")
    return lines.records


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; records where it is missing, null or not a number are dropped."""
    pairs = [(r["step"], float(r[key])) for r in records if _is_number(r.get(key))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def aligned(records: list[dict[str, Any]], keys: list[str]) -> tuple[list[float], list[list[float]]]:
    """(steps, one value list per key) over the records where every key holds a number."""
    rows = [r for r in records if keys and all(_is_number(r.get(k)) for k in keys)]
    return [r["step"] for r in rows], [[float(r[k]) for r in rows] for k in keys]


def stack_layers(records: list[dict[str, Any]]) -> tuple[list[float], dict[str, list[float]]]:
    """Step-time layers to stack: generate / score / train (those the run logs) and `other`,
    the rest of time/step (weight sync, logging, checkpoints) when there is any."""
    keys = [k for k in TIME_KEYS if series(records, k)[0]]
    steps, cols = aligned(records, keys)
    layers = {k.split("/", 1)[1]: col for k, col in zip(keys, cols)}
    totals = {r["step"]: float(r["time/step"]) for r in records if _is_number(r.get("time/step"))}
    other = [max(0.0, totals[s] - sum(c[i] for c in cols)) if s in totals else 0.0 for i, s in enumerate(steps)]
    if any(other):
        layers["other"] = other
    return steps, layers


def _mean(xs: list[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def reward_window(n: int, window: int = 10) -> int:
    """How many steps a reward mean spans, of a run with `n` rewards: `window`, or a quarter of a run shorter
    than 4 windows (one step below 8). The end-of-run line, the report's table and its moving averages use it."""
    return max(1, min(window, n // 4 or 1))


def step_span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def moving_average(steps: list[float], values: list[float], w: int) -> tuple[list[float], list[float]]:
    """The mean of each `w` consecutive values, at the step that ends the window (full windows only)."""
    means = [sum(values[i - w + 1:i + 1]) / w for i in range(w - 1, len(values))]
    return steps[w - 1:], means


@dataclass(frozen=True)
class RewardWindow:
    mean: float
    first_step: int
    last_step: int

    def __str__(self) -> str:
        return f"{fmt_number(self.mean)} ({step_span(self.first_step, self.last_step)})"


def reward_windows(records: list[dict[str, Any]]) -> tuple[Optional[RewardWindow], ...]:
    """(the first, the last and the best window of the reward), each the mean over `reward_window` steps: one
    step's reward of a few prompts is mostly noise, so the table compares means over the same span."""
    steps, reward = series(records, "reward")
    if not reward:
        return None, None, None
    w = reward_window(len(reward))
    ends, means = moving_average(steps, reward, w)
    windows = [RewardWindow(mean, int(first), int(last)) for mean, first, last in zip(means, steps, ends)]
    return windows[0], windows[-1], max(windows, key=lambda x: x.mean)


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers of the summary table; None where the run did not log what a number needs."""
    _, step_time = series(records, "time/step")
    _, eval_acc = series(records, "eval/accuracy")
    start, end, best = reward_windows(records)
    return {
        "steps": max(r["step"] for r in records) if records else 0,
        "start_reward": start,
        "end_reward": end,
        "best_reward": best,
        "last_eval_accuracy": eval_acc[-1] if eval_acc else None,
        "total_time_s": sum(step_time) if step_time else None,
        "mean_step_time_s": _mean(step_time),
    }


def present_keys(runs: list[Run]) -> set[str]:
    """Every metric that holds a number in at least one record of at least one run."""
    return {k for run in runs for r in run.records for k, v in r.items() if _is_number(v)}

# ------------------------------------------------------------------------------------------ runs


def recipe_name(run_dir: Path) -> Optional[str]:
    """`name:` of the run's saved recipe.yaml, or None when there is none to read."""
    import yaml

    try:
        name = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8")).get("name")
    except (OSError, AttributeError, yaml.YAMLError):
        return None
    return str(name) if name else None


def run_labels(paths: list[Path], recipe_names: list[Optional[str]]) -> list[str]:
    """Folder names; if two collide, recipe names; then parent/folder; then numbered."""
    options = ([p.name for p in paths],
               [n or p.name for p, n in zip(paths, recipe_names)],
               [f"{p.parent.name}/{p.name}" for p in paths])
    for labels in options:
        if len(set(labels)) == len(labels):
            return labels
    return [f"{lab} ({i})" for i, lab in enumerate(options[-1], 1)]


def load_run_records(run_dir: Path) -> list[dict[str, Any]]:
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder")
    path = run_dir / METRICS
    if not path.is_file():
        raise ReportError(f"{run_dir} has no {METRICS}: pass a run folder written by `grpo train`")
    records = load_metrics(path)
    if not records:
        raise ReportError(f"{path} holds no step records yet: has the run finished its first step?")
    return records


def resume_steps(run_dir: Path) -> tuple[int, ...]:
    """The steps the run's resumes started at (resumes.jsonl; none when the run never resumed)."""
    rows = read_records(run_dir / RESUMES, required=("from_step",)).records
    return tuple(sorted({int(r["from_step"]) for r in rows}))


def load_runs(run_dirs: list[Path]) -> list[Run]:
    paths = [p.resolve() for p in run_dirs]
    records = [load_run_records(p) for p in paths]
    labels = run_labels(paths, [recipe_name(p) for p in paths])
    return [Run(lab, p, recs, resume_steps(p)) for lab, p, recs in zip(labels, paths, records)]


def fmt_number(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.4g}"


def fmt_seconds(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v < 120:
        return f"{v:.1f} s"
    return f"{v / 60:.1f} min" if v < 7200 else f"{v / 3600:.2f} h"
