"""What `grpo train` may do with a run folder: never rewind, overwrite or change a run silently.

Where to start (`start_point`):
  fresh `grpo train`     an empty or new folder only; one holding checkpoints or logs is refused
  --resume auto          the newest complete checkpoint; `step-N` folders without a manifest (interrupted
                         saves) are skipped by name; a folder with earlier output but no complete
                         checkpoint is refused instead of silently starting again at step 1
  --resume PATH          that checkpoint; one before the folder's newest is refused unless --rewind sets the later
                         checkpoints, replay records and log lines aside (grpo_cli/run/rewind.py)
  --start-over           deletes the run's logs and checkpoints (named), then trains from step 1
Refusals raise RunFolderError (the CLI exits 2) saying what the folder holds and which flag to pass.

Recipe drift on resume (`recipe_changes`): the resolved recipe is compared with the checkpoint's.
Fields in RESUMABLE may change (they schedule, save, log or evaluate the run; they do not change what
it learns); any other change is refused unless the user passes --allow-recipe-change, and then it
takes effect and is recorded in recipe_changes.jsonl with the step it starts at.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_cli.errors import RunFolderError
from grpo_cli.recipe.files import flatten
from grpo_cli.run.checkpoints import (
    ABANDONED,
    CHECKPOINTS,
    checkpoint_step,
    incomplete_checkpoints,
    list_checkpoints,
    recipe_path,
    recover_saves,
    resolve_resume,
    step_of,
    verify_checkpoint,
)
from grpo_cli.run.logs import RESUMES, read_records
from grpo_cli.run.rewind import finish_pending, later_checkpoints
from grpo_cli.run.trackers import OUTPUTS as TRACKER_OUTPUTS

LOGS = ("metrics.jsonl", "rollouts.jsonl")
RECIPE_CHANGES = "recipe_changes.jsonl"
# what --start-over deletes, nothing else (replay/: grpo_cli/run/replays.py; stalls/: grpo_cli/process/watchdog.py;
# abandoned/: what rewinds and re-saves set aside, grpo_cli/run/rewind.py)
OUTPUTS = (*LOGS, CHECKPOINTS, "recipe.yaml", RECIPE_CHANGES, RESUMES, "replay", "stalls", ABANDONED, *TRACKER_OUTPUTS)
# Fields a resume may change without --allow-recipe-change: how long to train, where and how often to save,
# log and evaluate, where the vLLM server is, how many CPU threads to use, how long a stall may last, how many
# non-finite steps in a row stop the run, where the optimizer steps, whether freed host memory is kept and whether
# the up projection is recomputed (none of them changes a number).
RESUMABLE = ("train.max_steps", "train.threads", "train.stall_timeout_s", "train.max_nonfinite_steps",
             "train.offload_optimizer", "train.keep_freed_memory", "train.recompute_up_projection", "checkpoint.",
             "logging.", "eval.", "rollout.vllm.server_url", "rollout.vllm.request_timeout_s")  # a trailing dot: a section
UNSET = "<unset>"


@dataclass
class RunContents:
    complete: list[Path] = field(default_factory=list)  # checkpoints with a manifest, oldest first
    incomplete: list[Path] = field(default_factory=list)  # step folders without one
    logs: dict[str, int] = field(default_factory=dict)  # log file -> lines it holds (only files with lines)

    @property
    def earlier_output(self) -> bool:
        return bool(self.complete or self.incomplete or self.logs)

    def describe(self) -> str:
        parts = [f"{name} ({n} lines)" for name, n in self.logs.items()]
        if self.complete:
            parts.append(f"complete checkpoints {', '.join(p.name for p in self.complete)}")
        if self.incomplete:
            parts.append(f"{', '.join(p.name for p in self.incomplete)} without a manifest (interrupted saves)")
        return "; ".join(parts)


def contents(run_dir: str | Path) -> RunContents:
    run_dir = Path(run_dir)
    logs = {}
    for name in LOGS:
        if (run_dir / name).is_file():
            with open(run_dir / name, "rb") as f:
                if n := sum(1 for line in f if line.strip()):
                    logs[name] = n
    return RunContents(list_checkpoints(run_dir), incomplete_checkpoints(run_dir), logs)


def start_point(run_dir: str | Path, resume: str | None, *, start_over: bool = False, rewind: bool = False,
                say: Callable[[str], None] = print, delete: bool = True) -> Path | None:
    """The checkpoint to resume from, or None for step 1; RunFolderError where that would lose or hide work.

    `delete`: whether this process carries out --start-over and finishes an interrupted rewind or save (the main
    one of a multi-process run). `rewind`: a checkpoint before the folder's newest may be resumed (the caller then
    sets the later ones aside, grpo_cli/run/rewind.py)."""
    run_dir = Path(run_dir)
    if start_over and resume is not None:
        raise RunFolderError("--start-over trains from step 1 and --resume continues a run: pass one of them")
    if rewind and resume in (None, "auto"):
        raise RunFolderError("--rewind goes with --resume CHECKPOINT: the checkpoint to continue the run from")
    if delete and not start_over:
        finish_interrupted(run_dir, say)
    found = contents(run_dir)
    if start_over:
        if delete:
            removed = remove_outputs(run_dir)
            if removed:
                say(f"--start-over: deleted {', '.join(removed)} in {run_dir}")
        return None
    if resume is None:
        if found.complete:
            raise RunFolderError(
                f"{run_dir} already holds a run (checkpoints up to {found.complete[-1].name}): pass --resume auto "
                "to continue it, --start-over to delete its checkpoints and logs and train from step 1, or "
                "--output-dir to start a new run elsewhere"
            )
        if found.earlier_output:
            raise RunFolderError(
                f"{run_dir} holds earlier output but no complete checkpoint: {found.describe()}; pass --start-over "
                "to delete it and train from step 1, or --output-dir to start a new run elsewhere"
            )
        return None
    if resume != "auto":
        checkpoint = resolve_resume(run_dir, resume)
        later = later_checkpoints(run_dir, checkpoint) if checkpoint is not None else []
        if later and not rewind:
            raise RunFolderError(
                f"--resume {resume} goes back to step {checkpoint_step(checkpoint)}, but {run_dir} holds later "
                f"checkpoints ({', '.join(p.name for p in later)}): a later --resume auto would continue them, not this "
                "run. Pass --rewind to move them, their replay records and log lines aside (into "
                f"{run_dir / ABANDONED}, kept), --resume auto to continue from the newest, or --output-dir to branch "
                "into a new folder"
            )
        return checkpoint
    if not found.complete:
        if found.earlier_output:
            raise RunFolderError(
                f"--resume auto: {run_dir} holds no complete checkpoint to resume from, but earlier output: "
                f"{found.describe()}; pass --start-over to delete it and train from step 1 (or --resume a "
                "checkpoint of another run)"
            )
        say(f"--resume auto: no checkpoint in {run_dir} yet; training from step 1")
        return None
    newest = found.complete[-1]
    skipped = [p for p in found.incomplete if step_of(p) > step_of(newest)]
    if skipped:
        say(f"--resume auto: skipping {', '.join(p.name for p in skipped)} (no manifest: the save was interrupted); "
            f"resuming from {newest.name}")
    verify_checkpoint(newest)  # a corrupted newest checkpoint is refused, never silently passed over
    return newest


def finish_interrupted(run_dir: Path, say: Callable[[str], None] = print) -> None:
    """Finish what a kill interrupted before anything reads the folder: a rewind's moves, a save's last rename."""
    finish_pending(run_dir, say)
    recover_saves(run_dir, say)


def remove_outputs(run_dir: Path) -> list[str]:
    """Delete what `grpo train` wrote into `run_dir` (OUTPUTS), nothing else; -> the names deleted."""
    removed = []
    for name in OUTPUTS:
        path = run_dir / name
        folder = path.is_dir()
        if folder:
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name + ("/" if folder else ""))
    return removed


# ----------------------------------------------------------------------------------------- recipe drift


def saved_recipe(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's recipe with today's defaults filled in (so a field added since is no change)."""
    import yaml

    from grpo_cli.recipe.schema import Recipe

    path = recipe_path(checkpoint)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise RunFolderError(f"{path} cannot be read ({e}); the checkpoint is incomplete") from None
    try:
        return Recipe.model_validate(raw).model_dump(mode="json")
    except ValueError:  # written by another version of grpo: compare what is there
        return raw if isinstance(raw, dict) else {}


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted field: (old, new)} for every field that differs (UNSET where one side lacks it)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, UNSET), b.get(k, UNSET)) for k in sorted(a.keys() | b.keys()) if a.get(k, UNSET) != b.get(k, UNSET)}


def resumable(key: str) -> bool:
    return any(key == f.rstrip(".") or (f.endswith(".") and key.startswith(f)) for f in RESUMABLE)


def format_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {k}: {json.dumps(o)} -> {json.dumps(n)}" for k, (o, n) in changes.items())


def check_drift(checkpoint: Path, new: dict[str, Any], allow: bool) -> dict[str, tuple[Any, Any]]:
    """The changes of `new` against the checkpoint's recipe; RunFolderError for refused ones unless `allow`."""
    changes = recipe_changes(saved_recipe(checkpoint), new)
    refused = {k: v for k, v in changes.items() if not resumable(k)}
    if refused and not allow:
        raise RunFolderError(
            f"the recipe differs from the one {checkpoint} was trained with:\n{format_changes(refused)}\n"
            f"only {', '.join(f.rstrip('.') + ('.*' if f.endswith('.') else '') for f in RESUMABLE)} may change on "
            "resume; restore these values, or pass --allow-recipe-change to continue with the new ones (the change "
            f"is recorded in {RECIPE_CHANGES})"
        )
    return changes


def report_changes(run_dir: Path, checkpoint: Path, from_step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Print the changes and append them to RUN_DIR/recipe_changes.jsonl with the step they start at."""
    record = {"from_step": from_step, "checkpoint": str(checkpoint), "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "changes": {k: {"old": o, "new": n, "resumable": resumable(k)} for k, (o, n) in changes.items()}}
    with open(run_dir / RECIPE_CHANGES, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    allowed = {k: v for k, v in changes.items() if resumable(k)}
    forced = {k: v for k, v in changes.items() if not resumable(k)}
    # the forced ones are allowed on request: --allow-recipe-change, allow_recipe_change=True, a replay's overrides
    for what, part in (("resume applies", allowed), ("applied on request", forced)):
        if part:
            print(f"{what} from step {from_step} on (recorded in {RECIPE_CHANGES}):\n{format_changes(part)}")


def record_resume(run_dir: Path, checkpoint: Path, from_step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Append the resume to RUN_DIR/resumes.jsonl (`grpo report` marks it): the step it starts at, the checkpoint,
    the time and the recipe fields it changed. Records of resumes at later steps go, as the logs' lines of those
    steps do: the run no longer went that way."""
    path = run_dir / RESUMES
    kept = [r for r in read_records(path, required=("from_step",)).records if r["from_step"] <= from_step]
    kept.append({"from_step": from_step, "checkpoint": str(checkpoint), "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                 "recipe_changes": sorted(changes)})
    path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")


def apply_optimizer_changes(optimizer: Any, scheduler: Any, changed: set[str], train: Any) -> None:
    """Give a restored optimizer and LambdaLR scheduler the recipe's changed `train` values (the checkpoint
    restored the old ones); this step's rate is recomputed on the new schedule. Nothing changed: untouched."""
    groups = optimizer.param_groups
    if "train.learning_rate" in changed:
        scheduler.base_lrs = [train.learning_rate] * len(groups)
    for g in groups:
        if "train.weight_decay" in changed:
            g["weight_decay"] = train.weight_decay
        if changed & {"train.adam_beta1", "train.adam_beta2"}:
            g["betas"] = (train.adam_beta1, train.adam_beta2)
    if changed & {"train.learning_rate", "train.scheduler", "train.warmup_steps", "train.max_steps",
                  "algorithm.num_iterations", "train.mini_batches"}:
        for g, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
            g["initial_lr"], g["lr"] = base, base * factor(scheduler.last_epoch)
        scheduler._last_lr = [g["lr"] for g in groups]


def finished_step(recipe: Any, run_dir: Path, resume: str | None, start_over: bool) -> int | None:
    """The step of a run that `--resume auto` would find already at train.max_steps (nothing to train), else None.
    The lock holder first finishes an interrupted rewind or save (`finish_interrupted`): the newest checkpoint is the
    one after."""
    from grpo_cli.run import lock
    from grpo_cli.run.checkpoints import latest_checkpoint, step_of

    if resume == "auto" and not start_over and lock.holds(run_dir):
        finish_interrupted(run_dir)
    newest = latest_checkpoint(run_dir) if resume == "auto" and not start_over else None
    step = step_of(newest) if newest is not None else None
    return step if step is not None and step >= recipe.train.max_steps else None


def run_folder_of(targets: list[str]) -> Path:
    """The run folder of the first target that is a run or one of its checkpoints (an eval's output goes there);
    else the working directory."""
    for t in targets:
        path = Path(t)
        if path.parent.name == "checkpoints" and path.name.startswith("step-"):
            return path.parent.parent
        if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
            return path
    return Path(".")
