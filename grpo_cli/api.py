"""The Python API: the command line's engine, from a notebook or a script.

    import grpo_cli

    def brevity(completions, **kw):                 # a reward: one float (or None) per completion
        return [1.0 / (1 + len(c)) for c in completions]

    result = grpo_cli.train("recipes/ci-tiny.yaml", rewards=["accuracy", (brevity, 0.5)],
                            overrides=["train.max_steps=4"], output_dir="runs/notebook")
    result.metrics[-1]["reward"]                    # metrics.jsonl's records, as dicts
    grpo_cli.evaluate(["base", result.run_dir], recipe="recipes/ci-tiny.yaml", limit=20)

`train` does what `grpo train RECIPE [overrides] -o DIR [--resume R] [--start-over]` does, in this process and
with the same run folder, so a run started here resumes from the command line and the other way round. A reward
function is recorded in the run's recipe as `python:<its __name__>` (the command line, which does not have it,
says which one it needs). A dataset is saved once in the run folder (grpo_cli/data/in_memory.py) and named in
`data.files`. Nothing here exits the interpreter: a failure raises the `UserError` subclass whose message the
command line prints (grpo_cli/errors.py). An interrupt (Ctrl-C, Jupyter's stop button) finishes the step, saves a
checkpoint and returns (`TrainResult.stopped`); a second one stops at once with KeyboardInterrupt. A stall
(train.stall_timeout_s without progress) raises StallError with the stacks written to RUN/stalls/, where the
command line would end the process.

Importing this module is cheap: torch loads on the first call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from grpo_cli.errors import UsageError, UserError

if TYPE_CHECKING:
    from grpo_cli.recipe.schema import Recipe

# a message raised to Python names this function's arguments where the command line's says its flags
PYTHON_TERMS = (("--resume auto", 'resume="auto"'), ("--resume CHECKPOINT", "resume=CHECKPOINT"),
                ("--resume PATH", "resume=PATH"), ("--start-over", "start_over=True"),
                ("--allow-recipe-change", "allow_recipe_change=True"), ("--rewind", "rewind=True"),
                ("--output-dir", "output_dir="), ("--resume", "resume="), ("give --recipe", "give recipe="),
                ("--backend ", "backend="), ("--threads ", "threads="))


@contextmanager
def in_python_terms(also: list[tuple[Any, str]] | None = None) -> Iterator[None]:
    """A UserError raised inside, with the command line's flags (and `also`'s texts or patterns) put as Python's
    arguments."""
    try:
        yield
    except UserError as e:
        text = str(e)
        for old, new in (*(also or []), *PYTHON_TERMS):
            text = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new)
        e.args = (text, *e.args[1:])
        raise


RecipeLike = Union[str, Path, dict, "Recipe"]
RewardLike = Union[str, Callable[..., Any], tuple]


@dataclass(frozen=True)
class TrainResult:
    """What a run left: its folder, its metrics.jsonl records (every step of the run, earlier segments of a resumed
    run included), the last step trained, its newest checkpoint, and whether a signal stopped it early."""

    run_dir: Path
    metrics: list[dict[str, Any]]
    step: int
    checkpoint: Path | None
    stopped: bool = False

    def __repr__(self) -> str:
        last = self.metrics[-1] if self.metrics else {}
        reward = f", reward {last['reward']:.3f}" if isinstance(last.get("reward"), float) else ""
        return f"TrainResult({self.run_dir}: step {self.step}{reward}, checkpoint {self.checkpoint})"


@dataclass(frozen=True)
class EvalResult:
    """`grpo eval`'s output: the folder with eval.json and samples.jsonl, and eval.json's content (`settings`,
    and per target its `metrics`: accuracy, pass@k, maj@k, reward means)."""

    output_dir: Path
    report: dict[str, Any]

    def metrics(self, target: str | Path) -> dict[str, float]:
        """One target's metrics, by the name it was given as."""
        for t in self.report["targets"]:
            if t["target"] == str(target):
                return t["metrics"]
        raise KeyError(f"{target!r} was not evaluated; targets: {[t['target'] for t in self.report['targets']]}")


def recipe_with(recipe: RecipeLike, overrides: Sequence[str] | None = None,
                rewards: Sequence[RewardLike] | None = None) -> Recipe:
    """`grpo_cli.load_recipe(recipe, overrides)` with `rewards` (see `train`) replacing its reward list first, so
    an override such as `rewards.0.kwargs.k=v` is about the functions given."""
    from grpo_cli.recipe.files import apply_overrides, raw_recipe, validated

    if rewards is None:
        return validated(raw_recipe(recipe, list(overrides or [])))
    raw = raw_recipe(recipe)
    raw["rewards"] = reward_entries(rewards)
    return validated(apply_overrides(raw, list(overrides or []), Path.cwd(), "the recipe"))


def reward_entries(rewards: Sequence[RewardLike]) -> list[dict[str, Any]]:
    """The recipe's `rewards` list for functions (`fn` or `(fn, weight)`) and reward names (`"accuracy"`,
    `("path/file.py:fn", 0.5)`): each function registered in this process under its `__name__`."""
    from grpo_cli.usercode.objects import register_in_process

    if isinstance(rewards, (str, tuple)) or callable(rewards):
        rewards = [rewards]  # one reward given bare
    if not rewards:
        raise UsageError("rewards: give at least one reward function or name")
    entries, seen = [], {}
    for i, item in enumerate(rewards):
        fn, weight = item if isinstance(item, tuple) and len(item) == 2 else (item, 1.0)
        if not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise UsageError(f"rewards[{i}]: the weight of {fn!r} is {weight!r}; give (function, number)")
        if isinstance(fn, str):
            entries.append({"name": fn, "weight": float(weight)})
            continue
        try:
            name = register_in_process(fn)
        except ValueError as e:
            raise UsageError(f"rewards[{i}]: {e}") from None
        if seen.get(name, fn) is not fn:
            raise UsageError(f"rewards[{i}]: two different functions are named {name.partition(':')[2]!r}; rewards "
                             "are logged under their function's name: rename one")
        seen[name] = fn
        entries.append({"name": name, "weight": float(weight)})
    return entries


def train(recipe: RecipeLike, *, overrides: Sequence[str] | None = None, rewards: Sequence[RewardLike] | None = None,
          dataset: Any = None, output_dir: str | Path | None = None, resume: str | Path | None = None,
          start_over: bool = False, allow_recipe_change: bool = False, rewind: bool = False) -> TrainResult:
    """Train with GRPO in this process, as `grpo train` does; returns the run's folder and metrics.

    recipe: a YAML path, a dict of sections or a Recipe. overrides: `key=value` strings as on the command line.
    rewards: functions `fn(prompts, completions, **columns) -> list[float | None]` (or `(fn, weight)`, or reward
    names) replacing the recipe's list; each is logged under its `__name__`. dataset: a `datasets.Dataset` or a
    list of dicts replacing the recipe's data source (saved in the run folder). output_dir: the run folder
    (default logging.output_dir or runs/<name>). resume: "auto" or a checkpoint path. start_over,
    allow_recipe_change, rewind: the command line's --start-over, --allow-recipe-change and --rewind.
    """
    if os.environ.get("WORLD_SIZE", "1") != "1":
        raise UsageError("grpo_cli.train runs in one process; for several, use `grpo train --num-processes N`")
    also: list[tuple[Any, str]] = []
    with in_python_terms(also):
        return _train(recipe, overrides, rewards, dataset, output_dir, resume, start_over, allow_recipe_change,
                      rewind, also)


def _train(recipe, overrides, rewards, dataset, output_dir, resume, start_over, allow_recipe_change, rewind,
           also: list[tuple[Any, str]]) -> TrainResult:
    from grpo_cli.preflight.prepare import finished_text, prepare_run

    if dataset is not None:  # the rows' file, once written, as the argument that gave them
        also += [(re.compile(r"data\.files \[[^\]]*\]"), "the rows given as dataset="),
                 ("data.files", "the rows given as dataset=")]
    run = prepare_run(recipe_with(recipe, overrides, rewards), output_dir, resume=resume, start_over=start_over,
                      allow_recipe_change=allow_recipe_change, rewind=rewind, rows=dataset)
    try:
        if run.finished is not None:
            print(finished_text(run, "start_over=True"))
            return _result(run.folder, run.finished, stopped=False)
        step, stopped = _fit(run)
        return _result(run.folder, step, stopped)
    finally:
        run.release()


def _fit(run) -> tuple[int, bool]:
    from accelerate.state import AcceleratorState

    from grpo_cli.errors import StallError
    from grpo_cli.preflight.prepare import build_engine
    from grpo_cli.process.watchdog import StallInterrupt

    # an earlier run in this process (a notebook's previous cell) may have set up accelerate with other settings
    AcceleratorState._reset_state(reset_partial_state=True)
    engine = build_engine(run)
    try:
        step = engine.fit(raise_on_stall=True)
    except StallInterrupt as e:  # the kernel lives on; the last checkpoint is intact
        raise StallError(str(e)) from None
    return step, engine.stop_requested


def _result(run_dir: Path, step: int, stopped: bool) -> TrainResult:
    from grpo_cli.run.checkpoints import latest_checkpoint
    from grpo_cli.run.logs import METRICS
    from grpo_cli.views.run_metrics import load_metrics

    path = run_dir / METRICS
    metrics = load_metrics(path) if path.is_file() else []
    return TrainResult(run_dir, metrics, step, latest_checkpoint(run_dir), stopped)


def evaluate(targets: str | Path | Sequence[str | Path], recipe: RecipeLike | None = None, *,
             overrides: Sequence[str] | None = None, rewards: Sequence[RewardLike] | None = None,
             dataset: Any = None, output_dir: str | Path | None = None, backend: str = "hf",
             limit: int | None = None, num_samples: int | None = None, temperature: float | None = None,
             top_p: float | None = None, max_new_tokens: int | None = None, seed: int | None = None,
             batch_size: int | None = None, split: str | None = None, threads: int | str | None = None) -> EvalResult:
    """Accuracy (greedy pass@1), pass@k, maj@k and reward means of models on the same held-out problems, as
    `grpo eval` does. targets: `base` (the recipe's model), run folders, checkpoints, model folders or hub ids.
    recipe: problems, rewards and extraction (default: a checkpoint target's own). rewards: functions replacing
    the recipe's reward list; without a recipe, the functions a checkpoint's `python:` rewards name. dataset:
    held-out rows (a datasets.Dataset or a list of dicts) instead of the recipe's. The other settings are
    `grpo eval`'s options."""
    from grpo_cli.preflight.prepare import evaluate_prepared, prepare_eval

    specs = [str(targets)] if isinstance(targets, (str, Path)) else [str(t) for t in targets]
    with in_python_terms():
        if recipe is not None:
            r = recipe_with(recipe, overrides, rewards)
        else:
            if overrides:
                raise UsageError("overrides change a recipe: pass recipe= too")
            if rewards is not None:
                reward_entries(rewards)  # registered for the checkpoint's `python:` rewards
            r = None
        settings = dict(split=split, limit=limit, num_samples=num_samples, temperature=temperature, top_p=top_p,
                        max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size)
        prepared = prepare_eval(specs, r, settings, output=output_dir, backend=backend, threads=threads, rows=dataset)
        return EvalResult(prepared.output, evaluate_prepared(prepared))


def export(checkpoint: str | Path, merge: str | Path, dtype: str | None = None) -> dict[str, Any]:
    """Write a checkpoint (or a run folder's newest) as a plain Hugging Face model folder `merge`, LoRA adapters
    merged into the base, as `grpo export --merge` does; needs no reward, so any run exports, one trained here with
    function rewards too. dtype: float32, bfloat16 or float16 (default: the recipe's model.dtype). Returns what
    `merge`/export.json records."""
    from grpo_cli.models.export import DTYPES, export_checkpoint

    if dtype not in (None, *DTYPES):
        raise UsageError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    with in_python_terms():
        return export_checkpoint(Path(checkpoint), Path(merge), dtype)
