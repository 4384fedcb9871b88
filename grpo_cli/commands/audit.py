"""`grpo audit RUN`: verdicts on a run folder (grpo_cli/views/audit.py); exit 0 (no problem), 1 (warnings), 2 (failures)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def command(
    run_dir: Path = typer.Argument(..., help="A run folder written by `grpo train`, finished or running.",
                                   show_default=False),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: the verdicts, each with its evidence."),
) -> None:
    """Check a run for what goes wrong in GRPO runs, each verdict with its evidence and what to try.

    Reward rising while eval accuracy falls; one reward rising while the accuracy reward stays flat; entropy
    collapse (told apart from a policy growing confident as it learns); length drift and truncation; groups
    without signal (solved or failed); clipping, importance ratios and KL out of range; identical completions
    in a group. Exit 0: no problem; 1: warnings; 2: failures.

    Examples:

      grpo audit runs/quickstart

      grpo audit runs/quickstart --json
    """
    from grpo_cli.views.audit import audit, audit_text
    from grpo_cli.views.verdicts import exit_code
    from grpo_cli.views.run_metrics import load_run_records

    verdicts = audit(run_dir)
    code = exit_code(verdicts)
    if as_json:
        typer.echo(json.dumps({"run": str(run_dir), "exit_code": code, "verdicts": [v.to_json() for v in verdicts]},
                              indent=1))
    else:
        typer.echo(audit_text(verdicts, run_dir, max(r["step"] for r in load_run_records(run_dir))))
    raise typer.Exit(code)
