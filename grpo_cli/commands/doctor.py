"""`grpo doctor RECIPE [overrides]`: a preflight before a long job (grpo_cli/doctor/); exit 0, 1 (warnings), 2 (will fail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from grpo_cli.commands import OVERRIDES, RECIPE


def command(
    recipe: Path = RECIPE,
    overrides: Optional[list[str]] = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="One JSON object: the verdicts, each with its evidence."),
    num_processes: int = typer.Option(1, "--num-processes", min=1, help="The processes the run will train on."),
    resume_check: int = typer.Option(0, "--resume-check", min=0, metavar="N",
                                     help="Also train N steps straight and N/2 + resume + N/2 and compare (0: skip)."),
) -> None:
    """Check a recipe before a long job: versions, batch arithmetic, the first prompt as the model sees it, every
    reward on the data's own answers, and with --resume-check N that resume is exact on this machine.

    Exit 0: ready; 1: warnings; 2: the run would fail.

    Examples:

      grpo doctor recipes/quickstart.yaml

      grpo doctor recipes/gsm8k.yaml --num-processes 8 --json

      grpo doctor recipes/ci-tiny.yaml --resume-check 4
    """
    from grpo_cli.doctor.diagnose import diagnose
    from grpo_cli.views.verdicts import exit_code, verdicts_text

    verdicts = diagnose(recipe, list(overrides or []), num_processes, resume_check,
                        say=lambda line: typer.echo(f"note: {line}", err=True))
    code = exit_code(verdicts)
    if as_json:
        typer.echo(json.dumps({"recipe": str(recipe), "exit_code": code, "verdicts": [v.to_json() for v in verdicts]},
                              indent=1))
    else:
        typer.echo(verdicts_text(f"doctor: {recipe}", verdicts))
    raise typer.Exit(code)
