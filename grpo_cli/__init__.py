"""grpo: fine-tune language models with GRPO and its variants (Dr. GRPO, DAPO, GSPO, CISPO, SAPO).

From Python (grpo_cli/api.py): `grpo_cli.train(recipe, rewards=[fn], dataset=rows)`, `grpo_cli.evaluate(...)`,
`grpo_cli.export(...)`, `grpo_cli.load_recipe(...)`. Importing this package must stay cheap: no torch, no
transformers (`grpo --help` is instant); the API loads on first use.
"""

__version__ = "0.1.0"
__all__ = ["train", "evaluate", "export", "load_recipe", "TrainResult", "EvalResult", "UserError"]


def __getattr__(name: str):
    if name == "UserError":
        from grpo_cli.errors import UserError

        return UserError
    if name == "load_recipe":  # a YAML path, a dict of sections or a Recipe, with key=value overrides
        from grpo_cli.recipe.files import load_recipe

        return load_recipe
    if name in __all__:
        from grpo_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'grpo_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What `dir(grpo_cli)` and a notebook's completion list: the API, loaded or not."""
    return sorted({*globals(), *__all__})
