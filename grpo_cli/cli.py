"""The `grpo` command line. Thin and lazy: parse, validate the recipe, then import torch."""

from __future__ import annotations

import os
import signal
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
OVERRIDES = typer.Argument(
    None, help="Dotted overrides such as algorithm.beta=0.04 train.max_steps=50 data.files=my.jsonl. Values are YAML "
    "scalars or flow collections (0.3, null, [a, b], {k: v}); anything else (not valid YAML, a lone {column}, "
    "text with ': ') is taken as plain text, so 'data.template={question} Answer with a number.' works. "
    "Relative paths in overrides start at the working directory, those written in the recipe at the recipe's "
    "folder.", show_default=False)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(recipe: Path, overrides: Optional[list[str]], check_data: bool = False):
    from grpo_cli.recipe.schema import RecipeError, load_recipe

    try:
        r = load_recipe(recipe, overrides or [])
    except RecipeError as e:
        _fail(str(e))
    if check_data:  # a missing file or column exits 2 before any model is loaded, not at step 1
        _check_data(r)
    return r


def _check_data(r) -> list[str]:
    """The early data checks (files, columns; no model): exit 2 naming the field, as for a bad recipe."""
    from grpo_cli.data.prompts import DataError
    from grpo_cli.data.checks import check_data

    try:
        return check_data(r)
    except DataError as e:
        _fail(str(e))
        raise  # unreachable: _fail exits


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


@app.command()
def validate(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Validate a recipe (and overrides) and exit: 0 if valid, 2 with the bad fields otherwise.

    Checks without loading a model: every field, reward names and files, the data files (they exist and
    parse; their first rows hold the prompt column or the template's placeholders and the answer column),
    a generator's kwargs, local dataset folders. Hub datasets are checked when `train` loads them.

    Example: grpo validate recipes/gsm8k.yaml algorithm.num_generations=16
    """
    r = _load(recipe, overrides)
    for note in _check_data(r):
        typer.echo(f"note: {note}")
    typer.echo(f"{recipe}: ok ({r.name}: {r.algorithm.loss_type}, G={r.algorithm.num_generations}, "
               f"{r.train.max_steps} steps of {r.train.prompts_per_step} prompts)")


@app.command("print-recipe")
def print_recipe(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Print the fully resolved recipe, every default spelled out, as YAML.

    Example: grpo print-recipe recipes/quickstart.yaml algorithm.loss_type=grpo
    """
    from grpo_cli.recipe.schema import recipe_to_yaml

    typer.echo(recipe_to_yaml(_load(recipe, overrides)), nl=False)


@app.command()
def train(
    recipe: Path = RECIPE,
    overrides: Optional[list[str]] = OVERRIDES,
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="Run folder (default: logging.output_dir or runs/<name>)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="`auto`: newest complete checkpoint of the run folder; or a checkpoint path."),
    num_processes: Optional[int] = typer.Option(None, "--num-processes", min=1, help="Train on N processes (one per GPU; gloo DDP on CPU) through accelerate launch."),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="accelerate config file, e.g. recipes/accelerate/fsdp2.yaml (DDP, FSDP2, DeepSpeed)."),
    start_over: bool = typer.Option(False, "--start-over", help="Delete the run folder's logs and checkpoints and train from step 1."),
    allow_recipe_change: bool = typer.Option(False, "--allow-recipe-change", help="On resume, accept changes to fields that change what the run learns (model, data, algorithm, optimizer, ...); train.max_steps, train.threads, checkpoint.*, logging.*, eval.* and the vLLM server address may change without it. Recorded in recipe_changes.jsonl."),
    verbose: bool = typer.Option(False, "--verbose", help="Show every log line of vLLM and transformers (default: vLLM's warnings only, each distinct one once; transformers' errors)."),
) -> None:
    """Train with GRPO. Writes metrics.jsonl, rollouts.jsonl and checkpoints/step-N/ under the run folder.

    One trainer per run folder (a second one exits 2 naming the first). A folder that holds an earlier
    run is continued with --resume auto or replaced with --start-over, never overwritten silently.

    Examples:

      grpo train recipes/ci-tiny.yaml train.max_steps=5 -o runs/try

      grpo train recipes/ci-tiny.yaml -o runs/try --resume auto train.max_steps=10

      grpo train recipes/ci-tiny.yaml -o runs/try --resume auto --allow-recipe-change train.learning_rate=3e-4

      grpo train recipes/gsm8k.yaml --num-processes 8 --accelerate-config recipes/accelerate/fsdp2.yaml
    """
    r = _load(recipe, overrides, check_data=True)
    run_dir = output_dir or Path(r.output_dir)
    if verbose:  # read by grpo_cli.models.loading in this process, the relaunched workers and vLLM's engine processes
        from grpo_cli.models.loading import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
    from grpo_cli.run import lock as runlock
    from grpo_cli.train.launch import LaunchError, launched_by_torchrun, relaunch

    launching = (accelerate_config or (num_processes or 1) > 1) and not launched_by_torchrun()
    if launching or (os.environ.get("RANK", "0") == "0" and not runlock.inherited(run_dir)):
        try:  # before torch is imported or anything written: a second trainer is turned away in a second
            runlock.acquire(run_dir)
        except runlock.RunLockedError as e:
            _fail(str(e))
    if launching:
        flags = [f for f, on in (("--start-over", start_over), ("--allow-recipe-change", allow_recipe_change)) if on]
        args = ["train", str(recipe), *(overrides or []), "--output-dir", str(run_dir), *flags]
        os.environ[runlock.HOLDER_ENV] = f"{os.getpid()}:{run_dir.resolve()}"  # the workers' lock is ours
        try:
            code = relaunch(num_processes, accelerate_config, args + (["--resume", resume] if resume else []))
        except LaunchError as e:
            _fail(str(e))
        raise typer.Exit(code)
    import logging

    from rich.logging import RichHandler

    # our own modules speak at INFO (e.g. the one-time GGUF conversion); libraries stay at WARNING
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[RichHandler(show_path=False)])
    logging.getLogger("grpo_cli").setLevel(logging.INFO)
    from grpo_cli.run.checkpoints import CheckpointError, latest_checkpoint
    from grpo_cli.data.prompts import DataError
    from grpo_cli.train.engine import Engine
    from grpo_cli.errors import SetupError
    from grpo_cli.models.loading import ModelLoadError
    from grpo_cli.rewards import RewardError
    from grpo_cli.rollout.vllm_server import VLLMServerError
    from grpo_cli.run.folder import RunFolderError

    try:
        engine = Engine(r, run_dir, resume=resume, start_over=start_over, allow_recipe_change=allow_recipe_change)
        step = engine.fit()
    except (RunFolderError, runlock.RunLockedError) as e:
        _fail(str(e))
    except (CheckpointError, DataError, ModelLoadError, RewardError, SetupError, VLLMServerError) as e:
        _fail(str(e), code=1)
    except OSError as e:  # e.g. a full disk while logging: say what, not where in the code
        _fail(f"{e}; the last checkpoint is intact (resume with --resume auto)", code=1)
    except KeyboardInterrupt:
        newest = latest_checkpoint(run_dir)
        typer.echo(f"interrupted; {newest} is intact (resume with --resume auto)" if newest else
                   "interrupted before the first checkpoint: nothing to resume (start again with --start-over)", err=True)
        raise typer.Exit(130)
    if engine.stop_requested:  # stopped by a signal after a checkpoint: 128 + its number, as the shell reports it
        raise typer.Exit(128 + (engine.stop_signal or signal.SIGTERM))
    if engine.accelerator.is_main_process:
        typer.echo(f"done: {step} steps in {run_dir}")


@app.command("eval")
def eval_(
    targets: list[str] = typer.Argument(..., help="`base` (the recipe's model), run folders, checkpoints, model folders or hub ids.", show_default=False),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe for problems, rewards and extraction (default: the checkpoint's)."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Evaluate on this dataset instead of the recipe's (eval.dataset)."),
    files: Optional[list[Path]] = typer.Option(None, "--file", help="Evaluate on this held-out file (eval.files); repeat for several."),
    split: Optional[str] = typer.Option(None, "--split", help="Split of the dataset (default: eval.split, `test`)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Number of problems."),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", "-n", min=1, help="Samples per problem for pass@k / maj@k."),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.0, help="Temperature of the n samples."),
    top_p: Optional[float] = typer.Option(None, "--top-p", min=0.0, max=1.0),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1),
    seed: Optional[int] = typer.Option(None, "--seed", help="Generator and sampling seed."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Prompts per generate call."),
    backend: str = typer.Option("hf", "--backend", help="Generation backend: hf (transformers) or vllm (in-process vLLM)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Folder for eval.json and samples.jsonl (default: eval/<timestamp>)."),
) -> None:
    """Accuracy (greedy pass@1), pass@k, maj@k and reward means of models on the same held-out problems.

    Examples:

      grpo eval base runs/quickstart --recipe recipes/quickstart.yaml

      grpo eval runs/quickstart/checkpoints/step-40 --num-samples 4 --limit 50

      grpo eval Qwen/Qwen2.5-0.5B-Instruct --recipe recipes/gsm8k.yaml --limit 200
    """
    import time

    if backend not in ("hf", "vllm"):
        _fail(f"--backend {backend!r} is not available; valid: hf, vllm")
    if dataset and files:
        _fail("give --dataset or --file, not both")
    r = _load(recipe, []) if recipe else None
    # an empty value (not None) replaces the recipe's other eval source
    held_out = ({"dataset": dataset, "files": []} if dataset else
                {"files": [str(f.resolve()) for f in files], "dataset": ""} if files else {})
    from grpo_cli.run.checkpoints import CheckpointError
    from grpo_cli.data.prompts import DataError
    from grpo_cli.eval.evaluate import run_eval
    from grpo_cli.models.loading import ModelLoadError
    from grpo_cli.rewards import RewardError

    out = output or Path("eval") / time.strftime("%Y%m%d-%H%M%S")
    overrides = dict(split=split, limit=limit, num_samples=num_samples, temperature=temperature, top_p=top_p,
                     max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size, **held_out)
    try:
        run_eval(targets, r, overrides, out, backend=backend)
    except (ValueError, CheckpointError, DataError, ModelLoadError, RewardError) as e:
        _fail(str(e), code=1)
    typer.echo(f"wrote {out}/eval.json and {out}/samples.jsonl")


# ----- commands that live in their own modules (each module imports only light things at the top) -----
# inspect-rollouts: registered below
from grpo_cli.commands.inspect_rollouts import command as _inspect_rollouts  # noqa: E402

app.command("inspect-rollouts")(_inspect_rollouts)
# serve-vllm: the HTTP server around vLLM (grpo_cli/serve/app.py)
from grpo_cli.serve.app import command as _serve_vllm  # noqa: E402

app.command("serve-vllm")(_serve_vllm)
# export: checkpoint -> plain HF model, LoRA merged (grpo_cli/models/export.py)
from grpo_cli.models.export import command as _export  # noqa: E402

app.command("export")(_export)
# report: registered below
from grpo_cli.views.report import command as _report  # noqa: E402

app.command("report")(_report)
# convert-trl: a TRL GRPO config -> a recipe (grpo_cli/recipe/trl.py)
from grpo_cli.commands.convert_trl import command as _convert_trl  # noqa: E402

app.command("convert-trl")(_convert_trl)


def main() -> None:
    app(prog_name="grpo")


if __name__ == "__main__":
    main()
    sys.exit(0)
