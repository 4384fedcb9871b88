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


FINGERPRINT_BYTES = 4096  # hashed from each end of a file


def file_fingerprints(paths: list[str]) -> list[str]:
    """'name size hash' of each file (a folder: of every file under it, in name order): its size and a sha256 of its
    first and last FINGERPRINT_BYTES. A shard rewritten, appended to or swapped for another changes it; an edit
    inside a large file that keeps its size and ends does not (hashing every byte would read the dataset at every
    start)."""
    import hashlib
    import os

    out = []
    for p in paths:
        root = Path(p).expanduser()
        files = sorted(x for x in root.rglob("*") if x.is_file()) if root.is_dir() else [root]
        for f in files:
            size, h = f.stat().st_size, hashlib.sha256()
            with open(f, "rb") as fh:
                h.update(fh.read(FINGERPRINT_BYTES))
                if size > FINGERPRINT_BYTES:
                    fh.seek(max(size - FINGERPRINT_BYTES, FINGERPRINT_BYTES))
                    h.update(fh.read())
            name = os.path.relpath(f, root) if root.is_dir() else f.name
            out.append(f"{name} {size} {h.hexdigest()[:16]}")
    return out
