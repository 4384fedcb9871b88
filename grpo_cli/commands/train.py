"""`grpo train RECIPE [overrides]`: check the recipe and data, take the run folder, then train (or relaunch
on several processes through accelerate)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from grpo_cli.commands import OVERRIDES, RECIPE


OUTPUT_DIR = typer.Option(None, "--output-dir", "-o", help="Run folder (default: logging.output_dir or runs/<name>).")
RESUME = typer.Option(None, "--resume", help="`auto`: newest complete checkpoint of the run folder; or a checkpoint path.")
NUM_PROCESSES = typer.Option(None, "--num-processes", min=1, help="Train on N processes (one per GPU; gloo DDP on CPU) through accelerate launch.")
ACCELERATE_CONFIG = typer.Option(None, "--accelerate-config", help="accelerate config file, e.g. recipes/accelerate/fsdp2.yaml (DDP, FSDP2, DeepSpeed).")
START_OVER = typer.Option(False, "--start-over", help="Delete the run folder's logs and checkpoints and train from step 1.")
REWIND = typer.Option(False, "--rewind", help="With --resume CHECKPOINT before the run folder's newest: move the later checkpoints, replay records and log lines aside into RUN/abandoned/ (kept) and continue from it; without it such a resume is refused.")
ALLOW_RECIPE_CHANGE = typer.Option(False, "--allow-recipe-change", help="On resume, accept changes to fields that change what the run learns (model, data, algorithm, optimizer, ...); train.max_steps, train.threads, train.stall_timeout_s, train.max_nonfinite_steps, checkpoint.*, logging.*, eval.* and the vLLM server address may change without it. Recorded in recipe_changes.jsonl.")
VERBOSE = typer.Option(False, "--verbose", help="Show every log line of vLLM and transformers (default: vLLM's warnings only, each distinct one once; transformers' errors).")


def command(recipe: Path = RECIPE, overrides: Optional[list[str]] = OVERRIDES, output_dir: Optional[Path] = OUTPUT_DIR,
            resume: Optional[str] = RESUME, num_processes: Optional[int] = NUM_PROCESSES,
            accelerate_config: Optional[Path] = ACCELERATE_CONFIG, start_over: bool = START_OVER, rewind: bool = REWIND,
            allow_recipe_change: bool = ALLOW_RECIPE_CHANGE, verbose: bool = VERBOSE) -> None:
    """Train with GRPO. Writes metrics.jsonl, rollouts.jsonl and checkpoints/step-N/ under the run folder.

    One trainer per run folder (a second one exits 2 naming the first). A folder that holds an earlier
    run is continued with --resume auto or replaced with --start-over, never overwritten silently.

    Examples:

      grpo train recipes/ci-tiny.yaml train.max_steps=5 -o runs/try

      grpo train recipes/ci-tiny.yaml -o runs/try --resume auto train.max_steps=10

      grpo train recipes/ci-tiny.yaml -o runs/try --resume auto --allow-recipe-change train.learning_rate=3e-4

      grpo train recipes/ci-tiny.yaml -o runs/try --resume runs/try/checkpoints/step-2 --rewind

      grpo train recipes/gsm8k.yaml --num-processes 8 --accelerate-config recipes/accelerate/fsdp2.yaml
    """
    from grpo_cli.models.loading import VERBOSE_ENV
    from grpo_cli.preflight.prepare import finished_text, prepare_run
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.launch import launched_by_torchrun, relaunch_run

    if verbose:  # read by grpo_cli.models.loading in this process, the relaunched workers and vLLM's engine processes
        os.environ[VERBOSE_ENV] = "1"
    launching = bool(accelerate_config or (num_processes or 1) > 1) and not launched_by_torchrun()
    run = prepare_run(load_recipe(recipe, overrides or []), output_dir, resume=resume, start_over=start_over,
                      allow_recipe_change=allow_recipe_change, rewind=rewind, launching=launching,
                      say=lambda line: typer.echo(line, err=True))
    if run.finished is not None:  # nothing to train: no model loaded, no processes launched, no change recorded
        if os.environ.get("RANK", "0") == "0":
            typer.echo(finished_text(run))
        return
    if launching:
        raise typer.Exit(relaunch_run(run, recipe, overrides or [], num_processes, accelerate_config))
    _train(run)


def setup_logging() -> None:
    """Our own modules speak at INFO (e.g. the one-time GGUF conversion); libraries stay at WARNING, and a library
    that prints through a handler of its own (huggingface_hub, transformers) is not printed a second time here.
    On a terminal rich's columns; elsewhere (a log file) one plain line a record, which rich would wrap at 80."""
    import logging
    import sys

    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(lambda record: not logging.getLogger(record.name.split(".")[0]).handlers)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])
    logging.getLogger("grpo_cli").setLevel(logging.INFO)


def _train(run) -> None:
    """Train in this process: logging set up, the engine built and run; interrupts and signals become exit codes."""
    setup_logging()
    from grpo_cli.errors import UserError
    from grpo_cli.preflight.prepare import build_engine
    from grpo_cli.run.checkpoints import latest_checkpoint
    from grpo_cli.views.summary import end_of_run

    run_dir = run.folder
    try:
        engine = build_engine(run, own_process=True)
        step = engine.fit()
    except OSError as e:  # e.g. a full disk while logging: say what, not where in the code
        raise UserError(f"{e}; the last checkpoint is intact (resume with --resume auto)") from None
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        newest = latest_checkpoint(run_dir)
        typer.echo(f"interrupted; {newest} is intact (resume with --resume auto)" if newest else
                   "interrupted before the first checkpoint: nothing to resume (start again with --start-over)", err=True)
        raise typer.Exit(130)
    finally:  # the run is over and its checkpoint written: a late Ctrl-C must not turn the exit code into a crash
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if engine.stop_requested:  # stopped by a signal after a checkpoint: 128 + its number, as the shell reports it
        raise typer.Exit(128 + (engine.stop_signal or signal.SIGTERM))
    if engine.accelerator.is_main_process:
        typer.echo(end_of_run(run_dir, step, latest_checkpoint(run_dir)))
    if engine.accelerator.num_processes > 1:
        # the run is complete, its files closed and its process group destroyed; gloo's threads can still abort the
        # interpreter's own teardown (SIGABRT, "terminate called without an active exception": a finished run
        # reported as failed by torchrun, seen in the two-process tests). Leave without that teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
