"""Rows handed over from Python (`grpo_cli.train(dataset=...)`: a `datasets.Dataset` or a list of dicts), saved as
one Parquet file that the recipe then names in `data.files`, so the run's saved recipe is complete: the command line
resumes it, `grpo eval` and `grpo replay` read the same rows.

The file is named by the SHA-256 of its bytes (`train-<hash>.parquet`): the same rows give the same name (a resume
sees no recipe change), other rows another name (the resume's drift check names `data.files`). Importing this
module must not import datasets.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from grpo_cli.errors import DataError

FOLDER = "data"  # under the run folder; kept by --start-over (the recipe names it)


def to_dataset(rows: Any, what: str = "dataset"):
    """A `datasets.Dataset` from a Dataset or a list of dicts; DataError for anything else or no rows."""
    from datasets import Dataset, DatasetDict, IterableDataset

    if isinstance(rows, Dataset):
        ds = rows
    elif isinstance(rows, DatasetDict):
        raise DataError(f"{what}: a DatasetDict holds splits ({', '.join(rows)}); pass one of them, e.g. ds['train']")
    elif isinstance(rows, IterableDataset):
        raise DataError(f"{what}: an IterableDataset cannot be saved with the run for a resume; name its files "
                        "(JSONL or Parquet shards) in data.files, or its hub name in data.dataset, and set "
                        "data.streaming: true")
    elif isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        try:
            ds = Dataset.from_list(list(rows))
        except Exception as e:  # noqa: BLE001 - pyarrow's type errors, for people
            raise DataError(f"{what}: the rows do not make one table ({type(e).__name__}: {e}); give every row the "
                            "same columns with values of one type each") from None
    else:
        raise DataError(f"{what}: give a datasets.Dataset or a list of dicts (one per row), not {type(rows).__name__}")
    if len(ds) == 0:
        raise DataError(f"{what} has no rows")
    return ds


def save_rows(rows: Any, run_dir: Path, split: str = "train") -> Path:
    """`rows` written once as RUN/data/<split>-<sha256[:16]>.parquet -> its path."""
    ds = to_dataset(rows, "dataset" if split == "train" else f"{split} dataset")
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".parquet", dir=folder)
    os.close(fd)
    try:
        _quietly_to_parquet(ds, tmp)
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()[:16]
        path = folder / f"{split}-{digest}.parquet"
        if path.exists():
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _quietly_to_parquet(ds, path: str) -> None:
    """Dataset.to_parquet without its progress bar (a notebook cell would show one per call)."""
    from datasets.utils import logging as ds_logging

    shown = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        ds.to_parquet(path)
    finally:
        if shown:
            ds_logging.enable_progress_bar()
