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
    import time

    from grpo_cli.errors import UsageError
    from grpo_cli.rollout.backends import EVAL_BACKENDS

    if backend not in EVAL_BACKENDS:
        raise UsageError(f"--backend {backend!r} is not available; valid: {', '.join(EVAL_BACKENDS)}")
    if dataset and files:
        raise UsageError("give --dataset or --file, not both")
    from grpo_cli.eval.evaluate import run_eval
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.run.folder import run_folder_of

    r = load_recipe(recipe) if recipe else None
    from grpo_cli.run.hub import hub_names, is_hub_id, work_offline_if_unreachable

    on_hub = (hub_names(r) if r else []) + [t for t in [*targets, dataset] if t != "base" and is_hub_id(t)]
    work_offline_if_unreachable(on_hub, lambda line: typer.echo(line, err=True))  # before hub libraries load
    if threads == "auto" or (threads is None and (r is None or r.train.threads == "auto")):
        from grpo_cli.run.cpus import prepare_openmp

        prepare_openmp("auto")  # before torch is imported (a checkpoint's recipe is read later, with torch)
    # an empty value (not None) replaces the recipe's other eval source
    held_out = ({"dataset": dataset, "files": []} if dataset else
                {"files": [str(f.resolve()) for f in files], "dataset": ""} if files else {})
    out = output or run_folder_of(targets) / "eval" / time.strftime("%Y%m%d-%H%M%S")
    overrides = dict(split=split, limit=limit, num_samples=num_samples, temperature=temperature, top_p=top_p,
                     max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size, **held_out)
    if threads is not None and threads != "auto" and not (threads.isdigit() and int(threads) >= 1):
        raise UsageError(f"--threads {threads!r}: give a number >= 1 or auto")
    from grpo_cli.preflight import resolve

    run_eval(targets, r, overrides, out, backend=backend,
             threads=None if threads is None else threads if threads == "auto" else int(threads), resolve=resolve)
    typer.echo(f"wrote {out}/eval.json and {out}/samples.jsonl")

