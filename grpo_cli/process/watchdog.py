"""No silent hang: a run that makes no progress for `train.stall_timeout_s` stops with an error naming the phase
and the process, after writing the stack of every thread of every process into the run folder.

Code marks where it is with `phase(name)` (phases nest: "score > reward 'sleepy'") and says it moved on with
`tick()` (a decoded token, a vLLM engine step, a synced tensor, a block of a checkpoint hashed, a scored batch, a
micro-batch's backward); entering or leaving a phase counts as progress too. Work the thread cannot see move (a
file written inside a C library, a request a server is answering) is watched by `progress_of(measure)`: the bytes
on disk growing, the server's count of engine steps rising. `phase` and `tick` cost a dict write, and all three are
no-ops while no watchdog is armed, so library code calls them freely. Each thread keeps its own phases: a thread inside a phase that has not progressed for the limit has
stalled, whatever the other threads do; a thread outside every phase (idle, or waiting on one that is inside
one) is not watched.

A stalled process writes `RUN/stalls/process-<i>.txt` (every thread's phases and Python stack) and
`process-<i>.json` (where it stalled, since when). The other processes of the run poll for such a report: each
writes its own (a process waiting in a collective for the stalled one shows where it waits) and stops. Each waits
a few seconds for the others' reports, then the process whose stall began first is named as the cause (in
`stalled.json` and the error) and every process exits. Nothing in a checkpoint is touched: checkpoints are
written to a temporary folder and moved into place (grpo_cli/run/checkpoints.py), so the last complete one stays
intact and `--resume auto` takes it. Reports older than the run's start are an earlier run's and are ignored.

Stopping is `os._exit`: a thread blocked in C (a collective, a socket read, `time.sleep` in a reward) cannot be
interrupted from Python. One exception: a one-process run started from Python (grpo_cli.train, a notebook whose
kernel should live on) is stopped with a signal to its main thread, whose handler raises `StallInterrupt` (a
BaseException, like KeyboardInterrupt: a reward's `except Exception` cannot swallow it); the API turns it into a
`StallError`. A blocked `time.sleep` or socket read wakes for a signal; a main thread that has not left the run
within GRACE_S still ends the process. Importing this module must not import torch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

STALLS_DIR = "stalls"
MARKER = "stalled.json"
EXIT_CODE = 1  # a run that failed on the way (grpo_cli/errors.py)
COLLECTIVE = "collective: "  # the phases in which a process waits for the others (grpo_cli/trainer/distributed.py)
PEER_WAIT_S = 10.0  # how long the first stalled process waits for the other processes' stack files
INTERRUPT = signal.SIGUSR1  # sent to the main thread of a run started from Python (`interrupt=True`)
GRACE_S = 30.0  # how long that main thread has to leave the run before the process ends anyway


class StallInterrupt(BaseException):
    """Raised in the main thread of a run started from Python when it stalled; the message is the error's."""

_armed: "Watchdog | None" = None


class _Thread:
    """One thread's open phases and when it last made progress."""

    __slots__ = ("phases", "last")

    def __init__(self) -> None:
        self.phases: list[str] = []
        self.last = time.monotonic()


_threads: dict[int, _Thread] = {}  # thread ident -> its record (only threads that entered a phase)


def _record() -> _Thread:
    ident = threading.get_ident()
    rec = _threads.get(ident)
    if rec is None:
        rec = _threads[ident] = _Thread()
    return rec


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the calling thread as inside `name` until the block ends (progress on entry and exit)."""
    if _armed is None:
        yield
        return
    rec = _record()
    rec.phases.append(name)
    rec.last = time.monotonic()
    try:
        yield
    finally:
        if rec.phases and rec.phases[-1] == name:
            rec.phases.pop()
        rec.last = time.monotonic()


def tick() -> None:
    """The calling thread made progress in its current phase."""
    if _armed is not None:
        rec = _threads.get(threading.get_ident())
        if rec is not None:
            rec.last = time.monotonic()


def _tick_thread(ident: int) -> None:
    rec = _threads.get(ident)
    if rec is not None:
        rec.last = time.monotonic()


@contextmanager
def progress_of(measure: Callable[[], object]) -> Iterator[None]:
    """For work whose progress the calling thread cannot report itself (a write inside a C library, a request a
    server is answering): while the block runs, a daemon thread reads `measure()` (bytes written so far, a
    server's count of finished engine steps) every quarter of the armed limit, and each change is progress of the
    calling thread. A `measure` that raises counts as no change. A no-op while no watchdog is armed."""
    dog = _armed
    if dog is None:
        yield
        return
    owner, stop = threading.get_ident(), threading.Event()
    interval = max(0.05, min(5.0, dog.timeout_s / 4))

    def poll() -> None:
        last: object = None
        while not stop.wait(interval):
            try:
                value = measure()
            except Exception:  # e.g. a server that does not answer this poll: no progress seen
                continue
            if value is not None and value != last:
                last = value
                _tick_thread(owner)

    poller = threading.Thread(target=poll, name="grpo-progress", daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join(timeout=interval + 1)


def folder_bytes(path: str | Path) -> int:
    """The bytes of every file under `path` so far (a folder being written; 0 when it is not there yet)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:  # renamed or removed meanwhile
                pass
    return total


class Watchdog:
    """Watches this process's threads from a daemon thread; `arm()` / `disarm()` around the part of a run it
    guards (`with Watchdog(...):`). `step` (settable) goes into the error message and the stack file."""

    def __init__(self, run_dir: str | Path, timeout_s: float, *, process: int = 0, processes: int = 1,
                 poll_s: float | None = None, say=None, interrupt: bool = False) -> None:
        """`interrupt`: a one-process run in the main thread raises StallInterrupt there instead of exiting."""
        self.run_dir, self.timeout_s = Path(run_dir), float(timeout_s)
        self.process, self.processes = process, processes
        self.interrupt = interrupt and processes == 1 and threading.current_thread() is threading.main_thread()
        self._previous_handler = None
        self.error = ""
        self.poll_s = poll_s if poll_s is not None else min(1.0, max(0.05, self.timeout_s / 20))
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.armed_at = time.time()

    @property
    def stalls(self) -> Path:
        return self.run_dir / STALLS_DIR

    def arm(self) -> "Watchdog":
        global _armed
        self.armed_at = time.time()  # files in stalls/ older than this are an earlier run's (this one resumed it)
        _threads.clear()
        _armed = self
        if self.interrupt:
            self._previous_handler = signal.signal(INTERRUPT, self._raise)
        self._thread = threading.Thread(target=self._watch, name="grpo-watchdog", daemon=True)
        self._thread.start()
        return self

    def _raise(self, signum, frame) -> None:
        raise StallInterrupt(self.error)

    def disarm(self) -> None:
        global _armed
        if _armed is self:
            _armed = None
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._previous_handler is not None:
            signal.signal(INTERRUPT, self._previous_handler)
            self._previous_handler = None
        _threads.clear()

    def __enter__(self) -> "Watchdog":
        return self.arm()

    def __exit__(self, *exc) -> None:
        self.disarm()

    # ----- the watching thread ------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            stalled = [(ident, rec) for ident, rec in list(_threads.items())
                       if rec.phases and now - rec.last > self.timeout_s]
            if stalled:
                ident, rec = max(stalled, key=lambda item: now - item[1].last)
                self._stop_run(" > ".join(rec.phases), now - rec.last, ident)
            elif self.processes > 1 and self._reports():
                self._stop_run()

    def _stop_run(self, where_: str | None = None, idle_s: float = 0.0, ident: int | None = None) -> None:
        """Write this process's stacks and report; wait for the others' (each stops when it sees a report, or on its
        own timeout); name the process whose stall began first; exit. `where_` None: this process did not stall
        itself, another one's report stopped it."""
        mine = "; ".join(" > ".join(r.phases) for r in list(_threads.values()) if r.phases) or "no phase"
        thread = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        info = {"process": self.process, "pid": os.getpid(), "host": socket.gethostname(), "step": self.step,
                "time": time.time(), "phase": where_ or mine, "thread": thread if where_ else None,
                "idle_s": round(idle_s, 1), "since": time.time() - idle_s if where_ else None}
        headline = (f"stalled: no progress for {idle_s:.0f} s in {where_} (thread {thread})" if where_ else
                    f"stopped because another process stalled; this process was in {mine}")
        self.stalls.mkdir(parents=True, exist_ok=True)
        stacks = self.stalls / f"process-{self.process}.txt"
        stacks.write_text(stack_report(headline, self.process, self.step))
        _write_json(self.stalls / f"process-{self.process}.json", info)
        reports = self._wait_for_peers()
        # the cause: a process stalled in its own work rather than in a collective (which waits for the others),
        # the one whose stall began first; the others waited on it or were stopped by its report
        stalled = [r for r in reports if r.get("since") is not None]
        root = min(stalled, key=lambda r: (r["phase"].split(" > ")[-1].startswith(COLLECTIVE), r["since"]), default=info)
        if root["process"] == self.process:
            _write_json(self.stalls / MARKER, root)
            text = self.message(root, stacks, [r["process"] for r in reports])
            if self.interrupt:
                self._interrupt_main(text.removeprefix("error: "))
                return
            self.say(text)
        else:
            self.say(f"error: process {self.process} stopped: process {root['process']} (pid {root['pid']} on "
                     f"{root['host']}) made no progress for {root['idle_s']:.0f} s in {root['phase']}; this process "
                     f"was in {mine}; its stacks: {stacks}")
        os._exit(EXIT_CODE)

    def _interrupt_main(self, error: str) -> None:
        """StallInterrupt(error) in the main thread; the process ends if the run is not left within GRACE_S."""
        self.error = error
        signal.pthread_kill(threading.main_thread().ident, INTERRUPT)
        if not self._stop.wait(GRACE_S):  # disarm() sets it as the main thread leaves the run
            self.say(f"error: {error}; the main thread did not stop within {GRACE_S:.0f} s of the signal: exiting")
            os._exit(EXIT_CODE)

    def _reports(self) -> list[dict]:
        """This run's stall reports, one per process that has written one."""
        out = []
        for i in range(self.processes):
            try:
                info = json.loads((self.stalls / f"process-{i}.json").read_text())
            except (OSError, ValueError):
                continue
            if info.get("time", 0) >= self.armed_at:  # older: an earlier run's, which this one resumed
                out.append(info)
        return out

    def _wait_for_peers(self) -> list[dict]:
        """-> the reports of every process (or of those written within PEER_WAIT_S: a process on another machine
        without a shared run folder never writes here)."""
        deadline = time.monotonic() + (PEER_WAIT_S if self.processes > 1 else 0)
        while True:
            reports = self._reports()
            if len(reports) == self.processes or time.monotonic() >= deadline:
                return reports
            time.sleep(0.1)

    def message(self, info: dict, stacks: Path, written: list[int]) -> str:
        from grpo_cli.run.checkpoints import latest_checkpoint

        last = latest_checkpoint(self.run_dir)
        where_ = f"process {info['process']} of {self.processes} (pid {info['pid']} on {info['host']})"
        others = ""
        if self.processes > 1:
            missing = sorted(set(range(self.processes)) - set(written))
            others = f"; every process's stacks are in {self.stalls}" + (
                f" (none from process {', '.join(map(str, missing))}: on another machine or gone)" if missing else "")
        kept = (f"the last checkpoint ({last.name}) is intact: fix the cause and resume with --resume auto"
                if last is not None else "no checkpoint was written before it")
        return (f"error: stalled: {where_} made no progress for {info['idle_s']:.0f} s in {info['phase']} "
                f"(step {info['step']}, thread {info['thread']}); its stacks: {stacks}{others}; {kept}. "
                f"train.stall_timeout_s ({self.timeout_s:g} s) sets the limit")


def _write_json(path: Path, info: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)


def stack_report(headline: str, process: int, step: int) -> str:
    """Every thread's phases and Python stack, the stalled one's first."""
    names = {t.ident: t for t in threading.enumerate()}
    lines = [f"grpo stall report: {headline}", f"process {process}, pid {os.getpid()}, host {socket.gethostname()}, "
             f"step {step}, {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    now = time.monotonic()

    def order(item) -> tuple:  # threads in a phase first, the longest without progress first
        rec = _threads.get(item[0])
        return (0, rec.last) if rec is not None and rec.phases else (1, 0.0)

    for ident, frame in sorted(sys._current_frames().items(), key=order):
        t = names.get(ident)
        rec = _threads.get(ident)
        phases = (f"in {' > '.join(rec.phases)} for {now - rec.last:.1f} s without progress"
                  if rec is not None and rec.phases else "outside every phase")
        kind = " (daemon)" if t is not None and t.daemon else ""
        lines.append(f"--- thread {t.name if t is not None else ident}{kind}: {phases}")
        lines.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        lines.append("")
    return "\n".join(lines) + "\n"
