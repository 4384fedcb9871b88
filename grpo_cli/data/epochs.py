"""train.epochs: the step count of a run given in passes over its data (TRL's num_train_epochs)."""

from __future__ import annotations

import math

from grpo_cli.errors import RecipeError


def with_epoch_steps(recipe):
    """The recipe with train.max_steps = ceil(epochs x rows / prompts_per_step) where only train.epochs is given,
    rows the training data's after data.limit (read once here); unchanged where max_steps is set. RecipeError for a
    stream, whose size is not known ahead."""
    t = recipe.train
    if t.max_steps is not None:
        return recipe
    if recipe.data.streaming:
        raise RecipeError("train.epochs: data.streaming reads rows whose count is not known ahead; give train.max_steps")
    from grpo_cli.data.sources import load_rows

    rows = len(load_rows(recipe.data, t.seed))
    steps = max(1, math.ceil(t.epochs * rows / t.prompts_per_step))
    return recipe.model_copy(update={"train": t.model_copy(update={"max_steps": steps})})
