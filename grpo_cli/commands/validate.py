"""`grpo validate RECIPE [overrides]`: every check that needs no model, exit 0 or 2."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grpo_cli.commands import OVERRIDES, RECIPE


def command(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Validate a recipe (and overrides) and exit: 0 if valid, 2 with the bad fields otherwise.

    Checks without loading a model: every field, reward names and files, the data files (they exist and
    parse; their first rows hold the prompt column or the template's placeholders and the answer column),
    a generator's kwargs, dataset folders and hub datasets (their metadata or first row; offline, from the
    cache), the reward functions' parameters against the columns, a local model path.

    Example: grpo validate recipes/gsm8k.yaml algorithm.num_generations=16
    """
    from grpo_cli.data.checks import check_data
    from grpo_cli.data.epochs import with_epoch_steps
    from grpo_cli.preflight import resolve
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.process.hub import hub_names, work_offline_if_unreachable

    r = load_recipe(recipe, overrides or [])
    resolve(r)
    work_offline_if_unreachable(hub_names(r), lambda line: typer.echo(f"note: {line}"))
    for note in check_data(r):
        typer.echo(f"note: {note}")
    r = with_epoch_steps(r)
    typer.echo(f"{recipe}: ok ({r.name}: {r.algorithm.loss_type}, G={r.algorithm.num_generations}, "
               f"{r.train.max_steps} steps of {r.train.prompts_per_step} prompts)")
