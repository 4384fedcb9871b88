"""The `grpo` command table: a name for every module of grpo_cli/commands.

The command modules import only typer and the standard library at the top (their work happens in lazy
imports inside), so `grpo --help` never imports torch. Every command runs through `people_facing`: a
`UserError` (grpo_cli/errors.py) becomes `error: <message>` on stderr and its exit code, no traceback.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import typer

from grpo_cli.commands import (
    audit,
    convert_trl,
    doctor,
    export,
    inspect_rollouts,
    print_recipe,
    replay,
    report,
    serve_vllm,
    train,
    validate,
)
from grpo_cli.commands import eval as eval_

COMMANDS = {  # name -> module; the order of `grpo --help`
    "train": train,
    "validate": validate,
    "doctor": doctor,
    "print-recipe": print_recipe,
    "eval": eval_,
    "inspect-rollouts": inspect_rollouts,
    "report": report,
    "audit": audit,
    "replay": replay,
    "export": export,
    "convert-trl": convert_trl,
    "serve-vllm": serve_vllm,
}

def whole_examples(doc: str | None) -> str | None:
    """Help text whose example commands (lines starting `grpo `) are never re-wrapped: click keeps a paragraph
    after a lone `\\b` line as written, so an example copies and pastes whole at any terminal width."""
    if not doc:
        return doc
    lines, out = doc.split("\n"), []
    for i, line in enumerate(lines):
        if line.strip().startswith("grpo ") and (i == 0 or not lines[i - 1].strip()):
            out.append(line[: len(line) - len(line.lstrip())] + "\b")
        out.append(line)
    return "\n".join(out)


app = typer.Typer(
    name="grpo",
    help=whole_examples("Fine-tune language models with GRPO and its variants (Dr. GRPO, DAPO, GSPO, CISPO, SAPO).\n\n"
                        "Examples:\n\n"
                        "  grpo train recipes/quickstart.yaml\n\n"
                        "  grpo train recipes/gsm8k.yaml algorithm.loss_type=dr_grpo train.max_steps=200\n\n"
                        "  grpo print-recipe recipes/ci-tiny.yaml algorithm.beta=0.04"),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # the terminal's width up to 120 (click's default stops at 80)
)


def people_facing(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with every UserError turned into `error: <message>` and the error's exit code."""

    @functools.wraps(command)  # typer reads the options from the wrapped signature
    def run(*args: Any, **kwargs: Any) -> Any:
        from grpo_cli.errors import UserError

        try:
            return command(*args, **kwargs)
        except UserError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None

    run.__doc__ = whole_examples(command.__doc__)
    return run


def _version(value: bool) -> None:
    if value:
        from grpo_cli import __version__

        typer.echo(f"grpo {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Fine-tune language models with GRPO and its variants (Dr. GRPO, DAPO, GSPO, CISPO, SAPO)."""


for _name, _module in COMMANDS.items():
    app.command(_name)(people_facing(_module.command))


def main() -> None:
    app(prog_name="grpo")


if __name__ == "__main__":
    main()
