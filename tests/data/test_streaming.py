"""grpo_cli.data.streaming: data.streaming over real multi-shard datasets (JSON Lines, Parquet and `save_to_disk`
shards read by datasets' IterableDataset): epochs, block shuffling, data.limit, exact resume, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from grpo_cli.data.prompts import PromptStream  # noqa: E402
from grpo_cli.data.sources import load_rows  # noqa: E402
from grpo_cli.data.streaming import StreamedRows  # noqa: E402
from grpo_cli.errors import DataError  # noqa: E402
from grpo_cli.recipe.schema import DataConfig, ModelConfig  # noqa: E402

from helpers import cli, popen  # noqa: E402

torch.set_num_threads(1)

SHARDS = (7, 11, 5)  # uneven shards: blocks and batches run across their ends
ROWS = sum(SHARDS)


def rows_of(shard: int, n: int) -> list[dict]:
    return [{"question": f"q{shard}-{i}: what is {i} + {shard}?", "answer": str(i + shard), "shard": shard}
            for i in range(n)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, list[str]]:
    """The same 23 rows as 3 JSON Lines files, 3 Parquet files (row groups of 3) and a 3-shard save_to_disk folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    root = tmp_path_factory.mktemp("shards")
    out: dict[str, list[str]] = {"jsonl": [], "parquet": []}
    for s, n in enumerate(SHARDS):
        rows = rows_of(s, n)
        path = root / f"part-{s}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out["jsonl"].append(str(path))
        path = root / f"part-{s}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
        out["parquet"].append(str(path))
    Dataset.from_list([r for s, n in enumerate(SHARDS) for r in rows_of(s, n)]).save_to_disk(root / "saved", num_shards=3)
    out["saved"] = [str(root / "saved")]
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from grpo_cli.models.loading import load_tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return load_tokenizer(ModelConfig(name_or_path="builtin:tiny-qwen2"))


def cfg_of(shards, kind="jsonl", **kw) -> DataConfig:
    source = {"dataset": shards[kind][0]} if kind == "saved" else {"files": shards[kind]}
    kw = {"prompt_column": "question", "streaming": True, "shuffle_buffer": 4, **kw}
    return DataConfig(**source, **kw)


def rows(cfg: DataConfig, seed: int = 0, keep: int = 64) -> StreamedRows:
    return StreamedRows(load_rows(cfg, seed), cfg, seed, keep=keep)


def questions(r: StreamedRows, n: int) -> list[str]:
    return r.columns(r.take(n))["question"]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved"])
def test_each_epoch_reads_every_row_once_in_shuffled_blocks(shards, kind):
    cfg = cfg_of(shards, kind)
    ds = load_rows(cfg, 0)
    assert type(ds).__name__ == "IterableDataset" and ds.num_shards == 3
    r = rows(cfg)
    epochs = [questions(r, ROWS) for _ in range(3)]
    every = sorted(q for s, n in enumerate(SHARDS) for q in [x["question"] for x in rows_of(s, n)])
    assert all(sorted(e) == every for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # a fresh order each epoch
    assert r.state_dict()["epoch"] == 2
    # a block of 4 holds 4 rows read one after another: shuffled within, and never mixed with another block
    shard_rows = [[x["question"] for x in ds.shard(num_shards=3, index=s, contiguous=True)] for s in range(3)]
    if kind != "saved":  # one shard per file, in data.files' order (save_to_disk cuts its own shards)
        assert shard_rows == [[x["question"] for x in rows_of(s, n)] for s, n in enumerate(SHARDS)]
    for e in range(2):
        read = [q for s in r.shard_order(e) for q in shard_rows[s]]
        for start in range(0, ROWS, 4):
            assert sorted(epochs[e][start:start + 4]) == sorted(read[start:start + 4])
    assert {tuple(r.shard_order(e)) for e in range(8)} != {(0, 1, 2)}  # the shard order is shuffled too
    # the same seed gives the same stream, another seed another
    assert questions(rows(cfg), 2 * ROWS) == epochs[0] + epochs[1]
    assert questions(rows(cfg, seed=1), ROWS) != epochs[0]


def test_without_shuffle_the_files_are_read_in_order_and_limit_keeps_the_first_rows(shards):
    in_order = [x["question"] for s, n in enumerate(SHARDS) for x in rows_of(s, n)]
    r = rows(cfg_of(shards, shuffle=False))
    assert questions(r, ROWS + 5) == in_order + in_order[:5]
    assert r.take(3) == [ROWS + 5, ROWS + 6, ROWS + 7]  # a row's index is its place in the stream
    # data.limit: the first 9 rows in file order (across the first shard's end), shuffled, every epoch
    r = rows(cfg_of(shards, limit=9))
    epochs = [questions(r, 9) for _ in range(3)]
    assert all(sorted(e) == sorted(in_order[:9]) for e in epochs) and len({tuple(e) for e in epochs}) > 1


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_restored_stream_continues_exactly_and_gives_back_the_batches_in_flight(shards, tok, kind):
    """At every cut over three epochs: state -> JSON -> a fresh stream (new reader) gives the same next batches, and
    the rows of the 3 batches before the cut (what a checkpoint holds in flight), as the uninterrupted stream."""
    cfg = cfg_of(shards, kind, answer_column="answer")
    straight = PromptStream(load_rows(cfg, 0), cfg, tok, batch_size=3, seed=0, in_flight=3)
    batches = [straight.next_batch() for _ in range(30)]
    assert len({tuple(b.indices) for b in batches}) == 30
    for cut in range(0, 24):
        s = PromptStream(load_rows(cfg, 0), cfg, tok, batch_size=3, seed=0, in_flight=3)
        for _ in range(cut):
            s.next_batch()
        state = json.loads(json.dumps(s.state_dict()))
        s.close()
        resumed = PromptStream(load_rows(cfg, 0), cfg, tok, batch_size=3, seed=0, in_flight=3)
        resumed.load_state_dict(state)
        for b in batches[max(0, cut - 3):cut]:
            again = resumed.batch_of(b.indices)
            assert (again.texts, again.input_ids, again.columns) == (b.texts, b.input_ids, b.columns), cut
        got = [resumed.next_batch() for _ in range(6)]
        assert [(b.indices, b.texts, b.columns) for b in got] == \
            [(b.indices, b.texts, b.columns) for b in batches[cut:cut + 6]], cut
        resumed.close()


def test_rows_older_than_the_batches_in_flight_are_forgotten(shards):
    r = rows(cfg_of(shards), keep=6)
    first = r.take(3)
    for _ in range(5):
        r.take(3)
    with pytest.raises(ValueError, match=r"row 0 of the data stream is not among the rows it remembers"):
        r.columns(first)
    assert len(r.state_dict()["blocks"]) <= 3  # the state holds the blocks of the last 6 rows, not the run's


def test_the_first_batch_peeked_is_the_first_batch_trained_on(shards, tok):
    cfg = cfg_of(shards)
    s = PromptStream(load_rows(cfg, 0), cfg, tok, batch_size=4, seed=0)
    peek = s.upcoming(6)
    assert s.state_dict() == {"epoch": 0, "taken": 0, "shards": 3, "blocks": [{"epoch": 0, "number": 0, "shard": 0,
                                                                               "row": 0, "read": 0, "first": 0}],
                              "files": s.rows.files}  # (what a resume checks the files against)
    b = s.next_batch()
    assert b.indices == peek.indices[:4] and b.texts == peek.texts[:4]


def test_a_loaded_runs_position_and_a_streamed_one_do_not_mix(shards, tok):
    streamed = cfg_of(shards)
    loaded = streamed.model_copy(update={"streaming": False})
    with pytest.raises(ValueError, match="was not saved by a streamed run"):
        rows(streamed).load_state_dict({"epoch": 0, "index": 4})
    s = PromptStream(load_rows(loaded, 0), loaded, tok, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="was saved by a streamed run"):
        s.load_state_dict(rows(streamed).state_dict())


def test_streaming_writes_nothing_to_the_datasets_cache(shards, tmp_path, monkeypatch):
    """Loading Parquet files converts them into Arrow files in the datasets cache; a stream reads them in place, and
    loaded JSON Lines are read by grpo itself (grpo_cli/data/table.py): nothing written either."""
    import datasets

    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    questions(rows(cfg_of(shards)), 2 * ROWS)
    questions(rows(cfg_of(shards, "parquet")), 2 * ROWS)
    load_rows(cfg_of(shards, streaming=False), 0)
    written = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert [p for p in written if p.suffix == ".arrow"] == []
    load_rows(cfg_of(shards, "parquet", streaming=False), 0)
    assert len(list(cache.rglob("*.arrow"))) >= 1  # the loaded way does write them (the test can fail)


def test_a_bad_line_deep_in_a_shard_names_the_file_and_row(shards, tmp_path):
    good = shards["jsonl"]
    bad = tmp_path / "part-bad.jsonl"
    lines = [json.dumps(r) for r in rows_of(9, 6)]
    lines[4] = '{"question": "q9-4", "answer": '  # cut short
    bad.write_text("\n".join(lines) + "\n")
    cfg = DataConfig(files=[good[0], str(bad)], prompt_column="question", streaming=True, shuffle=False,
                     shuffle_buffer=4)
    r = rows(cfg)
    with pytest.raises(DataError, match=r"data.files: .*part-bad.jsonl: reading on from row \d+ failed"):
        r.take(ROWS)


def test_load_rows_checks_a_streams_columns_and_rows(shards, tmp_path):
    with pytest.raises(DataError, match=r"data.prompt_column 'questoin' \(did you mean 'question'\?\) is not a column"):
        load_rows(cfg_of(shards, prompt_column="questoin"), 0)
    with pytest.raises(DataError, match=r"data.template uses column\(s\) \['level'\]"):
        load_rows(cfg_of(shards, "parquet", template="{level}: {question}"), 0)
    empty = tmp_path / "empty.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": pa.array([], pa.string())}), empty)
    with pytest.raises(DataError, match=r"data.files: .*empty.parquet is empty; remove it from data.files or fill it"):
        load_rows(DataConfig(files=[str(empty)], prompt_column="question", streaming=True), 0)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(DataError, match=r"data.files \[.*blank.jsonl'\] has no rows"):
        load_rows(DataConfig(files=[str(blank)], prompt_column="question", streaming=True), 0)


def test_a_glob_names_the_shards_and_a_changed_shard_count_is_refused_on_resume(shards, tmp_path):
    from grpo_cli.data.checks import check_data
    from grpo_cli.recipe.files import load_recipe

    folder = os.path.dirname(shards["jsonl"][0])
    by_glob = cfg_of({"jsonl": [f"{folder}/part-*.jsonl"]})
    assert questions(rows(by_glob), 2 * ROWS) == questions(rows(cfg_of(shards)), 2 * ROWS)
    recipe = load_recipe("recipes/ci-tiny.yaml", ["data.generator=null", f"data.files={folder}/part-*.jsonl",
                                                  "data.template=null", "data.prompt_column=question"])
    assert check_data(recipe) == []  # validate reads the files the pattern matches
    with pytest.raises(DataError, match=r"data.files: .*/nothing-\*.jsonl matches no file; fix the pattern"):
        load_rows(cfg_of({"jsonl": [f"{folder}/nothing-*.jsonl"]}), 0)
    state = rows(by_glob).state_dict()
    assert state["shards"] == 3
    with pytest.raises(ValueError, match="the data had 3 shards at the checkpoint, 2 now"):
        rows(cfg_of({"jsonl": shards["jsonl"][:2]})).load_state_dict(state)


@pytest.mark.parametrize("kind", ["jsonl", "saved"])
def test_a_resume_onto_changed_shards_of_the_same_count_is_refused(shards, tmp_path, kind):
    # issue 35: only the shard count was compared; a shard rewritten (or replaced) resumed onto other rows
    import shutil

    copy = tmp_path / "data"
    if kind == "saved":
        shutil.copytree(shards["saved"][0], copy)
        changed = {"saved": [str(copy)]}
    else:
        copy.mkdir()
        changed = {"jsonl": [shutil.copy(f, copy) for f in shards["jsonl"]]}
    state = rows(cfg_of(changed, kind)).state_dict()
    assert len(state["files"]) >= 3 and len(json.dumps(state)) < 2000
    rows(cfg_of(changed, kind)).load_state_dict(state)  # the same files: resumes
    victim = sorted(copy.rglob("*.arrow" if kind == "saved" else "*.jsonl"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data.replace(b"what is", b"what IS"))  # the same shards and sizes, other questions
    with pytest.raises(ValueError, match=rf"the data files changed since the checkpoint: .*{victim.name} "):
        rows(cfg_of(changed, kind)).load_state_dict(state)


def test_a_generator_cannot_stream():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="data.streaming reads data.files or data.dataset"):
        DataConfig(generator="arithmetic", streaming=True)


def test_an_eval_reads_only_its_first_rows_of_a_stream(shards, tok):
    from grpo_cli.eval.evaluate import load_problems
    from grpo_cli.recipe.files import load_recipe

    recipe = load_recipe("recipes/ci-tiny.yaml", [
        "data.generator=null", f"data.files=[{','.join(shards['jsonl'])}]", "data.streaming=true",
        "data.template=null", "data.prompt_column=question", "eval={limit: 9}"])
    problems = load_problems(recipe, recipe.eval, tok)
    in_order = [x for s, n in enumerate(SHARDS) for x in rows_of(s, n)][:9]
    assert problems.columns["question"] == [x["question"] for x in in_order]
    assert problems.columns["answer"] == [x["answer"] for x in in_order]


@pytest.mark.slow
@pytest.mark.usefixtures("model_cache")
def test_kill_9_and_resume_trains_on_the_same_prompts_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """ci-tiny on 13 streamed rows in 3 JSON Lines shards, 10 steps of 2 prompts (about 1.5 epochs, blocks of 4),
    checkpoints every 3 steps: killed with SIGKILL while step 4 or later is being scored, then --resume auto. The
    resumed run's prompts, completions and metrics are the uninterrupted run's."""
    import signal
    import time
    from collections import Counter

    from grpo_cli.data.generators import GENERATORS

    from helpers import ROOT, read_jsonl, stable

    problems = GENERATORS["arithmetic"](n=13, seed=5, min_value=0, max_value=20)
    files = []
    for s, part in enumerate((problems[:4], problems[4:11], problems[11:])):
        files.append(tmp_path / f"train-{s}.jsonl")
        files[-1].write_text("".join(json.dumps(r) + "\n" for r in part))
    gate = tmp_path / "gate"
    monkeypatch.setenv("GRPO_TEST_GATE", str(gate))
    args = ["data.generator=null", f"data.files=[{','.join(map(str, files))}]", "data.streaming=true",
            "data.shuffle_buffer=4", "train.max_steps=10", "checkpoint.every_steps=3", "checkpoint.keep_last=null",
            "rewards.1.name=tests/stall_rewards.py:waits_at_gate"]

    def train(run, *extra, wait=True):
        cmd = ["train", "recipes/ci-tiny.yaml", "-o", str(run), *args, *extra]
        if wait:
            return cli(*cmd)
        return popen(*cmd, cwd=ROOT, stdout=open(tmp_path / "cut.out", "w"), stderr=open(tmp_path / "cut.err", "w"))

    p = train(tmp_path / "straight")
    assert p.returncode == 0, p.stderr[-3000:]
    straight = read_jsonl(tmp_path / "straight/rollouts.jsonl")
    firsts = [r["data_index"] for r in straight if r["sample"] == 0]
    assert firsts == list(range(20))  # a row's index is its place in the stream
    asked = [r["prompt"].split("user\n")[1].split(" Answer with")[0] for r in straight if r["sample"] == 0]
    assert Counter(asked[:13]) == Counter(r["prompt"] for r in problems)  # epoch 0: every row once
    assert Counter(asked[13:]) <= Counter(asked[:13]) and asked[13:] != asked[:7]
    assert [m["epoch"] for m in read_jsonl(tmp_path / "straight/metrics.jsonl")] == [0] * 6 + [1] * 4

    cut = tmp_path / "cut"
    proc = train(cut, wait=False)
    try:
        deadline = time.monotonic() + 240
        while not (cut / "checkpoints/step-3/trainer/manifest.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "cut.err").read_text()[-3000:]
            time.sleep(0.05)
        gate.touch()  # the next reward call holds: the run is surely mid-way when it dies
        while not Path(f"{gate}.reached").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "cut.err").read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        gate.unlink(missing_ok=True)
    saved = sorted(int(p.name.split("-")[1]) for p in (cut / "checkpoints").glob("step-*"))
    assert saved and max(saved) < 10
    state = json.loads((cut / f"checkpoints/step-{max(saved)}/trainer/trainer_state.json").read_text())
    assert set(state["data"]) == {"epoch", "taken", "shards", "blocks", "files"}  # where the stream stood, not the rows
    assert len(state["data"]["files"]) == 3 and len(json.dumps(state["data"])) < 1000  # and which files it read
    p = train(cut, "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = read_jsonl(cut / "rollouts.jsonl")
    assert [(r["step"], r["data_index"], r["prompt"], r["completion"]) for r in resumed] == \
        [(r["step"], r["data_index"], r["prompt"], r["completion"]) for r in straight]
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == \
        [stable(m) for m in read_jsonl(tmp_path / "straight/metrics.jsonl")]


def test_an_iterable_dataset_given_to_the_python_api_is_refused_with_the_streaming_advice(shards):
    from grpo_cli.data.in_memory import to_dataset

    with pytest.raises(DataError, match=r"dataset: an IterableDataset cannot be saved with the run for a resume; name "
                                        r"its files .* in data.files, .* and set data.streaming: true"):
        to_dataset(load_rows(cfg_of(shards), 0))


def test_a_hub_dataset_streamed_offline_says_streaming_needs_the_hub():
    with pytest.raises(DataError, match=r"data.dataset 'grpo-tests-nobody/no-such-data' .* could not be loaded: .*"
                                        r"data.streaming reads a hub dataset from the hub itself, not from the cache"):
        load_rows(DataConfig(dataset="grpo-tests-nobody/no-such-data", streaming=True), 0)
