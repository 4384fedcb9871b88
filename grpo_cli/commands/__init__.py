"""One module per subcommand, each with a `command` function: its options, the checks that need no model,
then lazy imports of the work (grpo --help stays instant). Only grpo_cli/cli.py imports these modules.

The arguments several commands share are defined here once."""

import typer

RECIPE = typer.Argument(..., help="Path to a YAML recipe, e.g. recipes/quickstart.yaml.", show_default=False)
OVERRIDES = typer.Argument(
    None, help="Dotted overrides such as algorithm.beta=0.04 train.max_steps=50 data.files=my.jsonl. Values are YAML "
    "scalars or flow collections (0.3, null, [a, b], {k: v}); anything else (not valid YAML, a lone {column}, "
    "text with ': ') is taken as plain text, so 'data.template={question} Answer with a number.' works. "
    "Relative paths in overrides start at the working directory, those written in the recipe at the recipe's "
    "folder.", show_default=False)
