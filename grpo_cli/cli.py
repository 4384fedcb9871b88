"""The `grpo` command line. Thin and lazy: parse, validate the recipe, then import torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="grpo",
    help="Fine-tune language models with GRPO and its variants (Dr. GRPO, DAPO, GSPO, CISPO, SAPO).\n\n"
    "Examples:\n\n"
    "  grpo train recipes/quickstart.yaml\n\n"
    "  grpo train recipes/gsm8k.yaml algorithm.loss_type=dr_grpo train.max_steps=200\n\n"
    "  grpo print-recipe recipes/ci-tiny.yaml algorithm.beta=0.04",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

RECIPE = typer.Argument(..., help="Path to a YAML recipe, e.g. recipes/quickstart.yaml.", show_default=False)
OVERRIDES = typer.Argument(None, help="Dotted overrides such as algorithm.beta=0.04 train.max_steps=50.", show_default=False)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(recipe: Path, overrides: Optional[list[str]]):
    from grpo_cli.recipe import RecipeError, load_recipe

    try:
        return load_recipe(recipe, overrides or [])
    except RecipeError as e:
        _fail(str(e))


@app.command()
def validate(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Validate a recipe (and overrides) and exit: 0 if valid, 2 with the bad fields otherwise.

    Example: grpo validate recipes/gsm8k.yaml algorithm.num_generations=16
    """
    r = _load(recipe, overrides)
    typer.echo(f"{recipe}: ok ({r.name}: {r.algorithm.loss_type}, G={r.algorithm.num_generations}, "
               f"{r.train.max_steps} steps of {r.train.prompts_per_step} prompts)")


@app.command("print-recipe")
def print_recipe(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Print the fully resolved recipe, every default spelled out, as YAML.

    Example: grpo print-recipe recipes/quickstart.yaml algorithm.loss_type=grpo
    """
    from grpo_cli.recipe import recipe_to_yaml

    typer.echo(recipe_to_yaml(_load(recipe, overrides)), nl=False)


@app.command()
def train(
    recipe: Path = RECIPE,
    overrides: Optional[list[str]] = OVERRIDES,
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="Run folder (default: logging.output_dir or runs/<name>)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="`auto`: newest complete checkpoint of the run folder; or a checkpoint path."),
) -> None:
    """Train with GRPO. Writes metrics.jsonl, rollouts.jsonl and checkpoints/step-N/ under the run folder.

    Examples:

      grpo train recipes/ci-tiny.yaml train.max_steps=5 -o runs/try

      grpo train recipes/ci-tiny.yaml -o runs/try --resume auto train.max_steps=10
    """
    r = _load(recipe, overrides)
    run_dir = output_dir or Path(r.output_dir)
    import logging

    from rich.logging import RichHandler

    # our own modules speak at INFO (e.g. the one-time GGUF conversion); libraries stay at WARNING
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[RichHandler(show_path=False)])
    logging.getLogger("grpo_cli").setLevel(logging.INFO)
    from grpo_cli.checkpoint import CheckpointError
    from grpo_cli.data import DataError
    from grpo_cli.engine import Engine, SetupError
    from grpo_cli.models import ModelLoadError
    from grpo_cli.rewards import RewardError

    try:
        engine = Engine(r, run_dir, resume=resume)
        step = engine.fit()
    except (CheckpointError, DataError, ModelLoadError, RewardError, SetupError) as e:
        _fail(str(e), code=1)
    except KeyboardInterrupt:
        typer.echo("interrupted; the last checkpoint is intact (resume with --resume auto)", err=True)
        raise typer.Exit(130)
    if engine.stop_requested:
        raise typer.Exit(143)
    if engine.accelerator.is_main_process:
        typer.echo(f"done: {step} steps in {run_dir}")


def main() -> None:
    app(prog_name="grpo")


if __name__ == "__main__":
    main()
    sys.exit(0)
