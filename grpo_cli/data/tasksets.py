"""verifiers tasksets as a recipe's data (data.generator: verifiers): one row per task, {"task": index, "prompt": its
prompt as text}, for the episodes agents/verifiers.py runs. A taskset is what verifiers loads: an installed taskset's
id (a package exporting its Taskset via `__all__`), or a file `path/to/taskset.py` (its folder joins the import
path). Importing this module must not import torch or verifiers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def taskset_id(target: str) -> str:
    """A taskset's id or file -> the id verifiers imports; a file's folder joins sys.path (its stem is the id)."""
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        folder = str(path.parent.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return path.stem
    return target


def load_taskset(target: str, config: dict[str, Any] | None = None) -> Any:
    """The taskset, constructed with its config (ValueError naming what is wrong)."""
    try:
        from verifiers.v1.configs.taskset import TasksetConfig
        from verifiers.v1.taskset import Taskset
        from verifiers.v1.utils.generic import concrete_type
        from verifiers.v1.utils.loaders import taskset_class
    except ImportError:
        raise ValueError("verifiers is not installed: pip install verifiers==0.4.0") from None
    ident = taskset_id(target)
    try:
        cls = taskset_class(ident)
        config_cls = concrete_type(cls, TasksetConfig, origin=Taskset) or TasksetConfig
        return cls(config_cls.model_validate({"id": ident, **(config or {})}))
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"verifiers taskset {ident!r}: {type(e).__name__}: {e}") from None


def task_rows(n: int, seed: int, taskset: str, taskset_config: dict | None = None) -> list[dict[str, Any]]:
    """At most `n` rows, one per task in the taskset's order: {"task": index, "prompt": its prompt as text}."""
    rows = []
    for i, task in enumerate(load_taskset(taskset, taskset_config)):
        if i >= n:
            break
        prompt = task.data.prompt
        rows.append({"task": i, "prompt": prompt if isinstance(prompt, str) else str(prompt)})
    return rows
