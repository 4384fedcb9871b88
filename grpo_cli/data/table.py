"""Rows held in memory as columns: a generator's problems and local JSON files, read without `datasets`.

`datasets` brings pyarrow and pandas with it: 86 MiB resident in a run that never uses them (SmolLM2-135M's
quickstart peaks at 2.9 GiB; bench/RESULTS.md) and about a second of imports. A run whose rows come from
data.generator or from .json/.jsonl data.files (not streamed) reads them here; Parquet, CSV, hub datasets, a
`save_to_disk` folder and data.streaming still go through `datasets`.

`Rows` has the part of `datasets.Dataset` that grpo uses: `len`, a row by index, the columns of a list of indices, a
column by name, iteration over rows, `column_names`, `select`, `to_dict`. A row's columns are the union of every
row's keys, in the order they first appear; a key a row lacks reads None there (as in `datasets`). Values are what
the file or the generator wrote (an integer stays an integer beside a float, where `datasets` casts the column to one
Arrow type), handed out as copies: a caller may change what it gets, as with `datasets`.

Importing this module must not import torch, transformers or datasets (`grpo validate` reads files through it).
"""

from __future__ import annotations

import copy
import json
import numbers
from pathlib import Path
from typing import Any, Iterator

from grpo_cli.errors import DataError


class Rows:
    """A table of rows in memory (see the module's docstring)."""

    def __init__(self, columns: dict[str, list]) -> None:
        sizes = {len(v) for v in columns.values()}
        if len(sizes) > 1:
            raise ValueError(f"columns of different lengths: {sorted(sizes)}")
        self._columns = columns
        self._len = sizes.pop() if sizes else 0

    @classmethod
    def from_list(cls, rows: list[dict]) -> Rows:
        """Rows from one dict per row; DataError for a row that is not a dict."""
        names: dict[str, None] = {}
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(f"row {i} is a {type(row).__name__}, not a dict of columns")
            names.update(dict.fromkeys(row))
        return cls({name: [row.get(name) for row in rows] for name in names})

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key: int | str | slice | range | list[int]) -> Any:
        """A row (int) -> {column: value}; a column (str) -> its values; rows (a slice, range or list of ints) ->
        {column: their values, in that order}."""
        if isinstance(key, str):
            if key not in self._columns:
                raise KeyError(f"no column {key!r}; columns: {', '.join(self._columns)}")
            return copy.deepcopy(self._columns[key])
        if isinstance(key, numbers.Integral):  # an int, numpy's too
            i = range(self._len)[int(key)]  # IndexError past the end; a negative index counts from it
            return {name: copy.deepcopy(values[i]) for name, values in self._columns.items()}
        indices = range(self._len)[key] if isinstance(key, slice) else [range(self._len)[int(i)] for i in key]
        return {name: [copy.deepcopy(values[i]) for i in indices] for name, values in self._columns.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self._len):
            yield self[i]

    def select(self, indices) -> Rows:
        """The rows at `indices` (an iterable of ints), in that order."""
        return Rows(self[list(indices)])

    def to_dict(self) -> dict[str, list]:
        return self[:]

    def __repr__(self) -> str:
        return f"Rows(columns={self.column_names}, rows={self._len})"


def json_rows(path: Path, n: int | None = None) -> list[dict]:
    """The rows in the first n lines (None: all) of a JSON Lines file, else of one JSON document: an array of
    objects, or an object of column lists (a shorter column reads None). DataError naming the first bad line."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in (f if n is None else (f.readline() for _ in range(n))) if line.strip()]
    rows, error = [], None
    for i, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            error = f"line {i}: {e.msg} at column {e.colno}"
            break
        if not isinstance(row, dict):
            error = f"line {i} is a JSON {type(row).__name__}, not an object of columns"
            break
        rows.append(row)
    if error is None:
        return rows
    try:  # not JSON Lines: one JSON document
        whole = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise DataError(f"{path}: not JSON Lines (one object per line) nor one JSON document: {error}") from None
    if isinstance(whole, list) and whole and all(isinstance(r, dict) for r in whole[:n]):
        return whole[:n]
    if isinstance(whole, dict) and whole and all(isinstance(v, list) for v in whole.values()):
        size = max(len(v) for v in whole.values())
        return [{k: v[i] if i < len(v) else None for k, v in whole.items()} for i in range(min(size, n or size))]
    raise DataError(f"{path}: expected JSON Lines, a JSON array of objects or an object of column lists")
