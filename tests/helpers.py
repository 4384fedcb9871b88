"""Small helpers shared by tests (fixtures live in conftest.py)."""

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
