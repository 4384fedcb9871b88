"""grpo_cli.data.prompts: generators, loading rows from files/datasets, prompt rendering, truncation, PromptStream."""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from grpo_cli.data.generators import GENERATORS  # noqa: E402
from grpo_cli.data.prompts import PromptStream, encode_prompts, render_prompt  # noqa: E402
from grpo_cli.data.sources import load_rows  # noqa: E402
from grpo_cli.errors import DataError  # noqa: E402
from grpo_cli.recipe.schema import DataConfig, ModelConfig  # noqa: E402

torch.set_num_threads(1)

ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "level": i % 3} for i in range(10)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from grpo_cli.models.loading import load_tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return load_tokenizer(ModelConfig(name_or_path="builtin:tiny-qwen2"))


def gen_cfg(**kw) -> DataConfig:
    return DataConfig(generator="arithmetic", **kw)


def test_import_is_light():
    code = ("import sys, grpo_cli.data.prompts; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'datasets'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registry_names():
    assert {"arithmetic", "reasoning_gym"} <= set(GENERATORS.names())


def test_arithmetic_is_deterministic_and_correct():
    fn = GENERATORS["arithmetic"]
    a, b = fn(n=200, seed=3), fn(n=200, seed=3)
    assert a == b and a != fn(n=200, seed=4)
    assert a[0]["prompt"] == f"What is {a[0]['expression']}?"
    for row in a:
        x, y = map(int, row["expression"].split(" + "))
        assert 0 <= x <= 99 and 0 <= y <= 99 and row["answer"] == str(x + y)


@pytest.mark.parametrize(
    "kw",
    [
        dict(ops=["+", "-", "*", "/"], min_value=-20, max_value=20, num_operands=4),
        dict(ops=["/"], min_value=1, max_value=999, num_operands=2),
        dict(ops=["*", "/"], min_value=2, max_value=12, num_operands=5),
    ],
)
def test_arithmetic_answers_equal_the_evaluated_expression(kw):
    rows = GENERATORS["arithmetic"](n=500, seed=0, **kw)
    for row in rows:
        value = eval(row["expression"])  # noqa: S307 (our own generated arithmetic)
        assert value == int(value) and row["answer"] == str(int(value)), row
    if kw["ops"] == ["/"]:
        assert all(" / " in r["expression"] for r in rows)
        assert sum(r["answer"] not in ("0", "1") for r in rows) == 500  # trivial quotients are avoided


def test_arithmetic_bad_kwargs_are_data_errors():
    with pytest.raises(DataError, match=r"generator 'arithmetic'.*ops must be"):
        load_rows(gen_cfg(generator_kwargs={"ops": ["^"]}), seed=0)
    with pytest.raises(DataError, match="unexpected keyword argument 'nope'"):
        load_rows(gen_cfg(generator_kwargs={"nope": 1}), seed=0)


def test_load_rows_from_generator_uses_size_seed_and_limit():
    ds = load_rows(gen_cfg(generator_kwargs={"size": 50}), seed=1)
    assert len(ds) == 50 and ds.column_names == ["prompt", "answer", "expression"]
    assert ds[0] == GENERATORS["arithmetic"](n=1, seed=1)[0]
    assert load_rows(gen_cfg(generator_kwargs={"size": 50, "seed": 7}), seed=1)["prompt"] == [
        r["prompt"] for r in GENERATORS["arithmetic"](n=50, seed=7)
    ]
    assert len(load_rows(gen_cfg(generator_kwargs={"size": 50}, limit=5), seed=1)) == 5


def _write(path, fmt, rows):
    import pandas as pd

    df = pd.DataFrame(rows)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_load_rows_from_files(tmp_path, fmt):
    files = [tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"]
    _write(files[0], fmt, ROWS[:6])
    _write(files[1], fmt, ROWS[6:])
    ds = load_rows(DataConfig(files=[str(f) for f in files], prompt_column="question"), seed=0)
    assert len(ds) == 10 and ds["question"] == [r["question"] for r in ROWS]
    assert [str(a) for a in ds["answer"]] == [r["answer"] for r in ROWS]  # csv reads "1" as 1
    assert len(load_rows(DataConfig(files=[str(files[0])], prompt_column="question", limit=4), seed=0)) == 4


def test_load_rows_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match=r"missing.jsonl does not exist"):
        load_rows(DataConfig(files=[str(tmp_path / "missing.jsonl")]), seed=0)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match=r"unsupported extension; use one of .json, .jsonl, .parquet, .csv"):
        load_rows(DataConfig(files=[str(tmp_path / "x.txt")]), seed=0)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(DataError, match=r"data.prompt_column 'prompt' is not a column.*columns: question, answer, level"):
        load_rows(DataConfig(files=[str(tmp_path / "rows.jsonl")]), seed=0)
    with pytest.raises(DataError, match=r"data.answer_column 'solution' is not a column.*columns: question, answer, level"):
        load_rows(DataConfig(files=[str(tmp_path / "rows.jsonl")], prompt_column="question", answer_column="solution"), seed=0)
    with pytest.raises(DataError, match=r"data.template uses column\(s\) \['topic'\]"):
        load_rows(DataConfig(files=[str(tmp_path / "rows.jsonl")], template="{topic}: {question}"), seed=0)
    with pytest.raises(DataError, match="positional placeholders"):
        load_rows(DataConfig(files=[str(tmp_path / "rows.jsonl")], template="Q: {}"), seed=0)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl is empty"):
        load_rows(DataConfig(files=[str(tmp_path / "empty.jsonl")]), seed=0)


def test_load_rows_from_dataset_folders(tmp_path):
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_list(ROWS)
    DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "saved"))
    got = load_rows(DataConfig(dataset=str(tmp_path / "saved"), split="test", prompt_column="question"), seed=0)
    assert got["question"] == [r["question"] for r in ROWS[:3]]
    with pytest.raises(DataError, match=r"data.split 'dev' not in .*splits: train, test"):
        load_rows(DataConfig(dataset=str(tmp_path / "saved"), split="dev"), seed=0)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    got = load_rows(DataConfig(dataset=str(tmp_path / "raw"), prompt_column="question"), seed=0)
    assert len(got) == 10


def test_uncached_hub_dataset_is_a_data_error():
    with pytest.raises(DataError, match=r"data.dataset 'grpo-tests-nobody/no-such-data'.*could not be loaded"):
        load_rows(DataConfig(dataset="grpo-tests-nobody/no-such-data"), seed=0)


# ---------------------------------------------------------------- prompts

CHAT = "<|im_start|>{role}\n{content}<|im_end|>\n"
GEN = "<|im_start|>assistant\n"


def test_render_template_with_and_without_chat_template(tok):
    row = {"question": "What is 2 + 2?", "level": 1}
    cfg = DataConfig(generator="arithmetic", template="Level {level}. {question}")
    assert render_prompt(row, cfg, tok) == CHAT.format(role="user", content="Level 1. What is 2 + 2?") + GEN
    plain = cfg.model_copy(update={"chat_template": False})
    assert render_prompt(row, plain, tok) == "Level 1. What is 2 + 2?"


def test_render_system_prompt(tok):
    row = {"prompt": "What is 2 + 2?"}
    cfg = gen_cfg(system_prompt="Answer with a number.")
    assert render_prompt(row, cfg, tok) == (
        CHAT.format(role="system", content="Answer with a number.") + CHAT.format(role="user", content="What is 2 + 2?") + GEN
    )
    plain = cfg.model_copy(update={"chat_template": False})
    assert render_prompt(row, plain, tok) == "Answer with a number.\n\nWhat is 2 + 2?"


def test_render_missing_column_names_it_and_lists_columns(tok):
    with pytest.raises(DataError, match=r"column 'topic', missing from the row; columns: question, level"):
        render_prompt({"question": "q", "level": 1}, gen_cfg(template="{topic} {question}"), tok)
    with pytest.raises(DataError, match=r"data.prompt_column 'prompt' is not a column; columns: question"):
        render_prompt({"question": "q"}, gen_cfg(), tok)


def test_render_conversational_prompts(tok):
    convo = [{"role": "system", "content": "Old."}, {"role": "user", "content": "Hi"}]
    assert render_prompt({"prompt": convo}, gen_cfg(), tok) == (
        CHAT.format(role="system", content="Old.") + CHAT.format(role="user", content="Hi") + GEN
    )
    # the recipe's system prompt replaces the row's
    assert render_prompt({"prompt": convo}, gen_cfg(system_prompt="New."), tok) == (
        CHAT.format(role="system", content="New.") + CHAT.format(role="user", content="Hi") + GEN
    )
    # a trailing assistant turn is continued, not closed
    prefix = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>"}]
    assert render_prompt({"prompt": prefix}, gen_cfg(), tok) == CHAT.format(role="user", content="Hi") + "<|im_start|>assistant\n<think>"
    with pytest.raises(DataError, match="a prompt is a string or a list of"):
        render_prompt({"prompt": 42}, gen_cfg(), tok)


def test_render_needs_a_chat_template(tok):
    bare = tok.__class__.from_pretrained(tok.name_or_path)
    bare.chat_template = None
    with pytest.raises(DataError, match="set data.chat_template: false"):
        render_prompt({"prompt": "q"}, gen_cfg(), bare)


def test_encode_prompts_left_truncates_keeping_the_tail(tok):
    text = render_prompt({"prompt": "What is 12 + 7? Think step by step."}, gen_cfg(), tok)
    full = tok(text, add_special_tokens=False)["input_ids"]
    assert full[0] == 1 and full[-3:] == tok(GEN, add_special_tokens=False)["input_ids"]  # <|im_start|>assistant\n
    assert encode_prompts([text], tok, None) == [full]
    assert encode_prompts([text], tok, 1000) == [full]
    assert encode_prompts([text, "12"], tok, 5) == [full[-5:], tok("12")["input_ids"]]
    assert len(full) > 5


# ---------------------------------------------------------------- stream


def stream(tok, n=10, batch_size=5, seed=0, **kw) -> PromptStream:
    cfg = gen_cfg(generator_kwargs={"size": n}, **kw)
    return PromptStream(load_rows(cfg, seed=0), cfg, tok, batch_size=batch_size, seed=seed)


def test_stream_covers_every_row_once_per_epoch_with_fresh_orders(tok):
    s = stream(tok, n=12, batch_size=4)
    epochs = [[i for _ in range(3) for i in s.next_batch().indices] for _ in range(3)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(12))
    assert s.state_dict() == {"epoch": 2, "index": 12}
    assert s.next_batch().indices == s.rows.epoch_order(3)[:4]


def test_stream_is_deterministic_and_seeded(tok):
    draw = lambda s: [s.next_batch().indices for _ in range(4)]  # noqa: E731
    assert draw(stream(tok, seed=1)) == draw(stream(tok, seed=1))
    assert draw(stream(tok, seed=1)) != draw(stream(tok, seed=2))
    # data.seed, when set, wins over the seed argument
    cfg = gen_cfg(generator_kwargs={"size": 10}, seed=1)
    assert draw(PromptStream(load_rows(cfg, seed=0), cfg, tok, batch_size=5, seed=99)) == draw(stream(tok, seed=1))


def test_stream_without_shuffle_is_in_order_and_wraps(tok):
    s = stream(tok, n=7, batch_size=3, shuffle=False)
    assert [s.next_batch().indices for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 0, 1]]
    assert s.state_dict() == {"epoch": 1, "index": 2}


def test_stream_state_dict_round_trip_continues_identically(tok):
    ref = stream(tok, n=7, batch_size=3)  # 7 rows, batches of 3: batches straddle epochs
    batches = [ref.next_batch() for _ in range(5)]
    resumed = stream(tok, n=7, batch_size=3)
    replay = stream(tok, n=7, batch_size=3)
    for _ in range(2):
        replay.next_batch()
    resumed.load_state_dict(json.loads(json.dumps(replay.state_dict())))
    for want in batches[2:]:
        got = resumed.next_batch()
        assert (got.indices, got.texts, got.input_ids, got.columns) == (want.indices, want.texts, want.input_ids, want.columns)
    with pytest.raises(ValueError, match="does not fit a dataset of 7 rows"):
        resumed.load_state_dict({"epoch": 0, "index": 8})


def test_stream_batch_contents(tok):
    cfg = DataConfig(generator="arithmetic", generator_kwargs={"size": 6}, max_prompt_length=4, shuffle=False)
    ds = load_rows(cfg, seed=0)
    b = next(iter(PromptStream(ds, cfg, tok, batch_size=2, seed=0)))
    assert len(b) == 2 and b.indices == [0, 1]
    assert b.columns == {k: ds[k][:2] for k in ("prompt", "answer", "expression")}
    assert b.texts[0] == CHAT.format(role="user", content=ds[0]["prompt"]) + GEN
    assert b.input_ids == [tok(t, add_special_tokens=False)["input_ids"][-4:] for t in b.texts]


def test_stream_gives_the_answer_column_as_answer_and_under_its_own_name(tok):
    from datasets import Dataset

    ds = Dataset.from_list([{"q": "a", "solution": "1", "answer": "junk"}, {"q": "b", "solution": "2", "answer": "junk"}])
    cfg = DataConfig(dataset="x", prompt_column="q", answer_column="solution", shuffle=False)
    b = PromptStream(ds, cfg, tok, batch_size=2, seed=0).next_batch()
    # a TRL reward function reading `solution` works unchanged (issue 22); grpo's own read `answer`
    assert b.columns == {"q": ["a", "b"], "solution": ["1", "2"], "answer": ["1", "2"]}
    cfg = cfg.model_copy(update={"answer_column": "missing"})
    b = PromptStream(ds.remove_columns("answer"), cfg, tok, batch_size=2, seed=0).next_batch()
    assert b.columns == {"q": ["a", "b"], "solution": ["1", "2"]}


def test_stream_conversational_dataset(tmp_path, tok):
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)} for i in range(4)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(files=[str(tmp_path / "c.jsonl")], system_prompt="Be brief.", shuffle=False)
    b = PromptStream(load_rows(cfg, seed=0), cfg, tok, batch_size=4, seed=0).next_batch()
    assert b.texts[3] == CHAT.format(role="system", content="Be brief.") + CHAT.format(role="user", content="What is 3 + 3?") + GEN
    assert b.columns["answer"] == ["0", "2", "4", "6"]


def test_reasoning_gym_generator():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install reasoning-gym)")
    ds = load_rows(DataConfig(generator="reasoning_gym", generator_kwargs={"task": "chain_sum", "size": 20}), seed=3)
    assert len(ds) == 20 and {"prompt", "answer", "task", "metadata"} <= set(ds.column_names)
    for row in ds:
        expression = json.loads(row["metadata"])["expression"]
        assert expression in row["prompt"] and str(eval(expression)) == row["answer"]  # noqa: S307
    again = load_rows(DataConfig(generator="reasoning_gym", generator_kwargs={"task": "chain_sum", "size": 20}), seed=3)
    assert again["prompt"] == ds["prompt"]
    gsm = GENERATORS["reasoning_gym"](n=3, seed=0, task="gsm_symbolic")
    assert all(r["prompt"] and r["answer"] for r in gsm)
    with pytest.raises(DataError, match="could not create task 'no_such_task'"):
        GENERATORS["reasoning_gym"](n=3, seed=0, task="no_such_task")
