"""`grpo report RUN...`: plots and one self-contained report.html (grpo_cli/views/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by `grpo train` (each holds metrics.jsonl).",
                                          show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default: RUN_DIR/report for one run, "
                                       "./report for several)."),
) -> None:
    """Plot a run's metrics (or overlay several runs) into PNGs and one self-contained report.html, with the
    verdicts of `grpo audit` at the top.

    Panels: reward and accuracy (train, eval), each reward function, KL, entropy, clip ratios,
    completion length, grad norm, learning rate, step-time breakdown; and a summary table per run.

    Examples:

      grpo report runs/quickstart

      grpo report runs/quickstart runs/dapo-try --out /tmp/compare
    """
    from grpo_cli.errors import UserError
    from grpo_cli.views.audit import audit, headline
    from grpo_cli.views.report import skipped_text, text_table, write_report
    from grpo_cli.views.run_metrics import load_runs

    runs = load_runs(run_dirs)
    audits = [(r.label, audit(r.path)) for r in runs]
    target = out or (run_dirs[0] / "report" if len(run_dirs) == 1 else Path("report"))
    try:
        files, skipped, rows = write_report(runs, target, audits)
    except OSError as e:
        raise UserError(f"cannot write the report to {target}: {e}") from None
    for (label, verdicts), run in zip(audits, runs):  # the verdicts first: what to look at in the table and plots
        typer.echo(headline(verdicts, label if len(runs) > 1 else None, run.path))
    typer.echo(text_table(rows))
    if skipped:
        typer.echo(f"not plotted, no run logged them: {skipped_text(skipped)}")
    typer.echo(f"wrote {len(files) - 1} plots and {files[-1]}")
