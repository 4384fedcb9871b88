"""`grpo convert-trl CONFIG.yaml [-o recipe.yaml]`: a `trl grpo --config` YAML -> a grpo recipe (grpo_cli/recipe/trl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    config: Path = typer.Argument(..., help="The YAML `trl grpo --config` reads (GRPOConfig fields, model and dataset "
                                  "arguments, reward_funcs; GRPOTrainer's environment_factory and tools as import "
                                  "paths).", show_default=False),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the recipe here (default: print it)."),
    num_processes: int = typer.Option(1, "--num-processes", min=1, help="Processes the TRL run used (accelerate "
                                      "launch): TRL's batch sizes are per device."),
    name: Optional[str] = typer.Option(None, "--name", help="The recipe's name (default: run_name or the model's)."),
) -> None:
    """Convert a TRL GRPO config into a complete grpo recipe.

    Every mapped field is written out, TRL's defaults included where they change what is learned (beta,
    loss_type, use_bias_correction_kl, learning rate, Adam's beta2, max_grad_norm, lengths), so the converted
    run trains the algorithm TRL would. The batch arithmetic is printed; fields that have no home are listed
    with the reason. A field TRL does not have at all exits 2.

    Examples:

      grpo convert-trl grpo.yaml -o recipes/from-trl.yaml

      grpo convert-trl grpo.yaml --num-processes 8
    """
    import yaml
    from pydantic import ValidationError

    from grpo_cli.errors import ConversionError, RecipeError
    from grpo_cli.preflight import resolve
    from grpo_cli.recipe.files import format_validation_error
    from grpo_cli.recipe.schema import Recipe
    from grpo_cli.recipe.trl import convert, unknown_fields
    from grpo_cli.recipe.trl_fields import TRL_VERSION

    try:
        data = yaml.safe_load(config.read_text())
    except OSError as e:
        raise ConversionError(f"cannot read {config}: {e}") from None
    except yaml.YAMLError as e:
        raise ConversionError(f"{config}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{config}: a TRL config is a YAML mapping of fields")
    unknown = unknown_fields(data)

    def owns_reward(path: str) -> bool:  # TRL adds an environment's get_reward as a reward
        from grpo_cli.agents.environments import resolve_environment

        try:
            return callable(getattr(resolve_environment(path), "get_reward", None))
        except ValueError as e:
            raise ConversionError(f"environment_factory: {e}") from None

    try:
        result = convert(data, num_processes=num_processes, name=name, owns_reward=owns_reward)
    except ConversionError as e:  # a field it misses may be one of them, misspelt: name them too
        also = "\nand it has fields TRL does not know:\n" + "\n".join(unknown) if unknown else ""
        raise ConversionError(f"{config}: {e}{also}") from None
    if unknown:
        raise ConversionError(f"{config} has fields TRL does not know:\n" + "\n".join(unknown))
    try:  # the user's own reward functions may live in a module this machine cannot import: the rest must validate
        unresolved = resolve(Recipe.model_validate(result.recipe), elsewhere=True).unresolved
    except ValidationError as e:
        raise ConversionError(f"the converted recipe does not validate:\n{format_validation_error(e)}") from None
    except RecipeError as e:  # what a name stands for: the preflight's message has the same form
        raise ConversionError(f"the converted recipe does not validate:\n{e}") from None
    if unresolved:
        result.notes.append(f"cannot check here: {'; '.join(unresolved.values())}; the recipe is written as converted: "
                            "`grpo validate` checks the reward where its module can be imported")
    text = yaml.safe_dump(result.recipe, sort_keys=False, allow_unicode=True)
    header = f"# converted from {config} (TRL {TRL_VERSION}) by `grpo convert-trl`\n"
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    for key, value, why in result.unmapped:
        typer.echo(f"not mapped: {key} = {value!r}: {why}", err=True)
    if output is None:
        typer.echo(header + text.rstrip("\n"))
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(header + text)
        typer.echo(f"wrote {output}", err=True)
