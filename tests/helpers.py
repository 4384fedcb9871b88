"""Small helpers shared by tests (fixtures live in conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("time/", "throughput/", "memory/")  # wall-clock and peak-memory numbers differ between runs


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(m: dict) -> dict:
    """A metrics record without the keys that differ between two identical runs."""
    return {k: v for k, v in m.items() if not k.startswith(VOLATILE)}


def cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """`python -m grpo_cli ARGS` from the repo root, output captured."""
    return subprocess.run([sys.executable, "-m", "grpo_cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, **{"env": os.environ, **kw})
