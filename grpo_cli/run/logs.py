"""The run folder's logs: metrics.jsonl (one record per step) and rollouts.jsonl (one per completion), written
append-only a line at a time, and their one reader, which every tool that looks at a run goes through.

A crash can cut the last line of a file in the middle; a resumed run drops the lines of steps after its
checkpoint (JsonlLog). Lines are split on "\n" only: str.splitlines() would also cut at U+2028 or U+0085,
which completions may hold.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS, ROLLOUTS = "metrics.jsonl", "rollouts.jsonl"
RESUMES = "resumes.jsonl"  # one line per resume (grpo_cli/run/folder.py record_resume)


@dataclass
class Records:
    """What a JSONL log holds: its records, and the lines that are not records."""

    records: list[dict[str, Any]]  # JSON objects with the integer keys asked for, in file order
    bad: list[int]  # line numbers (1-based, from where reading began) of the other non-blank lines
    last: int  # the number of the last non-blank line: a crash cuts only that one
    end: int  # byte offset after the last line read: where to continue reading a growing file


def read_records(path: str | Path, required: tuple[str, ...] = ("step",), *, offset: int = 0,
                 complete_only: bool = False) -> Records:
    """The records of a run's JSONL file from byte `offset` on. `complete_only`: leave a last line without its
    newline (still being written) for the next call. A missing file holds nothing."""
    path = Path(path)
    if not path.exists():
        return Records([], [], 0, offset)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1 if complete_only else len(data)
    records, bad, last = [], [], 0
    for number, line in enumerate(data[:end].decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        last = number
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            r = None
        if isinstance(r, dict) and all(type(r.get(k)) is int for k in required):
            records.append(r)
        else:
            bad.append(number)
    return Records(records, bad, last, offset + end)


def tail_after(path: Path, step: int, block: int = 1 << 20) -> tuple[int, int]:
    """(byte offset after the last line holding a record of a step <= `step`, records of later steps after it),
    reading `path` backwards a block at a time; a last line without its newline (cut by a crash) is cut too."""
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        carried, first_block, dropped = b"", True, 0
        while True:
            start = max(0, pos - block)
            f.seek(start)
            # + the start of the line the previous block began inside (its end and newline were in that block)
            lines = (f.read(pos - start) + carried).split(b"\n")
            # lines[-1]: in the first block, what follows the file's last newline (nothing, or a line cut by a
            # crash); later, the line `carried` ends, complete. lines[0] may start before `start`: carried on.
            starts, at = [], start
            for line in lines:
                starts.append(at)
                at += len(line) + 1
            for k in range(len(lines) - 1, -1 if start == 0 else 0, -1):
                line = lines[k]
                if not line.strip() or (first_block and k == len(lines) - 1):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and type(r.get("step")) is int:
                    if r["step"] <= step:
                        return starts[k] + len(line) + 1, dropped
                    dropped += 1
            if start == 0:
                return 0, dropped
            pos, carried, first_block = start, lines[0], False


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every line stays standard JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlLog:
    """Append-only JSON-lines file, one record per line, flushed at every write.

    On resume from step k, records of steps > k (written after the checkpoint by a run that then
    died) are dropped, so the file reads as if the run had never been interrupted. Steps only grow along the
    file, so they are its tail: it is read backwards from the end, block by block, to the last record of a step
    <= k, and cut there (truncated and fsynced in place: a rollouts.jsonl of many GB costs the tail's blocks,
    not a copy in memory). A last line cut by a crash goes with the tail."""

    def __init__(self, path: Path, keep_through_step: int) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            cut, self.dropped = tail_after(path, keep_through_step)  # the caller says so: never rewound silently
            if cut < path.stat().st_size:
                with open(path, "r+b") as f:
                    f.truncate(cut)
                    f.flush()
                    os.fsync(f.fileno())
        else:
            self.dropped = 0
        self._f = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        self._f.write("".join(json.dumps(_clean(r), ensure_ascii=False) + "\n" for r in records))
        self._f.flush()

    def close(self) -> None:
        self._f.close()
