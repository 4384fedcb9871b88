"""reasoning-gym (`pip install reasoning-gym`) as a data source and as its own judge: its tasks' problems become rows
(`data.generator: reasoning_gym`), and each row's entry is rebuilt from its place to be scored by the task's own
`score_answer` (the reward `reasoning_gym`, rewards/builtin.py).

A row carries where its problem came from: `task`, `task_config` (the task's settings, JSON), `task_seed`,
`task_size` and `task_index`. reasoning-gym makes entry i of a dataset from its seed and size, so `entry_of` gives back the very entry
the generator saw, its metadata's tuples and numbers included (a JSON copy of the metadata loses them: arc_agi's
grids are tuples its scorer compares with tuples). Rows that carry only a `metadata` column (a file written from
reasoning-gym elsewhere) are scored with that column read as JSON.

Importing this module must not import reasoning-gym (it is optional) or torch.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

from grpo_cli.errors import DataError


def _gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise DataError("reasoning-gym is not installed: pip install reasoning-gym") from None
    return reasoning_gym


@functools.lru_cache(maxsize=64)
def _dataset(task: str, config: str, seed: int, size: int) -> Any:
    """The task's dataset (its `score_answer` and entries), made as the generator made it (some tasks draw their
    whole set when they are made, so the size is part of what makes entry i)."""
    try:
        return _gym().create_dataset(task, size=size, seed=seed, **json.loads(config))
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"reasoning-gym could not create task {task!r} with {json.loads(config)}: {e}") from e


def _config_text(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def _mix(task: str | list[str] | dict[str, Any]) -> dict[str, tuple[float, dict[str, Any]]]:
    """task name -> (weight, its settings), from `task: name`, `task: [a, b]` (equal weights) or
    `task: {a: {weight: 2, min_terms: 3}, b: {}}`."""
    if isinstance(task, str):
        return {task: (1.0, {})}
    if isinstance(task, list):
        return {t: (1.0, {}) for t in task}
    mix = {}
    for name, spec in task.items():
        spec = dict(spec or {})
        weight = float(spec.pop("weight", 1.0))
        if weight <= 0:
            raise DataError(f"reasoning-gym task {name!r}: weight must be > 0, got {weight}")
        mix[name] = (weight, spec)
    return mix


def problems(n: int, seed: int, task: str | list[str] | dict[str, Any], **config: Any) -> list[dict[str, Any]]:
    """n rows of one task (`config`: its settings) or of a mix of tasks (each row's task drawn by weight, seeded).
    Columns: prompt, answer (None for a task without a single right answer: its scorer checks what is given),
    task, task_config, task_seed, task_size, task_index, metadata (JSON, for reading)."""
    mix = _mix(task)
    if config and len(mix) > 1:
        raise DataError("reasoning-gym: with several tasks give each task's settings under its name "
                        "(task: {chain_sum: {min_terms: 3}, basic_arithmetic: {}})")
    names = list(mix)
    rng = random.Random(seed)
    drawn = rng.choices(names, weights=[mix[t][0] for t in names], k=n) if len(names) > 1 else names * n
    sizes = {name: drawn.count(name) for name in names}
    taken = dict.fromkeys(names, 0)
    rows = []
    for name in drawn:
        text = _config_text({**mix[name][1], **config})
        index = taken[name]
        taken[name] += 1
        entry = _dataset(name, text, seed, sizes[name])[index]
        rows.append({
            "prompt": entry["question"],
            "answer": None if entry["answer"] is None else str(entry["answer"]),
            "task": name, "task_config": text, "task_seed": seed, "task_size": sizes[name], "task_index": index,
            "metadata": json.dumps(entry.get("metadata", {}), default=str),
        })
    return rows


def entry_of(row: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the task's dataset, the entry its scorer reads) for one row's columns (task, and task_config, task_seed,
    task_size, task_index; or metadata and answer)."""
    task, config = row["task"], row.get("task_config") or "{}"
    place = [row.get(k) for k in ("task_seed", "task_size", "task_index")]
    if None not in place:
        seed, size, index = (int(v) for v in place)
        dataset = _dataset(task, config, seed, size)
        return dataset, dataset[index]
    metadata = row.get("metadata")
    return _dataset(task, config, 0, 1), {"answer": row.get("answer"), "metadata": json.loads(metadata) if metadata else {}}


def task_score(answer: str | None, row: dict[str, Any]) -> float:
    """The task's own `score_answer(answer, entry)` for one row (answer None: nothing was extracted)."""
    dataset, entry = entry_of(row)
    return float(dataset.score_answer(answer, entry))
