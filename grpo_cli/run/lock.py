"""One trainer per run folder: an OS-level lock on `RUN_DIR/.grpo-lock`, held for the process lifetime.

`fcntl.flock` is released by the kernel when its holder dies in any way (kill -9 and the OOM killer
included), so a lock file left behind by a dead run never blocks the next one; its content (pid,
host, start time, command) only tells a refused second trainer who holds the folder. The lock is
taken before anything is written or a model is loaded, by the run's front door (grpo_cli/preflight/prepare.py's
prepare_run, for `grpo train` and `grpo_cli.train`; `grpo replay` for its own folder). Re-entrant within one
process. Multi-process runs: the launcher holds it and tells its workers so through $GRPO_RUN_LOCK_HOLDER;
workers started by hand (`accelerate launch -m grpo_cli train ...`) let global rank 0 take it.
Importing this module must not import torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from grpo_cli.errors import RunLockedError

LOCK_FILE = ".grpo-lock"
HOLDER_ENV = "GRPO_RUN_LOCK_HOLDER"  # "<pid>:<run folder, resolved>" set by the launcher for its workers

_held: dict[str, list] = {}  # resolved run folder -> [fd, reference count]


def _key(run_dir: str | Path) -> str:
    return str(Path(run_dir).resolve())


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}: {info['command']}"
    except (ValueError, KeyError, TypeError, OSError):
        return "a process that has not yet written its name"  # the holder is between flock and write


def inherited(run_dir: str | Path) -> bool:
    """True in a worker whose launcher holds the lock of this run folder (see HOLDER_ENV)."""
    pid, _, folder = os.environ.get(HOLDER_ENV, "").partition(":")
    return bool(pid) and folder == _key(run_dir)


def acquire(run_dir: str | Path) -> str:
    """Take the run folder's lock (creating the folder); RunLockedError naming the holder if it is taken.

    Returns the key to `release` with. A process may acquire the same folder more than once."""
    import fcntl

    key = _key(run_dir)
    if key in _held:
        _held[key][1] += 1
        return key
    try:
        Path(key).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(key) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunLockedError(f"cannot use {key} as a run folder: {e}; pick another --output-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunLockedError(
            f"run folder {key} is in use by another trainer ({holder}); wait for it to finish or stop it, "
            "or train into another folder with --output-dir"
        ) from None
    except OSError as e:
        os.close(fd)
        raise RunLockedError(f"cannot lock run folder {key} ({e}); put the run on a file system that supports flock") from None
    program = "grpo" if Path(sys.argv[0]).name in ("grpo", "__main__.py") else sys.argv[0]
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": " ".join([program, *sys.argv[1:]])}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    _held[key] = [fd, 1]
    return key


def release(key: str) -> None:
    """Drop one reference; the last one unlocks (the file stays: deleting it would race with a new holder)."""
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        os.close(entry[0])  # closing the only descriptor releases the flock


def holds(run_dir: str | Path) -> bool:
    return _key(run_dir) in _held
