"""`grpo replay RUN --step N [key=value ...]`: step N's update again from its recorded batch (grpo_cli/trainer/replay.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    run_dir: Path = typer.Argument(..., help="A run folder written by `grpo train` (with logging.replay on).",
                                   show_default=False),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value changes to the run's recipe, e.g. "
                                                    "algorithm.loss_type=grpo algorithm.beta=0.04.", show_default=False),
    step: int = typer.Option(..., "--step", min=1, help="The step whose update to run again."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the replay's metrics (default: "
                                       "RUN/replays/step-N-<time>)."),
) -> None:
    """Run step N's update again, from the checkpoint before it and the step's recorded rollouts, without
    generating. Without overrides the loss, gradient norm and weights equal the original run's (byte for byte on
    the CPU; exit 1 if they do not); with overrides, how the same data would have moved the model.

    Examples:

      grpo replay runs/quickstart --step 12

      grpo replay runs/quickstart --step 12 algorithm.loss_type=grpo algorithm.beta=0.04
    """
    from grpo_cli.trainer.replay import replay, replay_text

    result = replay(run_dir, step, list(overrides or []), out)
    typer.echo(replay_text(result, run_dir, list(overrides or [])))
    if not overrides and result.equal is False:
        typer.echo("error: the replay did not reproduce the original step (see the differences above)", err=True)
        raise typer.Exit(1)
