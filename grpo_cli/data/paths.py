"""Data file names as recipes give them: data.files and eval.files entries may be glob patterns.

Importing this module must not import torch, transformers or datasets (`grpo validate` reads it).
"""

from __future__ import annotations

import glob
from pathlib import Path

from grpo_cli.errors import DataError


def expand_files(files: list[str], field: str) -> list[str]:
    """data.files / eval.files with each glob pattern (`shards/train-*.parquet`) replaced by the files it matches, in
    name order; DataError for a pattern that matches none."""
    out = []
    for f in files:
        if not glob.has_magic(f):
            out.append(f)
            continue
        matched = sorted(glob.glob(str(Path(f).expanduser())))
        if not matched:
            raise DataError(f"{field}: {f} matches no file; fix the pattern (relative paths in a recipe start at its "
                            "folder, in an override at the working directory)")
        out += matched
    return out
