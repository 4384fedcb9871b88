"""The held-out problems of an evaluation as a data section: what `grpo eval` loads, and what `grpo validate` checks
before a run whose recipe has an eval section."""

from __future__ import annotations

from typing import Any

from grpo_cli.recipe.schema import DataConfig, EvalConfig, Recipe


def eval_data_config(recipe: Recipe, cfg: EvalConfig) -> DataConfig:
    """The held-out data: eval.files, eval.dataset (+ eval.config, eval.split), the eval split of
    data.dataset, or else the training data itself (files) or the generator under another seed."""
    d = recipe.data
    update: dict[str, Any] = {"limit": cfg.limit, "shuffle": False, "seed": cfg.seed}
    if cfg.files:
        update.update(files=cfg.files, dataset=None, generator=None)
    elif cfg.dataset:
        same = cfg.dataset == d.dataset
        update.update(dataset=cfg.dataset, config=cfg.config or (d.config if same else None), split=cfg.split,
                      files=None, generator=None)
    elif d.dataset:
        update.update(split=cfg.split, config=cfg.config or d.config)
    elif d.generator:
        kwargs = {k: v for k, v in d.generator_kwargs.items() if k != "seed"}
        update["generator_kwargs"] = {**kwargs, "size": cfg.limit}
    return d.model_copy(update=update)
