"""The one front door of a training run and of an evaluation, for the command line and Python alike.

A run (`grpo train`, `grpo_cli.train`): `prepare_run` does everything before a model loads, in one order, and
`build_engine` builds the run's engine from what it prepared.

    resolve the recipe's names -> OpenMP's wait policy (before torch loads) -> the hub offline where it cannot be
    reached -> the data checked (a bad recipe leaves no folder behind) -> lock the run folder (once: here) -> the
    rows given from Python saved into it and checked -> train.epochs made steps -> a run already at train.max_steps
    found (nothing to train)

The lock is taken by the process that prepares the run: one trainer per folder. A launcher of several processes
takes it for its workers, which find it held for them ($GRPO_RUN_LOCK_HOLDER, grpo_cli/run/lock.py); workers started
by hand (`accelerate launch -m grpo_cli train ...`) let global rank 0 take it.

An evaluation (`grpo eval`, `grpo_cli.evaluate`): `prepare_eval` checks the settings, takes the hub offline where it
cannot be reached, sets OpenMP's policy and settles the output folder (the rows given from Python saved into it);
`evaluate_prepared` resolves the recipe it settles on (given, or a checkpoint's own) and evaluates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from grpo_cli.data.checks import check_data
from grpo_cli.data.epochs import with_epoch_steps
from grpo_cli.errors import UsageError
from grpo_cli.preflight.resolve import resolve
from grpo_cli.recipe.schema import Recipe
from grpo_cli.run import lock
from grpo_cli.process.cpus import prepare_openmp
from grpo_cli.run.folder import finished_step
from grpo_cli.recipe.backends import EVAL_BACKENDS
from grpo_cli.process.hub import hub_names, is_hub_id, work_offline_if_unreachable


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its recipe (the rows given from Python in its data), its folder and how to start."""

    recipe: Recipe
    folder: Path
    resume: str | None = None  # "auto" or a checkpoint
    start_over: bool = False
    allow_recipe_change: bool = False
    rewind: bool = False
    lock: str | None = None  # the folder's lock, held by this process (None: its launcher holds it)
    finished: int | None = None  # the step a run already at train.max_steps stopped at: nothing to train

    def release(self) -> None:
        """Give the folder's lock back (a process that lives on after the run: Python); an exit releases it too."""
        if self.lock is not None:
            lock.release(self.lock)


def prepare_run(recipe: Recipe, folder: str | Path | None = None, *, resume: str | Path | None = None,
                start_over: bool = False, allow_recipe_change: bool = False, rewind: bool = False,
                rows: Any = None, launching: bool = False, say: Callable[[str], None] = print) -> PreparedRun:
    """Everything before a model loads (the module's docstring has the order). `folder`: the run folder (default
    logging.output_dir or runs/<name>); `rows`: a datasets.Dataset or a list of dicts replacing the recipe's data
    (saved in the folder); `launching`: this process starts the run's processes (it takes the lock for them);
    `say`: where a line for the user goes. RecipeError, DataError or RunLockedError before anything is loaded."""
    resolve(recipe)  # every reward, tool and environment the recipe names imports and fits its use
    prepare_openmp(recipe.train.threads)  # takes effect only while torch is not imported
    work_offline_if_unreachable(hub_names(recipe), say)  # before hub libraries load
    if rows is None:
        check_data(recipe)  # a missing file or column before any model is loaded, not at step 1
    folder = Path(folder or recipe.output_dir)
    main = launching or (os.environ.get("RANK", "0") == "0" and not lock.inherited(folder))
    key = lock.acquire(folder) if main else None  # before anything is written into the folder or torch imported
    try:
        if rows is not None:  # saved in the folder once it is ours, then checked as a file of the recipe
            recipe = with_rows(recipe, rows, folder)
            check_data(recipe)
        recipe = with_epoch_steps(recipe)  # train.epochs: the steps from the data's rows
        resume = str(resume) if resume else None
        run = PreparedRun(recipe, folder, resume, start_over, allow_recipe_change, rewind, key)
        return replace(run, finished=finished_step(recipe, folder, resume, start_over))
    except BaseException:
        if key is not None:
            lock.release(key)
        raise


def with_rows(recipe: Recipe, rows: Any, folder: Path) -> Recipe:
    """The recipe with its data source replaced by `rows`, saved in the run folder."""
    from grpo_cli.data.in_memory import save_rows
    from grpo_cli.recipe.files import validated

    raw = recipe.model_dump(mode="json")
    raw["data"].update(files=[str(save_rows(rows, folder).resolve())], dataset=None, generator=None,
                       generator_kwargs={}, config=None)
    return validated(raw)


def build_engine(run: PreparedRun, own_process: bool = False):
    """The run's engine (grpo_cli/trainer/engine.py): the model loaded, the checkpoint resumed or the folder set up.
    `own_process`: the process is grpo train's own (its process-wide settings may change: process/allocator.py)."""
    from grpo_cli.trainer.engine import Engine

    return Engine(run.recipe, run.folder, resume=run.resume, start_over=run.start_over,
                  allow_recipe_change=run.allow_recipe_change, rewind=run.rewind, own_process=own_process)


def finished_text(run: PreparedRun, start_over: str = "--start-over") -> str:
    """What a run already at train.max_steps says (`start_over`: how the caller names that option)."""
    from grpo_cli.run.checkpoints import latest_checkpoint
    from grpo_cli.views.summary import end_of_run

    return (f"{run.folder} has finished: step {run.finished} of train.max_steps {run.recipe.train.max_steps} (raise "
            f"train.max_steps to train on, or {start_over} to train again)\n"
            + end_of_run(run.folder, run.finished, latest_checkpoint(run.folder)))


@dataclass(frozen=True)
class PreparedEval:
    """An evaluation ready to run: the targets, the recipe given (None: a checkpoint target's own), the eval settings
    that replace the recipe's (None: the recipe's), where the results go, the backend and the CPU threads."""

    targets: list[str]
    recipe: Recipe | None
    settings: dict[str, Any]
    output: Path
    backend: str = "hf"
    threads: int | str | None = None  # None: the recipe's train.threads


def prepare_eval(targets: list[str], recipe: Recipe | None, settings: dict[str, Any], *,
                 output: str | Path | None = None, backend: str = "hf", threads: int | str | None = None,
                 rows: Any = None, say: Callable[[str], None] = print) -> PreparedEval:
    """Everything before a model loads (the module's docstring). `settings`: the eval section's fields to replace
    (split, limit, num_samples, ..., dataset or files: an empty value replaces the recipe's other source); `output`:
    default RUN/eval/<time> of the first run or checkpoint target, else eval/<time>; `rows`: held-out rows (a
    datasets.Dataset or a list of dicts) saved into the output folder. UsageError naming the option at fault."""
    import time

    from grpo_cli.run.folder import run_folder_of

    if backend not in EVAL_BACKENDS:
        raise UsageError(f"--backend {backend!r} is not available; valid: {', '.join(EVAL_BACKENDS)}")
    if isinstance(threads, str) and threads != "auto":
        if not (threads.isdigit() and int(threads) >= 1):
            raise UsageError(f"--threads {threads!r}: give a number >= 1 or auto")
        threads = int(threads)
    named = [t for t in [*targets, settings.get("dataset")] if t and t != "base" and is_hub_id(t)]
    work_offline_if_unreachable((hub_names(recipe) if recipe else []) + named, say)  # before hub libraries load
    if threads == "auto" or (threads is None and (recipe is None or recipe.train.threads == "auto")):
        prepare_openmp("auto")  # before torch is imported (a checkpoint's recipe is read later, with torch)
    output = Path(output) if output else run_folder_of(targets) / "eval" / time.strftime("%Y%m%d-%H%M%S")
    if rows is not None:
        from grpo_cli.data.in_memory import save_rows

        settings = {**settings, "files": [str(save_rows(rows, output, split="eval").resolve())], "dataset": ""}
    return PreparedEval(list(targets), recipe, settings, output, backend, threads)


def evaluate_prepared(prepared: PreparedEval, own_process: bool = False) -> dict[str, Any]:
    """Evaluate every target on the same problems (grpo_cli/eval/evaluate.py's run_eval): the recipe it settles on
    resolved first; -> eval.json's report. `own_process`: the process is grpo eval's own (process/allocator.py)."""
    from grpo_cli.eval.evaluate import run_eval

    p = prepared
    return run_eval(p.targets, p.recipe, p.settings, p.output, backend=p.backend, threads=p.threads, resolve=resolve,
                    own_process=own_process)
