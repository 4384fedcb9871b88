"""`grpo print-recipe RECIPE [overrides]`: the resolved recipe, every default written out."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grpo_cli.commands import OVERRIDES, RECIPE


def command(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Print the fully resolved recipe, every default spelled out, as YAML.

    Example: grpo print-recipe recipes/quickstart.yaml algorithm.loss_type=grpo
    """
    from grpo_cli.recipe.files import load_recipe, recipe_to_yaml

    typer.echo(recipe_to_yaml(load_recipe(recipe, overrides or [])), nl=False)
