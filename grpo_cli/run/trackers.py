"""The run's trackers (`logging.trackers`, through accelerate): where each writes, and the tracker run a resumed
run continues instead of starting a new one.

A run's tracker identities are kept in RUN/trackers.json (removed by --start-over, which starts new ones):
  * tensorboard: event files under RUN/tensorboard/<recipe name>/; a resume passes `purge_step` (the first step
    it trains), so TensorBoard's reader drops what an interrupted run logged after its checkpoint;
  * wandb: the run id, drawn at the first start and passed again with `resume="allow"`; files under RUN/wandb/
    (offline: WANDB_MODE=offline, `wandb sync RUN/wandb/offline-run-*` uploads them);
  * mlflow: the run id MLflow gave the first start, passed as `run_id` again (the experiment is the recipe's
    name; the store is MLFLOW_TRACKING_URI's, e.g. sqlite:///mlflow.db);
  * trackio: the run name (the run folder's name), in the project named after the recipe: a resume continues the
    latest run of that name (`resume="allow"`), a run starting at step 1 (--start-over too) begins a new one.
Each gets the resolved recipe as its config (flat dotted keys) and every step's metrics, metrics.jsonl's numbers.
MLflow refuses to change a logged parameter: a resume logs only the keys it lacks there, and sets a tag
`resumed.<key>` for each value that changed (recipe_changes.jsonl has them with their step).
Steps an interrupted run logged after its checkpoint stay in MLflow, W&B and Trackio (they keep what they received);
metrics.jsonl and TensorBoard drop them. Importing this module must not import torch.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

STATE = "trackers.json"  # RUN/trackers.json: {"wandb": id, "mlflow": run id}
TENSORBOARD = "tensorboard"  # RUN/tensorboard/<recipe name>/ holds the event files
WANDB = "wandb"  # RUN/wandb/: W&B's files (offline runs among them)
OUTPUTS = (STATE, TENSORBOARD, WANDB)  # what --start-over removes with the rest of the run's outputs


def tracker_folders(run_dir: Path):
    """accelerate's ProjectConfiguration: the run folder, TensorBoard's files in RUN/tensorboard/."""
    from accelerate.utils import ProjectConfiguration

    return ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(Path(run_dir) / TENSORBOARD))


def _saved(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(run_dir) / STATE).read_text())
    except (OSError, ValueError):
        return {}


def init_kwargs(trackers: list[str], run_dir: Path, start_step: int) -> dict[str, dict[str, Any]]:
    """accelerate's `init_trackers(init_kwargs=...)`: each tracker's settings, continuing the run's tracker runs
    when it resumes (`start_step` > 0)."""
    run_dir = Path(run_dir)
    saved = _saved(run_dir) if start_step else {}
    name = run_dir.resolve().name
    out: dict[str, dict[str, Any]] = {}
    if "tensorboard" in trackers:
        out["tensorboard"] = {"purge_step": start_step + 1} if start_step else {}
    if "wandb" in trackers:
        (run_dir / WANDB).mkdir(parents=True, exist_ok=True)
        out["wandb"] = {"id": saved.get("wandb") or secrets.token_hex(4), "resume": "allow", "name": name,
                        "dir": str(run_dir)}
    if "mlflow" in trackers:
        out["mlflow"] = {"run_id": saved.get("mlflow"), "run_name": name}
    if "trackio" in trackers:  # a run starting at step 1 is a new Trackio run, even where one has its name
        out["trackio"] = {"name": name, "resume": "allow" if start_step else "never"}
    return out


def start_trackers(accelerator: Any, project: str, config: dict[str, Any], run_dir: Path, start_step: int,
          trackers: list[str]) -> None:
    """Start the recipe's trackers (continuing their runs on a resume) and log the recipe as their config."""
    kwargs = init_kwargs(trackers, run_dir, start_step)
    accelerator.init_trackers(project, init_kwargs=kwargs)
    if not accelerator.is_main_process:
        return
    for tracker in accelerator.trackers:
        if tracker.name == "mlflow" and start_step:
            _mlflow_config(tracker, config)
        else:
            tracker.store_init_configuration(config)
    remember(run_dir, kwargs, accelerator.trackers)


def _mlflow_config(tracker: Any, config: dict[str, Any]) -> None:
    """A resumed MLflow run: the parameters it lacks, and a `resumed.<key>` tag for each that changed."""
    import mlflow

    logged = mlflow.get_run(tracker.active_run.info.run_id).data.params
    new = {k: v for k, v in config.items() if k not in logged}
    if new:
        tracker.store_init_configuration(new)
    changed = {f"resumed.{k}": str(v) for k, v in config.items() if k in logged and logged[k] != str(v)}
    if changed:
        mlflow.set_tags(changed)


def remember(run_dir: Path, kwargs: dict[str, dict[str, Any]], started: list[Any]) -> None:
    """Keep the ids the trackers run under (RUN/trackers.json) for the next resume."""
    state = _saved(run_dir)
    if "wandb" in kwargs:
        state["wandb"] = kwargs["wandb"]["id"]
    for tracker in started:
        if tracker.name == "mlflow" and getattr(tracker, "active_run", None) is not None:
            state["mlflow"] = tracker.active_run.info.run_id
    if state:
        tmp = Path(run_dir) / f".{STATE}.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(Path(run_dir) / STATE)
