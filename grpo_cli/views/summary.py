"""What `grpo train` says when a run ends: how far the reward moved, the eval accuracy, where the run is, and the
commands that look at it next. Read from the run folder's metrics.jsonl (no torch). And whether a live progress bar
can be shown where the run prints."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from grpo_cli.run.logs import METRICS, read_records
from grpo_cli.views.run_metrics import RewardWindow, reward_windows, step_span


def live_bar_works(console: Any) -> bool:
    """A rich `console` can redraw a progress bar in place: a terminal, or Jupyter with ipywidgets (rich draws it in
    an Output widget there; without ipywidgets it would only warn). Elsewhere (a log file, a pipe) print lines."""
    if console.is_jupyter:
        import importlib.util

        return importlib.util.find_spec("ipywidgets") is not None
    return console.is_terminal


def reward_change(records: list[dict[str, Any]]) -> str | None:
    """'reward 0.188 (steps 1-10) -> 0.594 (steps 31-40)': the mean of the first and last reward windows, the same
    windows `grpo report`'s table gives."""
    first, last, _ = reward_windows(records)
    if first is None:
        return None

    def said(w: RewardWindow) -> str:
        return f"{w.mean:.3f} ({step_span(w.first_step, w.last_step)})"

    return f"reward {said(last)}" if first is last else f"reward {said(first)} -> {said(last)}"


def eval_line(records: list[dict[str, Any]]) -> str | None:
    evals = [(r["step"], r["eval/accuracy"]) for r in records if isinstance(r.get("eval/accuracy"), (int, float))]
    if not evals:
        return None
    return "eval accuracy " + ", ".join(f"{acc:.3f} (step {step})" for step, acc in evals[-4:])


def grpo_command(argv0: str, executable: str, cwd: Path, which=shutil.which) -> str:
    """How this shell reaches the grpo that runs now: `grpo` when PATH finds it, else the script's path (relative
    to `cwd` when under it: `.venv/bin/grpo` after `make demo`), else `PYTHON -m grpo_cli`. `argv0` is sys.argv[0]:
    the script, or the module's __main__.py under `python -m grpo_cli` (the script beside `executable` then)."""
    script = Path(argv0) if Path(argv0).name == "grpo" else Path(executable).parent / "grpo"
    on_path = which("grpo")
    if script.is_file() and on_path and os.path.realpath(on_path) == os.path.realpath(script):
        return "grpo"

    def shown(path: Path) -> str:
        path = Path(os.path.abspath(path))
        return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)

    if script.is_file():
        return shlex.quote(shown(script))
    return f"{shlex.quote(shown(Path(executable)))} -m grpo_cli"


def end_of_run(run_dir: Path, steps: int, checkpoint: Path | None) -> str:
    """The lines a finished run ends with. The commands name the run, not the recipe file: its checkpoints hold the
    recipe it trained with, overrides included."""
    records = read_records(run_dir / METRICS).records  # a missing file holds none
    run, grpo = shlex.quote(str(run_dir)), grpo_command(sys.argv[0], sys.executable, Path.cwd())
    lines = [f"done: {steps} step{'s' if steps != 1 else ''} in {run_dir}"]
    facts = [x for x in (reward_change(records), eval_line(records)) if x]
    if facts:
        lines.append("  " + "; ".join(facts))
    if checkpoint is not None:
        lines.append(f"  checkpoint {checkpoint}")
    lines.append("next:")
    if checkpoint is not None:
        lines.append(f"  {grpo} eval base {run}    # the model before and after, on the same problems")
    lines += [f"  {grpo} inspect-rollouts {run}    # what the policy wrote, group by group",
              f"  {grpo} report {run}    # curves and tables: {run_dir / 'report' / 'report.html'}"]
    if checkpoint is not None:
        lines.append(f"  {grpo} export {run} --merge models/{run_dir.name}    # a plain Hugging Face model folder")
    return "\n".join(lines)
