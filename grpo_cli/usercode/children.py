"""Child processes that can be killed with everything they started: rewards with `timeout_s`, environments
with `rollout.environment_timeout_s`, tool calls and agent programs (`rollout.agent`) run in them.

Children come from multiprocessing's "forkserver" (a clean server process forks each child, which is safe in a
process holding CUDA or threads and costs milliseconds after the first); the child calls `os.setpgrp()` and
`become_subreaper()` first, so `kill_tree` finds whatever it started, even processes that left its group.
Importing this module must not import torch.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess


def mp_context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Imported once in the server, not in every child (ignored if the server already runs).
    ctx.set_forkserver_preload(["grpo_cli.rewards.scoring", "grpo_cli.agents.environments", "math_verify"])
    return ctx


def user_error_text(e: BaseException) -> str:
    """`Type: message (at file.py:line)`: the last line of the user's code it came from (grpo_cli's frames left
    out)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "grpo_cli" not in f.filename]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def send_error(conn: Connection, e: BaseException) -> None:
    """A child's failure back to its parent: ("error", user_error_text(e)), or its type alone if that cannot be
    sent."""
    try:
        conn.send(("error", user_error_text(e)))
    except Exception:  # noqa: BLE001 - e.g. a message that cannot be pickled
        conn.send(("error", type(e).__name__))


def become_subreaper() -> None:
    """Linux: orphans of the child's own processes (a double fork, a daemon) are re-parented to the child,
    not to init, so `descendants` still finds them when the timeout comes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list[int]:
    """Linux: every process below `pid` (whatever its process group or session), from /proc; [] elsewhere."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(proc: BaseProcess) -> None:
    """SIGKILL the child and everything it started: processes that left its group (`start_new_session`,
    setsid daemons) are found below it in /proc while it still lives (it is their subreaper), then its group."""
    if proc.pid is not None and hasattr(os, "killpg"):
        signal_group(proc.pid, signal.SIGSTOP)  # the child's own code forks no more
        for _ in range(5):  # what is below may still fork once more; orphans land on the stopped child
            victims = descendants(proc.pid)
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        signal_group(proc.pid, signal.SIGKILL)  # the group exists only once the child has called setpgrp
    if proc.is_alive():
        proc.kill()
    proc.join()  # reap: no zombies


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


@dataclass
class Child:
    """A one-shot child: it sends one message on `reader` (("ok", ...) or ("error", ...)) and exits."""

    proc: BaseProcess
    reader: Connection
    deadline: float
    timeout_s: float


def start(target: Callable[..., None], args: tuple, name: str, timeout_s: float) -> Child:
    """Start `target(*args, writer)` in a child whose answer is due within `timeout_s`; the exception of a start
    that fails (e.g. arguments that cannot be pickled) propagates."""
    ctx = mp_context()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, writer), name=name)
    try:
        proc.start()
    except BaseException:
        reader.close()
        raise
    finally:
        writer.close()
    return Child(proc, reader, time.monotonic() + timeout_s, timeout_s)


def answer(child: Child) -> tuple[str, Any]:
    """Wait for the child's message until its deadline -> the message (("ok", ...) / ("error", ...)), ("timeout",)
    after killing it, or ("exited", exit code) when it ended without one. The child is gone afterwards."""
    try:
        if not child.reader.poll(max(0.0, child.deadline - time.monotonic())):
            kill_tree(child.proc)
            return ("timeout",)
        try:
            msg = child.reader.recv()
        except EOFError:
            child.proc.join(5)
            return ("exited", child.proc.exitcode)
        child.proc.join(5)
        return msg
    finally:
        child.reader.close()
        if child.proc.is_alive():
            kill_tree(child.proc)
