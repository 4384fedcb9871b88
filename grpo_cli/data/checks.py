"""Early data checks for `grpo validate` and `grpo train`: what can be known without loading a model.

Reads the first rows of data files (JSON Lines / JSON / CSV headers / parquet schema), a few generated
problems, or the feature list of a `save_to_disk` folder, and checks that the prompt column, the template's
placeholders and the answer column exist; for the accuracy reward, that the rows of local files have reference
answers (every row, or each file's first STREAM_CHECK_ROWS with data.streaming). Hub datasets are not reachable
offline: they are skipped with a note. Every failure is a `DataError` naming the field, the columns there are and
a close match; the CLI exits 2 with it, in `validate` and `train` alike.

Importing this module must not import torch, transformers or datasets (`grpo validate` stays fast).
"""

from __future__ import annotations

import csv
import json
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_cli.data.generators import GENERATORS
from grpo_cli.data.paths import expand_files
from grpo_cli.data.prompts import check_columns, reward_columns
from grpo_cli.data.sources import FILE_BUILDERS
from grpo_cli.data.table import json_rows
from grpo_cli.errors import DataError, first_line

if TYPE_CHECKING:
    from grpo_cli.recipe.schema import DataConfig, Recipe

PREVIEW_ROWS = 20
STREAM_CHECK_ROWS = 1000  # data.streaming: the rows whose answers are checked (all rows of loaded data)


def _json_columns(path: Path, n: int) -> list[str]:
    """Columns of the first n rows of a JSON Lines file or JSON document (data/table.py's json_rows): the union, as
    a run reads them."""
    columns: dict[str, None] = {}
    for row in json_rows(path, n):
        columns.update(dict.fromkeys(row))
    return list(columns)


def file_columns(path: Path, n: int = PREVIEW_ROWS) -> list[str]:
    """The columns of one data file, from its first rows (DataError if it is missing or unreadable)."""
    suffix = path.suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise DataError(f"{path} has an unsupported extension; use one of {', '.join(FILE_BUILDERS)}")
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty")
    try:
        if suffix in (".json", ".jsonl"):
            return _json_columns(path, n)
        if suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as f:
                return next(csv.reader(f), [])
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - unreadable file: say which and why
        raise DataError(f"{path} cannot be read: {type(e).__name__}: {e}") from None


def files_columns(files: list[str], field: str) -> list[str]:
    """Columns of every file in `field` (data.files / eval.files); they must agree."""
    first: list[str] | None = None
    for f in files:
        try:
            cols = file_columns(Path(f))
        except DataError as e:
            raise DataError(f"{field}: {e}") from None
        if first is not None and set(cols) != set(first):
            raise DataError(f"{field}: {f} has columns {sorted(cols)} but {files[0]} has {sorted(first)}; "
                            "files of one set must have the same columns")
        first = first if first is not None else cols
    return first or []


def _folder_columns(folder: Path, split: str, field: str) -> list[str] | None:
    """Columns of a `Dataset.save_to_disk` folder (its dataset_info.json), None for other folders."""
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise DataError(f"{field} {str(folder)!r} has no split {split!r}; splits: {', '.join(splits)}")
        folder = folder / split
    info = folder / "dataset_info.json"
    if not (folder / "state.json").is_file() or not info.is_file():
        return None
    return list(json.loads(info.read_text()).get("features") or {})


def _generated_columns(cfg: DataConfig, seed: int) -> list[str]:
    kwargs = {k: v for k, v in cfg.generator_kwargs.items() if k not in ("size", "seed")}
    try:
        rows = GENERATORS[cfg.generator](n=2, seed=seed, **kwargs)
    except DataError:
        raise
    except (TypeError, ValueError) as e:
        raise DataError(f"data.generator {cfg.generator!r}: bad data.generator_kwargs {cfg.generator_kwargs}: {e}") from None
    return list(rows[0]) if rows else []


def _loaded_columns(cfg: DataConfig, field: str, notes: list[str]) -> list[str]:
    """Columns of a dataset `datasets` loads by name (a hub id; a folder of data files): its metadata (the hub's
    dataset card or the local cache), else the split's first row, streamed (nothing else is downloaded). A hub id
    the hub cannot serve (and the cache does not hold, offline) is a DataError here, not when train loads it."""
    import datasets

    from grpo_cli.models.loading import quiet_datasets
    from grpo_cli.process.hub import is_hub_id, offline_chosen, work_offline_if_unreachable

    if is_hub_id(cfg.dataset):
        work_offline_if_unreachable([cfg.dataset], notes.append)  # the train / validate commands asked already
    quiet_datasets()
    what = f"{field} {cfg.dataset!r}" + (f" (data.config {cfg.config!r})" if cfg.config else "")
    split = cfg.split.split("[", 1)[0]  # train[:1000] -> train
    try:
        builder = datasets.load_dataset_builder(cfg.dataset, cfg.config)
        splits = list(builder.info.splits or {})
        if splits and split not in splits:
            raise DataError(f"{what} has no split {split!r}; splits: {', '.join(splits)}")
        if builder.info.features:
            return list(builder.info.features)
        row = next(iter(datasets.load_dataset(cfg.dataset, cfg.config, split=split, streaming=True)), None)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the loader raises, said in one line
        where = ("offline: it is not in the local cache (HF_HOME), and the hub cannot be reached or HF_HUB_OFFLINE is "
                 "set" if offline_chosen() and is_hub_id(cfg.dataset) else "check the name, data.config and data.split")
        raise DataError(f"{what} could not be read: {type(e).__name__}: {first_line(e)}; {where}") from None
    if row is None:
        raise DataError(f"{what}: split {split!r} holds no rows")
    return list(row)


def source_columns(cfg: DataConfig, seed: int, section: str = "data",
                   notes: list[str] | None = None) -> tuple[list[str], str]:
    """(the columns, a description of the source); `notes` gets a line when the hub cannot be reached."""
    if cfg.files:
        return files_columns(expand_files(cfg.files, f"{section}.files"), f"{section}.files"), f"{section}.files"
    if cfg.generator:
        return _generated_columns(cfg, seed), f"data.generator {cfg.generator!r}"
    folder = Path(cfg.dataset).expanduser()
    field = f"{section}.dataset"
    if folder.is_dir():
        columns = _folder_columns(folder, cfg.split, field)
        return columns or _loaded_columns(cfg, field, notes if notes is not None else []), f"{field} {cfg.dataset!r}"
    if cfg.dataset.startswith(("/", "./", "../", "~")):
        raise DataError(f"{field}: folder {cfg.dataset} does not exist")
    return _loaded_columns(cfg, field, notes if notes is not None else []), f"{field} {cfg.dataset!r}"


def needs_answer(recipe: Recipe) -> bool:
    """Whether a missing answer column is an error: named explicitly, or the accuracy reward needs it."""
    cfg = recipe.data
    return bool(cfg.answer_column) and (cfg.answer_column != "answer" or any(r.name == "accuracy" for r in recipe.rewards))


def check_data(recipe: Recipe) -> list[str]:
    """Check the recipe's inputs without a model: a local model path exists, the training (and held-out eval) data
    and the rewards' parameters fit; DataError if it cannot work.

    Returns notes (the hub cannot be reached: cached data only)."""
    from grpo_cli.data.held_out import eval_data_config

    check_model_path(recipe.model.name_or_path)
    check_model_cached(recipe.model)
    if recipe.distillation is not None and recipe.distillation.teacher is not None:
        check_model_path(recipe.distillation.teacher.name_or_path, "distillation.teacher.name_or_path")
        check_model_cached(recipe.distillation.teacher, "distillation.teacher.name_or_path")
        check_same_vocabulary(recipe.model, recipe.distillation.teacher)
    notes = []
    seed = recipe.data.seed if recipe.data.seed is not None else recipe.train.seed
    sets = [("data", recipe.data)]
    if recipe.eval is not None and (recipe.eval.files or recipe.eval.dataset):
        sets.append(("eval", eval_data_config(recipe, recipe.eval)))
    for section, cfg in sets:
        columns, source = source_columns(cfg, seed, section, notes)
        check_columns(cfg, columns, source, needs_answer(recipe))
        check_reward_parameters(recipe, cfg, columns, source)
        if cfg.files and cfg.answer_column in columns and needs_answer(recipe):
            check_answers(expand_files(cfg.files, f"{section}.files"), cfg.answer_column, f"{section}.files",
                          STREAM_CHECK_ROWS if cfg.streaming else None)
    return notes


def _column_values(path: Path, column: str, n: int | None = None) -> list:
    """The value of `column` in the first n rows (None: every row) of one local data file (None where a row lacks
    it); a streamed file is read only that far."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return [row.get(column) for row in islice(csv.DictReader(f), n)]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        if n is None:
            return pq.read_table(path, columns=[column]).column(column).to_pylist()
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n, columns=[column]), None)
        return batch.column(column).to_pylist() if batch is not None else []
    return [row.get(column) for row in json_rows(path, n)]


def check_answers(files: list[str], column: str, field: str, first: int | None = None) -> None:
    """DataError naming the rows whose reference answer is missing or empty: they would train with no accuracy
    reward at all (scored by the other rewards alone), which is nearly always a data error. `first`: check only
    each file's first rows (data.streaming: the files are not read in full before training)."""
    for f in files:
        values = _column_values(Path(f), column, first)
        missing = [i for i, v in enumerate(values, start=1) if v is None or (isinstance(v, str) and not v.strip())]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            of = f"the first {len(values)}" if first is not None and len(values) == first else f"{len(values)}"
            raise DataError(
                f"{field}: {len(missing)} of {of} rows of {f} have no {column!r} (rows {shown}; row 1 is "
                "the first data row): the accuracy reward would score them as missing and they would train on the "
                "other rewards alone; fill or drop them")


def check_model_path(name_or_path: str, field: str = "model.name_or_path") -> None:
    """DataError when model.name_or_path is a local path (made absolute by the recipe reader: ./, ../, /, ~) that
    does not exist: before any model loads or the run folder is taken."""
    path = Path(name_or_path).expanduser()
    if name_or_path.startswith(("/", "~")) and not path.exists():
        raise DataError(f"{field}: {path} does not exist (a local folder; a hub id is written org/name)")


def check_same_vocabulary(student, teacher) -> None:
    """DataError unless the teacher's tokenizer maps every token to the id the policy's does: on-policy distillation
    reads the teacher's log-prob of each token id the policy sampled (their tokenizers load; no weights do)."""
    from grpo_cli.models.loading import load_tokenizer

    mine, theirs = load_tokenizer(student).get_vocab(), load_tokenizer(teacher).get_vocab()
    differ = sorted({t for t in mine.keys() | theirs.keys() if mine.get(t) != theirs.get(t)}, key=lambda t: mine.get(t, 1 << 62))
    if differ:
        shown = ", ".join(f"{t!r}: {mine.get(t)} vs {theirs.get(t)}" for t in differ[:3])
        raise DataError(f"distillation.teacher.name_or_path: the teacher's tokenizer is not the policy's ({len(differ)} of "
                        f"{len(mine | theirs)} tokens differ, e.g. {shown}); the teacher scores the policy's tokens by "
                        "id, so it must share the policy's vocabulary")


def check_reward_parameters(recipe: Recipe, cfg: DataConfig, columns: list[str], source: str) -> None:
    """DataError naming the reward and the parameter when a reward function cannot take the call grpo makes with
    these columns (a parameter no column or argument fills, or columns a function without **kwargs does not take):
    before any model loads, not at step 1. `columns`: the data's, as rewards receive them (reward_columns)."""
    from grpo_cli.rewards.kwargs import check_parameters
    from grpo_cli.rewards.scoring import resolve_reward, reward_log_name

    passed = list(reward_columns(dict.fromkeys(columns), cfg.answer_column))
    for i, spec in enumerate(recipe.rewards):
        if spec.name.startswith("model:"):
            continue  # a reward model's call is grpo's own
        try:
            check_parameters(reward_log_name(spec.name), resolve_reward(spec.name), spec.kwargs, passed, spec.level)
        except ValueError as e:
            raise DataError(f"rewards.{i}: {e} (columns of {source})") from None


def check_model_cached(model, field: str = "model.name_or_path") -> None:
    """DataError when the run is offline (chosen, or the hub cannot be reached) and model.name_or_path is a hub id
    the local cache does not hold: train would fail at loading it."""
    from grpo_cli.process.hub import is_hub_id, offline_chosen

    if not (is_hub_id(model.name_or_path) and offline_chosen()) or model.gguf_file:
        return
    from huggingface_hub import constants, try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(model.name_or_path, "config.json", revision=model.revision), str):
        raise DataError(f"{field}: {model.name_or_path!r} is not in the local hub cache "
                        f"({constants.HF_HUB_CACHE}) and the run is offline (the hub cannot be reached, or "
                        "HF_HUB_OFFLINE is set): download it where the hub can be reached, or set a local folder")
