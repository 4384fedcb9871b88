"""Rows read without `datasets` (grpo_cli/data/table.py): every operation grpo uses gives what `datasets.Dataset`
gives on the same rows, copies a caller may change, and a run from a generator or JSON Lines that never imports
datasets, pandas or pyarrow."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from datasets import Dataset

from grpo_cli.data.sources import load_rows
from grpo_cli.data.table import Rows, json_rows
from grpo_cli.errors import DataError
from grpo_cli.recipe.schema import DataConfig

ROWS = [
    {"question": "What is 2 + 3?", "answer": "5", "level": 1, "tags": ["add"], "source": "gen"},
    {"question": "What is 7 - 4?", "answer": "3", "level": 2, "tags": ["sub", "small"], "source": "gen"},
    {"question": [{"role": "user", "content": "Hi"}], "answer": "0", "level": 3, "tags": [], "source": "chat"},
    {"question": "What is 9 / 3?", "answer": "3", "level": 2, "tags": ["div"]},
]


def test_every_operation_grpo_uses_gives_what_a_dataset_gives():
    ds, rows = Dataset.from_list([{**r, "question": str(r["question"])} for r in ROWS]), Rows.from_list(
        [{**r, "question": str(r["question"])} for r in ROWS])
    assert rows.column_names == ds.column_names == ["question", "answer", "level", "tags", "source"]
    assert len(rows) == len(ds) == 4
    for key in (0, 3, -1, [3, 0, 0], range(1, 3), slice(0, 4, 2), "tags", "source", np.int64(2), np.array([1, 2])):
        assert rows[key] == ds[key], key
    assert list(rows) == list(ds)  # a row a key lacks reads None, as in datasets
    assert rows.select([2, 1]).to_dict() == ds.select([2, 1]).to_dict()
    assert rows.select(range(2))[:] == ds.select(range(2))[:]
    assert rows.to_dict() == ds.to_dict()
    with pytest.raises(IndexError):
        rows[4]
    with pytest.raises(KeyError, match="no column 'nope'"):
        rows["nope"]


def test_values_come_back_as_written_and_as_copies():
    rows = Rows.from_list(ROWS)
    assert rows[2]["question"] == [{"role": "user", "content": "Hi"}]
    assert Rows.from_list([{"a": 1}, {"a": 2.5}])["a"] == [1, 2.5]  # datasets would read [1.0, 2.5]
    assert Rows.from_list([{"a": 1}, {"b": 2}]).to_dict() == {"a": [1, None], "b": [None, 2]}  # every row's keys
    got = rows[[2]]
    got["question"][0][0]["content"] = "changed"
    rows[0]["tags"].append("x")
    rows["tags"][1].append("y")
    for row in rows:
        row["level"] = 0
    assert rows[2]["question"][0]["content"] == "Hi" and rows["tags"] == [["add"], ["sub", "small"], [], ["div"]]
    assert rows["level"] == [1, 2, 3, 2]
    with pytest.raises(DataError, match="row 1 is a list"):
        Rows.from_list([{"a": 1}, [1]])


@pytest.mark.parametrize("form", ["jsonl", "array", "columns"])
def test_json_files_in_each_form_load_as_datasets_loads_them(tmp_path, form):
    """JSON Lines and an array of objects as `datasets` loads them; an object of column lists as rows (grpo validate
    reads it so; datasets would load one row of lists)."""
    plain = [r for r in ROWS if isinstance(r["question"], str)]  # the last lacks "source": it reads None
    path = tmp_path / ("rows.jsonl" if form == "jsonl" else "rows.json")
    if form == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in plain) + "\n\n")
    elif form == "array":
        path.write_text(json.dumps(plain, indent=1))
    else:
        columns = {k: [r[k] for r in plain if k in r] for k in plain[0]}  # "source" shorter: its last reads None
        path.write_text(json.dumps(columns, indent=1))
    cfg = DataConfig(files=[str(path)], prompt_column="question")
    loaded = load_rows(cfg, 0)
    assert isinstance(loaded, Rows)
    if form == "columns":
        want = {k: [r.get(k) for r in plain] for k in plain[0]}
    else:
        from datasets import load_dataset

        want = load_dataset("json", data_files=[str(path)], split="train").to_dict()
    assert loaded.to_dict() == want
    assert load_rows(cfg.model_copy(update={"limit": 2}), 0).to_dict() == {k: v[:2] for k, v in want.items()}


def test_a_bad_json_lines_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n{"question": \n')
    with pytest.raises(DataError, match=r"broken.jsonl: not JSON Lines .* line 2"):
        load_rows(DataConfig(files=[str(path)], prompt_column="question"), 0)
    assert json_rows(tmp_path / "broken.jsonl", 1) == [{"question": "a", "answer": "1"}]


@pytest.mark.slow
def test_a_run_from_a_generator_or_json_lines_never_imports_datasets(tmp_path, model_cache):
    """`grpo train` of the tiny model, one step from the arithmetic generator and one from a JSON Lines file, in a
    fresh interpreter: neither imports datasets, pandas or pyarrow (86 MiB resident)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) for a in range(8)))
    script = textwrap.dedent("""
        import sys
        from grpo_cli.cli import main
        sys.argv = ["grpo", "train", "recipes/ci-tiny.yaml", "train.max_steps=1", "eval=null", *sys.argv[1:]]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        print("IMPORTED", sorted({"datasets", "pandas", "pyarrow"} & {m.split(".")[0] for m in sys.modules}))
    """)
    for i, extra in enumerate([[], [f"data.files=[{data}]", "data.generator=null"]]):
        out = subprocess.run([sys.executable, "-c", script, "-o", str(tmp_path / f"run{i}"), *extra],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "IMPORTED []" in out.stdout, out.stdout[-2000:]
