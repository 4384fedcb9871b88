"""`grpo inspect-rollouts`: selection and output (json, markdown, or a rich table) of a run's completions.

The records, their statistics and the markdown are rollouts.py's, the terminal tables rollouts_console.py's;
this module joins them. No torch import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from grpo_cli.errors import InspectError
from grpo_cli.views.rollouts import (
    METRICS,
    ROLLOUTS,
    Record,
    arrange,
    check_options,
    complete_steps,
    follow,
    follow_path,
    load_records,
    match_prompt,
    metrics_by_step,
    parse_where,
    read_from,
    resolve_step,
    reward_names,
    rollouts_path,
    select,
    skipped_note,
)
from grpo_cli.views.rollouts_markdown import render_markdown, render_prompt_markdown
from grpo_cli.views.rollouts_console import make_console, print_prompt_table, print_table


def show(fmt: str, shown: list[Record], records: list[Record], metrics: dict[int, Record], by_prompt: bool,
         one_line_json: bool = False) -> None:
    """Print `shown` (already selected and arranged) in `fmt`; `records` give whole-group and step stats."""
    if fmt == "json":
        typer.echo(json.dumps(shown, ensure_ascii=False, indent=None if one_line_json else 2))
    elif fmt == "markdown":
        typer.echo(render_prompt_markdown(shown, records) if by_prompt else render_markdown(shown, records, metrics))
    else:
        if by_prompt:
            print_prompt_table(make_console(), shown, records)
        else:
            print_table(make_console(), shown, records, metrics)


def run(run_dir: Path, step: Optional[str], group: Optional[int], sort: str, where: list[str], limit: Optional[int],
        fmt: str, follow_: bool, prompt: Optional[str], follow_timeout: Optional[float], poll_interval: float,
        ) -> None:
    """Everything `grpo inspect-rollouts` does, raising InspectError for people to read."""
    check_options(sort, fmt, follow_, prompt)
    # a run that has just started may not have its folder or rollouts.jsonl yet: --follow waits for them
    path = follow_path(run_dir) if follow_ else rollouts_path(run_dir)
    records, skipped, offset = read_from(path, 0) if follow_ else (*load_records(path), 0)
    if skipped:
        typer.echo(skipped_note(skipped), err=True)
    metrics = metrics_by_step(path.parent / METRICS)
    filters = [parse_where(w, reward_names(records)) for w in where]
    done = complete_steps(records, metrics)
    pool = [r for r in records if r["step"] in done] if follow_ else records
    if prompt is not None:
        pool = match_prompt(records, prompt)
        if not pool:
            raise InspectError(f"no prompt matches {prompt!r} (an integer matches data_index, text a substring)")
    wanted = resolve_step(pool, step or ("all" if prompt is not None else "last"))
    shown = arrange(select(pool, wanted, group, filters), sort, limit)
    if shown or (fmt == "json" and not follow_):  # --follow: a JSON line per step, none for no step
        show(fmt, shown, records, metrics, by_prompt=prompt is not None, one_line_json=follow_)
    elif not follow_:
        what = f"step {'all' if wanted is None else wanted}, group {'all' if group is None else group}"
        empty = f"no completions match ({what}, {len(filters)} --where)" if records else f"{ROLLOUTS} has no record yet"
        typer.echo(empty, err=True)
    if not follow_ and metrics and wanted is not None and wanted not in done:
        typer.echo(f"note: step {wanted} has no {METRICS} line: being written, or the run stopped mid-step", err=True)
    if follow_:
        typer.echo(f"{'following' if path.exists() else 'waiting for'} {path}{'' if path.exists() else ' ...'} "
                   "(Ctrl-C to stop)", err=True)

        def emit(s: int, step_records: list[Record]) -> None:
            new = arrange(select(step_records, s, group, filters), sort, limit)
            if new:
                show(fmt, new, step_records, metrics_by_step(path.parent / METRICS), by_prompt=False, one_line_json=True)

        follow(path, emit, records, offset, set(done), poll_interval, follow_timeout,
               note=lambda m: typer.echo(m, err=True))
