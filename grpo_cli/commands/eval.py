"""`grpo eval TARGET...`: the same held-out problems for every target; a table, eval.json and samples.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
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
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Folder for eval.json and samples.jsonl (default: RUN/eval/<timestamp> of the first run or checkpoint target, else eval/<timestamp>)."),
    threads: Optional[str] = typer.Option(None, "--threads", help="CPU threads: a number or auto (default: the recipe's train.threads, auto unless set)."),
) -> None:
    """Accuracy (greedy pass@1), pass@k, maj@k and reward means of models on the same held-out problems.

    Examples:

      grpo eval base runs/quickstart --recipe recipes/quickstart.yaml

      grpo eval runs/quickstart/checkpoints/step-40 --num-samples 4 --limit 50

      grpo eval Qwen/Qwen2.5-0.5B-Instruct --recipe recipes/gsm8k.yaml --limit 200
    """
    from grpo_cli.errors import UsageError
    from grpo_cli.preflight.prepare import evaluate_prepared, prepare_eval
    from grpo_cli.recipe.files import load_recipe

    if dataset and files:
        raise UsageError("give --dataset or --file, not both")
    # an empty value (not None) replaces the recipe's other eval source
    held_out = ({"dataset": dataset, "files": []} if dataset else
                {"files": [str(f.resolve()) for f in files], "dataset": ""} if files else {})
    settings = dict(split=split, limit=limit, num_samples=num_samples, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size, **held_out)
    prepared = prepare_eval(targets, load_recipe(recipe) if recipe else None, settings, output=output,
                            backend=backend, threads=threads, say=lambda line: typer.echo(line, err=True))
    evaluate_prepared(prepared, own_process=True)
    typer.echo(f"wrote {prepared.output}/eval.json and {prepared.output}/samples.jsonl")
