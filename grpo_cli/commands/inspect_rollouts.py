"""`grpo inspect-rollouts RUN`: options; the work is grpo_cli/views/inspect_rollouts.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grpo_cli.views.rollouts import FIELDS

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
    from grpo_cli.views.inspect_rollouts import run

    try:
        run(run_dir, step, group, sort, where or [], limit, fmt, follow_, prompt, follow_timeout, poll_interval)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
