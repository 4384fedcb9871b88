"""The `grpo inspect-rollouts` command: options, selection and output (json, markdown, or a rich table).

The records, their statistics and the markdown live in inspect_rollouts.py, the terminal tables in
inspect_console.py; this module joins them (neither imports the other's caller). No torch import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from grpo_cli.views.rollouts_console import make_console, print_prompt_table, print_table
from grpo_cli.views.rollouts import (
    FIELDS, METRICS, ROLLOUTS, InspectError, Record, arrange, check_options, complete_steps, follow, follow_path,
    load_metrics, load_records, match_prompt, parse_where, read_from, render_markdown, render_prompt_markdown,
    resolve_step, reward_names, rollouts_path, select, skipped_note,
)


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
    """Everything `command` does, raising InspectError for people to read."""
    check_options(sort, fmt, follow_, prompt)
    # a run that has just started may not have its folder or rollouts.jsonl yet: --follow waits for them
    path = follow_path(run_dir) if follow_ else rollouts_path(run_dir)
    records, skipped, offset = read_from(path, 0) if follow_ else (*load_records(path), 0)
    if skipped:
        typer.echo(skipped_note(skipped), err=True)
    metrics = load_metrics(path.parent / METRICS)
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
                show(fmt, new, step_records, load_metrics(path.parent / METRICS), by_prompt=False, one_line_json=True)

        follow(path, emit, records, offset, set(done), poll_interval, follow_timeout,
               note=lambda m: typer.echo(m, err=True))


RUN_DIR = typer.Argument(..., help="Run folder written by `grpo train` (holds rollouts.jsonl).", show_default=False)
STEP = typer.Option(None, "--step", help="Step number, 'last' or 'all'. [default: last; all with --prompt]",
                    show_default=False)
GROUP = typer.Option(None, "--group", help="Only this group (the prompt's index within its step).", show_default=False)
SORT = typer.Option("reward", "--sort", help="Order within a group, descending: reward | advantage | length.")
WHERE = typer.Option(None, "--where", show_default=False, help="Filter like 'reward < 0.5' or 'rewards.accuracy == 1'; "
                     "repeat to AND; null never matches. Fields: " + ", ".join(FIELDS) + ", rewards.<name>.")
LIMIT = typer.Option(None, "--limit", min=1, help="At most N completions per group (after sorting).")
FORMAT = typer.Option("table", "--format", help="table | json (the selected records) | markdown (for an issue or PR).")
FOLLOW = typer.Option(False, "--follow", help="Keep reading a running run; print each step as it completes (Ctrl-C). "
                      "Waits for a run folder that does not exist yet.")
PROMPT = typer.Option(None, "--prompt", show_default=False,
                      help="One prompt across steps: an integer matches data_index, text a substring of the prompt.")
FOLLOW_TIMEOUT = typer.Option(None, "--follow-timeout", hidden=True, help="Stop --follow after S seconds.")
POLL_INTERVAL = typer.Option(1.0, "--poll-interval", hidden=True, help="Seconds between polls of --follow.")


def command(
    run_dir: Path = RUN_DIR, step: Optional[str] = STEP, group: Optional[int] = GROUP, sort: str = SORT,
    where: Optional[list[str]] = WHERE, limit: Optional[int] = LIMIT, fmt: str = FORMAT, follow_: bool = FOLLOW,
    prompt: Optional[str] = PROMPT, follow_timeout: Optional[float] = FOLLOW_TIMEOUT,
    poll_interval: float = POLL_INTERVAL,
) -> None:
    """Show a run's completions, grouped by prompt, with every reward, the advantage and group statistics.

    Statistics come from rollouts.jsonl itself; std is the sample std (n - 1, like torch.std).
    A line cut by a crash is skipped (and counted on stderr), so a running or crashed run reads fine.

    Examples (--limit counts completions per group; --where fields: reward, advantage, length,
    step, group, sample, truncated as 0/1, data_index, rewards.<name>):

    \b
      grpo inspect-rollouts runs/quickstart
      grpo inspect-rollouts runs/quickstart --step all --where 'reward < 0.5' --where 'truncated == 1'
      grpo inspect-rollouts runs/quickstart --step 12 --group 0 --sort length --limit 4
      grpo inspect-rollouts runs/quickstart --where 'rewards.accuracy == 1' --format json > good.json
      grpo inspect-rollouts runs/quickstart --format markdown > step.md
      grpo inspect-rollouts runs/quickstart --prompt 'What is 2 + 3'
      grpo inspect-rollouts runs/quickstart --follow
    """
    try:
        run(run_dir, step, group, sort, where or [], limit, fmt, follow_, prompt, follow_timeout, poll_interval)
    except InspectError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
