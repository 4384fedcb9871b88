"""What `grpo eval` evaluates: `base` (the recipe's model), a run folder (its newest checkpoint), a checkpoint (LoRA:
its base and adapter), a model folder or a hub id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_cli.errors import UsageError
from grpo_cli.recipe.schema import ModelConfig, Recipe


@dataclass
class Target:
    spec: str  # what the user typed
    model: ModelConfig
    recipe: Recipe | None  # the one saved with a checkpoint, if any
    adapter: Path | None = None  # a LoRA checkpoint: `model` is then its base


def resolve_target(spec: str, recipe: Recipe | None) -> Target:
    """`base` (the recipe's own model), a run folder (its newest checkpoint), a checkpoint, a model folder or hub id."""
    from grpo_cli.models.lora import is_adapter_checkpoint
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.run.checkpoints import is_checkpoint, newest_if_run_folder, recipe_path, verify_checkpoint

    if spec == "base":
        if recipe is None:
            raise UsageError("target `base` means the recipe's model: give --recipe or a checkpoint target too")
        return Target(spec, recipe.model, recipe)
    path = newest_if_run_folder(spec)
    if is_checkpoint(path):
        verify_checkpoint(path)  # as --resume and export do: a corrupted checkpoint is never evaluated
        saved = load_recipe(recipe_path(path))
        if is_adapter_checkpoint(path):  # LoRA: base + adapter
            return Target(spec, saved.model, saved, adapter=path)
        model = saved.model.model_copy(update={"name_or_path": str(path), "gguf_file": None, "revision": None})
        return Target(spec, model, saved)
    base = recipe.model if recipe is not None else ModelConfig(name_or_path=spec)
    return Target(spec, base.model_copy(update={"name_or_path": spec, "gguf_file": None, "revision": None}), None)
