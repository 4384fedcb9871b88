"""Rewinds: `--resume RUN/checkpoints/step-K --rewind` continues a run from a checkpoint before its newest. The
branch it abandons (the later checkpoints, their replay records, the log lines of later steps) is moved to
`RUN/abandoned/<time>-rewind-to-step-K/`, named and never deleted, so no later `--resume auto` or retention can go
back to it. Without --rewind such a resume is refused (grpo_cli/run/folder.py).

A rewind survives kill -9 at any point: `rewind.json` in its folder lists every move before the first is made and
is marked done after the last; a start that finds one not done (`finish_pending`) finishes it first. The log lines
are copied before anything moves (the run's own logs drop them when the rewound run opens them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from grpo_cli.run.checkpoints import (
    ABANDONED, CHECKPOINTS, abandoned_folder, atomic_write_text, checkpoint_step, fsync_dir, list_checkpoints,
    step_of,
)
from grpo_cli.run.logs import METRICS, ROLLOUTS, tail_after

INTENT = "rewind.json"
REPLAY = "replay"  # grpo_cli/run/replays.py's FOLDER (that module imports torch)


def later_checkpoints(run_dir: Path, checkpoint: Path) -> list[Path]:
    """The run folder's complete checkpoints of steps after `checkpoint`'s: what resuming it would abandon."""
    step = checkpoint_step(checkpoint)
    return [p for p in list_checkpoints(run_dir) if step is not None and step_of(p) > step]


def rewind(run_dir: Path, checkpoint: Path, say: Callable[[str], None]) -> Path | None:
    """Set aside everything of `run_dir` after `checkpoint`'s step; -> the folder it went to (None: nothing later)."""
    step = checkpoint_step(checkpoint)
    if step is None:  # a folder whose step is not known: nothing is later than it
        return None
    moves = [p for p in (run_dir / CHECKPOINTS).glob("step-*") if (step_of(p) or 0) > step]
    moves += [p for p in (run_dir / REPLAY).glob("step-*") if p.name[5:].isdigit() and int(p.name[5:]) > step]
    if not moves:
        return None
    folder = abandoned_folder(run_dir, f"rewind-to-step-{step}")
    folder.mkdir(parents=True)
    intent = {"from_step": step, "checkpoint": str(checkpoint), "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "moves": sorted(p.relative_to(run_dir).as_posix() for p in moves), "done": False}
    atomic_write_text(folder / INTENT, json.dumps(intent, indent=1))
    fsync_dir(folder.parent)
    _finish(run_dir, folder, intent)
    names = ", ".join(Path(m).name for m in intent["moves"] if m.startswith(CHECKPOINTS))
    say(f"--rewind: resuming from step {step}; the later steps' checkpoints ({names or 'none'}), replay records and "
        f"log lines are kept in {folder}")
    return folder


def finish_pending(run_dir: Path, say: Callable[[str], None]) -> None:
    """Finish a rewind that a kill interrupted (the lock holder, before anything reads the folder)."""
    root = run_dir / ABANDONED
    for intent_file in sorted(root.glob(f"*/{INTENT}")) if root.is_dir() else []:
        try:
            intent = json.loads(intent_file.read_text())
        except (OSError, ValueError):
            continue  # cut while written: nothing had moved yet (the moves start after it is complete)
        if not intent.get("done"):
            _finish(run_dir, intent_file.parent, intent)
            say(f"finished the rewind to step {intent['from_step']} that was interrupted; the later steps are kept "
                f"in {intent_file.parent}")


def _finish(run_dir: Path, folder: Path, intent: dict) -> None:
    """Copy the log lines of later steps, move every listed folder, mark the rewind done; each part idempotent."""
    step = intent["from_step"]
    for name in (METRICS, ROLLOUTS):
        if (run_dir / name).is_file() and not (folder / name).exists():  # the lines after the step, streamed
            cut, _ = tail_after(run_dir / name, step)
            tmp = folder / f".{name}.tmp"
            with open(run_dir / name, "rb") as src, open(tmp, "wb") as dst:
                src.seek(cut)
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, folder / name)
    for rel in intent["moves"]:
        src, dst = run_dir / rel, folder / rel
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
            fsync_dir(src.parent)
    intent["done"] = True
    atomic_write_text(folder / INTENT, json.dumps(intent, indent=1))
