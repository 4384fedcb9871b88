"""The run folder's logs: metrics.jsonl (one record per step) and rollouts.jsonl (one per completion), written
append-only a line at a time, and their one reader, which every tool that looks at a run goes through; the
training console (a progress bar and a line every few steps).

A crash can cut the last line of a file in the middle; a resumed run drops the lines of steps after its
checkpoint (JsonlLog). Lines are split on "\n" only: str.splitlines() would also cut at U+2028 or U+0085,
which completions may hold.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS, ROLLOUTS = "metrics.jsonl", "rollouts.jsonl"


@dataclass
class Records:
    """What a JSONL log holds: its records, and the lines that are not records."""

    records: list[dict[str, Any]]  # JSON objects with the integer keys asked for, in file order
    bad: list[int]  # line numbers (1-based, from where reading began) of the other non-blank lines
    last: int  # the number of the last non-blank line: a crash cuts only that one
    end: int  # byte offset after the last line read: where to continue reading a growing file


def read_records(path: str | Path, required: tuple[str, ...] = ("step",), *, offset: int = 0,
                 complete_only: bool = False) -> Records:
    """The records of a run's JSONL file from byte `offset` on. `complete_only`: leave a last line without its
    newline (still being written) for the next call. A missing file holds nothing."""
    path = Path(path)
    if not path.exists():
        return Records([], [], 0, offset)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1 if complete_only else len(data)
    records, bad, last = [], [], 0
    for number, line in enumerate(data[:end].decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        last = number
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            r = None
        if isinstance(r, dict) and all(type(r.get(k)) is int for k in required):
            records.append(r)
        else:
            bad.append(number)
    return Records(records, bad, last, offset + end)


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every line stays standard JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlLog:
    """Append-only JSON-lines file, one record per line, flushed at every write.

    On resume from step k, records of steps > k (written after the checkpoint by a run that then
    died) are dropped, so the file reads as if the run had never been interrupted."""

    def __init__(self, path: Path, keep_through_step: int) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        records = read_records(path).records  # a line cut by a crash is left out
        kept = [r for r in records if r["step"] <= keep_through_step]
        self.dropped = len(records) - len(kept)  # the caller says so: a resume never rewinds the logs silently
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)
        self._f = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        self._f.write("".join(json.dumps(_clean(r), ensure_ascii=False) + "\n" for r in records))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# (metric key, label, format) shown in the one-line step summary, when present
CONSOLE_FIELDS = [
    ("reward", "reward", "{:.3f}"),
    ("reward_std", "±", "{:.3f}"),
    ("frac_reward_zero_std", "zero-std", "{:.2f}"),
    ("kl", "kl", "{:.4f}"),
    ("entropy", "ent", "{:.2f}"),
    ("clip_ratio/region_mean", "clip", "{:.3f}"),
    ("completions/mean_length", "len", "{:.1f}"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("time/step", "s/step", "{:.1f}"),
    ("eval/accuracy", "eval acc", "{:.3f}"),
]


def format_step_line(step: int, max_steps: int, m: dict[str, Any]) -> str:
    parts = [f"step {step}/{max_steps}"]
    parts += [f"{label} {fmt.format(m[k])}" for k, label, fmt in CONSOLE_FIELDS if isinstance(m.get(k), (int, float))]
    parts += [f"{k.split('/')[1]} {m[k]:.3f}" for k in m if k.startswith("rewards/") and k.endswith("/mean")]
    return " | ".join(parts)


class Console:
    """Live progress bar with ETA plus a compact line every `every` steps (main process only)."""

    def __init__(self, max_steps: int, start_step: int, every: int, enabled: bool) -> None:
        self.enabled, self.every, self.max_steps = enabled, every, max_steps
        if not enabled:
            return
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.console = RichConsole(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True,
        )
        self.task = self.progress.add_task("train", total=max_steps, completed=start_step)
        self.progress.start()

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False, soft_wrap=True)

    def completions(self, step: int, records: list[dict[str, Any]]) -> None:
        """A table of a step's first completions (logging.num_completions_to_print, TRL's log_completions)."""
        if not self.enabled or not records or step % self.every:
            return
        from rich.table import Table

        table = Table(title=f"step {step}: {len(records)} completions", show_lines=True)
        for column in ("prompt", "completion", "reward", "advantage"):
            table.add_column(column, overflow="fold")
        for r in records:
            prompt = r["prompt"] if len(r["prompt"]) <= 200 else "..." + r["prompt"][-197:]
            table.add_row(prompt, r["completion"], f"{r['reward']:.3f}", f"{r['advantage']:+.3f}")
        self.console.print(table)

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.progress.update(self.task, completed=step)
        if step % self.every == 0 or step == self.max_steps:
            self.console.print(format_step_line(step, self.max_steps, metrics), highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()


def open_run_logs(run_dir: Path, recipe, start_step: int, checkpoint_path: Path | None, changes: dict, accelerator):
    """The run's recipe.yaml, metrics.jsonl and rollouts.jsonl (main process; lines after `start_step` written by
    an interrupted run are dropped and counted), its trackers, and its console -> (metrics, rollouts, console)."""
    from grpo_cli.recipe.schema import flat_config, recipe_to_yaml
    from grpo_cli.run.folder import report_changes

    main = accelerator.is_main_process
    metrics_log = rollout_log = None
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "recipe.yaml").write_text(recipe_to_yaml(recipe))
        if changes:
            report_changes(run_dir, checkpoint_path, start_step + 1, changes)
        metrics_log = JsonlLog(run_dir / METRICS, start_step)
        if recipe.logging.rollouts:
            rollout_log = JsonlLog(run_dir / ROLLOUTS, start_step)
        for log in (metrics_log, rollout_log):
            if log is not None and log.dropped:  # written after the checkpoint by the run that was interrupted
                print(f"{log.path.name}: dropped {log.dropped} lines of steps after {start_step}, "
                      f"logged after the checkpoint {checkpoint_path} was saved")
    if recipe.logging.trackers:
        accelerator.init_trackers(recipe.name, config=flat_config(recipe.model_dump(mode="json")))
    return metrics_log, rollout_log, Console(recipe.train.max_steps, start_step, recipe.logging.every_steps, main)
