"""Where the rows come from: a hub or local dataset (data.dataset), local .json/.jsonl/.parquet/.csv files
(data.files), or an offline problem generator (data.generator, grpo_cli/data/generators.py); loaded, or opened as a
stream with data.streaming (grpo_cli/data/streaming.py). Each source's errors name the field and what to change.
A generator's rows and JSON files that are not streamed are read into grpo_cli/data/table.py's `Rows`, without
`datasets`; the rest through `datasets`.

Importing this module must not import torch, transformers or datasets (`grpo validate` checks data through it);
heavy imports live inside the functions that need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from grpo_cli.data.generators import GENERATORS
from grpo_cli.data.paths import expand_files
from grpo_cli.data.prompts import check_columns
from grpo_cli.data.table import Rows, json_rows
from grpo_cli.errors import DataError, first_line

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

    from grpo_cli.recipe.schema import DataConfig


FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(cfg: DataConfig, seed: int) -> Rows | Dataset | IterableDataset:
    """The rows to train on, from data.dataset, data.files or data.generator, cut to data.limit; with data.streaming
    an IterableDataset, opened and its columns checked but not read (the stream applies data.limit)."""
    if cfg.generator:
        ds = _generated_rows(cfg, seed)
        source = f"data.generator {cfg.generator!r}"
    elif cfg.files:
        ds = _file_rows(expand_files(cfg.files, "data.files"), cfg.streaming)
        source = f"data.files {cfg.files}"
    else:
        ds = _dataset_rows(cfg)
        source = f"data.dataset {cfg.dataset!r}"
    if cfg.streaming:
        from grpo_cli.data.streaming import stream_columns

        check_columns(cfg, stream_columns(ds, source), source)
        return ds
    if cfg.limit is not None:
        ds = ds.select(range(min(cfg.limit, len(ds))))
    if len(ds) == 0:
        raise DataError(f"{source} has no rows; check the split, files or data.limit")
    check_columns(cfg, ds.column_names, source)
    return ds


def _generated_rows(cfg: DataConfig, seed: int) -> Rows:
    kwargs = dict(cfg.generator_kwargs)
    size = kwargs.pop("size", 1000)
    seed = kwargs.pop("seed", seed)
    try:
        fn = GENERATORS[cfg.generator]
    except KeyError as e:
        raise DataError(str(e.args[0])) from None
    try:
        rows = fn(n=size, seed=seed, **kwargs)
    except DataError:
        raise
    except (TypeError, ValueError) as e:
        raise DataError(f"data.generator {cfg.generator!r}: bad data.generator_kwargs {cfg.generator_kwargs}: {e}") from e
    if not rows:
        raise DataError(f"data.generator {cfg.generator!r} made no rows; set data.generator_kwargs.size > 0")
    return Rows.from_list(rows)


def _file_rows(files: list[str], streaming: bool) -> Rows | Dataset | IterableDataset:
    paths = [Path(f).expanduser() for f in files]
    builders = set()
    for p in paths:
        if p.suffix.lower() not in FILE_BUILDERS:
            raise DataError(f"data.files: {p} has an unsupported extension; use one of {', '.join(FILE_BUILDERS)}")
        if not p.is_file():
            raise DataError(f"data.files: {p} does not exist; fix the path (relative paths in a recipe start at "
                            "its folder, in an override at the working directory)")
        if p.stat().st_size == 0 or (p.suffix.lower() == ".parquet" and _parquet_rows(p) == 0):
            raise DataError(f"data.files: {p} is empty; remove it from data.files or fill it")
        builders.add(FILE_BUILDERS[p.suffix.lower()])
    if len(builders) > 1:
        raise DataError(f"data.files mixes formats ({', '.join(sorted(builders))}); convert them to one format")
    builder = builders.pop()
    if builder == "json" and not streaming:
        return Rows.from_list([row for p in paths for row in json_rows(p)])
    from datasets import load_dataset

    from grpo_cli.models.loading import quiet_datasets

    quiet_datasets()
    try:
        return load_dataset(builder, data_files=[str(p) for p in paths], split="train", streaming=streaming)
    except Exception as e:
        raise DataError(f"data.files: could not read {files}: {type(e).__name__}: {e}") from e


def _parquet_rows(path: Path) -> int | None:
    """The rows a Parquet file's footer counts (None if it cannot be read: the loader says why)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - not Parquet: datasets' error names the file
        return None


def _dataset_rows(cfg: DataConfig) -> Dataset | IterableDataset:
    from datasets import DatasetDict, load_dataset, load_from_disk

    from grpo_cli.models.loading import quiet_datasets

    quiet_datasets()
    folder = Path(cfg.dataset).expanduser()
    try:
        if (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file():  # Dataset.save_to_disk
            ds = load_from_disk(str(folder))
            if isinstance(ds, DatasetDict):
                if cfg.split not in ds:
                    raise DataError(f"data.split {cfg.split!r} not in {cfg.dataset}; splits: {', '.join(ds)}")
                ds = ds[cfg.split]
            return ds.to_iterable_dataset(num_shards=max(1, len(ds.cache_files))) if cfg.streaming else ds
        return load_dataset(cfg.dataset, cfg.config, split=cfg.split, streaming=cfg.streaming)
    except DataError:
        raise
    except Exception as e:
        raise DataError(
            f"data.dataset {cfg.dataset!r} (config {cfg.config!r}, split {cfg.split!r}) could not be loaded: "
            f"{type(e).__name__}: {first_line(e)}; check the name, data.config and data.split, that it is in the hub "
            "cache when offline, or use data.files / data.generator"
            + ("; data.streaming reads a hub dataset from the hub itself, not from the cache: offline, set "
               "data.streaming: false or stream local files" if cfg.streaming else "")
        ) from e
