"""grpo_cli.data.checks: what `grpo validate` and `grpo train` check before loading a model (exit 2)."""

import json
from pathlib import Path

import pytest

from grpo_cli.data.checks import check_data, file_columns
from grpo_cli.errors import DataError
from grpo_cli.recipe.files import load_recipe

from helpers import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"
ROWS = [{"question": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(4)]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # overrides name files relative to the working directory
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def _recipe(*overrides):
    base = ["data.files=rows.jsonl", "data.generator=null", "data.template={question}", "data.answer_column=solution"]
    return load_recipe(TINY, [*base, *overrides])


def test_columns_of_every_format_from_the_first_rows(tmp_path):
    import pandas as pd

    (tmp_path / "a.jsonl").write_text('{"q": 1, "a": 2}\n{"q": 3, "b": 4}\n')
    (tmp_path / "a.json").write_text(json.dumps([{"q": 1, "a": 2}]))
    (tmp_path / "c.json").write_text(json.dumps({"q": [1], "a": [2]}))
    (tmp_path / "a.csv").write_text("q,a\n1,2\n")
    pd.DataFrame({"q": [1], "a": [2]}).to_parquet(tmp_path / "a.parquet")
    assert file_columns(tmp_path / "a.jsonl") == ["q", "a", "b"]  # rows may differ: the union, as datasets reads it
    for name in ("a.json", "c.json", "a.csv", "a.parquet"):
        assert file_columns(tmp_path / name) == ["q", "a"], name


BAD = [
    # (overrides, the message)
    (["data.files=missing.jsonl"], r"data.files: .*missing.jsonl does not exist"),
    (["data.files=rows.txt"], r"rows.txt has an unsupported extension"),
    (["data.answer_column=solutoin"], r"data.answer_column 'solutoin' \(did you mean 'solution'\?\) is not a column of "
                                      r"data.files; columns: question, solution"),
    (["data.template={questoin} Answer."], r"data.template uses column\(s\) \['questoin'\] \(did you mean 'question'\?\)"),
    (["data.template=null", "data.prompt_column=prompt"], r"data.prompt_column 'prompt' is not a column of data.files"),
    (["data.template=Q: {}"], "positional placeholders"),
    (["data.answer_column=answer"], r"data.answer_column 'answer' is not a column"),  # the accuracy reward needs it
    (["eval={files: nope.jsonl}"], r"eval.files: .*nope.jsonl does not exist"),
    (["eval={files: other.jsonl}"], r"data.template uses column\(s\) \['question'\] that eval.files does not have"),
    (["data.files=[rows.jsonl, other.jsonl]"], r"other.jsonl has columns \['x'\] but .*rows.jsonl has \['question', 'solution'\]"),
    (["data.files=broken.jsonl"], r"broken.jsonl: not JSON Lines .* line 2"),
    (["data.files=d", "data.dataset=./d"], r"set exactly one of"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_data_is_named_before_any_model(folder, overrides, message):
    (folder / "other.jsonl").write_text('{"x": 1}\n')
    (folder / "broken.jsonl").write_text('{"question": "a", "solution": "1"}\n{"question": "b", solution: 2}\n')
    (folder / "rows.txt").write_text("hi")
    from grpo_cli.errors import RecipeError

    with pytest.raises((DataError, RecipeError), match=message):
        check_data(_recipe(*overrides))


def test_good_data_passes_and_bad_generator_kwargs_do_not(folder):
    assert check_data(_recipe()) == []
    # the default answer column may be absent when no reward needs it (prompt-only data)
    r = _recipe("data.answer_column=answer", "rewards=[{name: format}]")
    assert check_data(r) == []
    # generators run for two rows: bad kwargs are caught here
    with pytest.raises(DataError, match="bad data.generator_kwargs"):
        check_data(load_recipe(TINY, ["data.generator_kwargs={min_value: 5, max_value: 1}"]))
    # hub datasets: tests/run/test_hub.py


def test_a_folder_of_data_files_is_read_as_datasets_reads_it(folder):
    # issue 22: a dataset `datasets` loads by name (a hub id, a folder of data files) had its columns "not checked"
    (folder / "repo" / "data").mkdir(parents=True)
    (folder / "repo" / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    base = ["data.generator=null", "data.template={question}", "data.answer_column=solution", "data.dataset=./repo"]
    assert check_data(load_recipe(TINY, base)) == []
    with pytest.raises(DataError, match=r"data.template uses column\(s\) \['questoin'\] \(did you mean 'question'\?\) "
                                        r"that data.dataset '.*repo' does not have; columns: question, solution"):
        check_data(load_recipe(TINY, [*base, "data.template={questoin}"]))
    with pytest.raises(DataError, match=r"data.dataset '.*repo' could not be read: ValueError: Bad split: test"):
        check_data(load_recipe(TINY, [*base, "data.split=test"]))


def test_local_dataset_folder_columns_and_split(folder):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(str(folder / "ds"))
    base = ["data.generator=null", "data.template={question}", "data.answer_column=solution"]
    assert check_data(load_recipe(TINY, [*base, "data.dataset=./ds"])) == []
    with pytest.raises(DataError, match=r"has no split 'test'; splits: train"):
        check_data(load_recipe(TINY, [*base, "data.dataset=./ds", "data.split=test"]))
    with pytest.raises(DataError, match=r"data.answer_column 'sol' is not a column"):
        check_data(load_recipe(TINY, [*base, "data.dataset=./ds", "data.answer_column=sol"]))


def test_validate_and_train_exit_2_on_a_missing_file(tmp_path):
    for extra in ([], ["-o", str(tmp_path / "run")]):
        command = "train" if extra else "validate"
        p = cli(command, TINY, "data.generator=null", "data.files=missing.jsonl", *extra, cwd=tmp_path)
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert f"data.files: {tmp_path / 'missing.jsonl'} does not exist" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()


REWARD_FILE = '''
def typo(completions, solutoin, **kwargs):
    return [0.0] * len(completions)

def strict(completions, answer):
    return [0.0] * len(completions)

def fine(completions, answer, question, **kwargs):
    return [float(a in c) for a, c in zip(answer, completions)]

def settable(completions, scale, **kwargs):
    return [scale] * len(completions)
'''


@pytest.mark.parametrize("fn, kwargs, message", [
    # issue 22: these passed validate and failed at step 1 (its message suggested on_error: skip)
    ("typo", "", "rewards.0: parameter 'solutoin' of reward typo is no dataset column and no argument grpo "
                 "passes (did you mean 'solution'?)"),
    ("strict", "", "rewards.0: reward strict takes no **kwargs, and grpo passes every dataset column to each "
                   "reward (as TRL does): prompts, completion_ids, question, solution would fail the first call"),
    ("settable", "", "parameter 'scale' of reward settable is no dataset column"),
])
def test_reward_parameters_that_no_call_fills_are_named_before_any_model(folder, fn, kwargs, message):
    (folder / "my_rewards.py").write_text(REWARD_FILE)
    with pytest.raises(DataError) as e:
        check_data(_recipe(f"rewards=[{{name: 'my_rewards.py:{fn}'}}]"))
    assert message in str(e.value)


def test_reward_parameters_that_fit_pass(folder):
    (folder / "my_rewards.py").write_text(REWARD_FILE)
    # the answer column reaches rewards as `answer`; a kwargs key fills a parameter too
    check_data(_recipe("rewards=[{name: 'my_rewards.py:fine'}, {name: 'my_rewards.py:settable', kwargs: {scale: 0.5}}]"))
    p = cli("validate", TINY, "data.files=rows.jsonl", "data.generator=null", "data.template={question}",
            "data.answer_column=solution", "rewards=[{name: 'my_rewards.py:typo'}]", cwd=folder)
    assert p.returncode == 2 and "parameter 'solutoin'" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_local_model_path_that_does_not_exist_is_named_before_the_run_folder_is_taken(tmp_path):
    # issue 22: it passed validate, and train left a run folder holding only its lock file
    for command, extra in (("validate", []), ("train", ["-o", str(tmp_path / "run")])):
        p = cli(command, TINY, "model.name_or_path=./no-such-model", *extra, cwd=tmp_path)
        assert p.returncode == 2, (command, p.stderr)
        assert f"model.name_or_path: {tmp_path / 'no-such-model'} does not exist" in p.stderr
    assert not (tmp_path / "run").exists()


def test_rows_without_an_answer_are_counted_and_named(folder):
    # issue 22: 14 of 40 rows had no answer; validate said ok and they trained on brevity alone, with no count
    rows = [{"question": f"What is {i} + 1?", "solution": (None if i % 3 == 0 else "" if i == 4 else str(i + 1))}
            for i in range(40)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        check_data(_recipe())
    # rows 1, 4, 7, ... (i = 0, 3, 6, ...) are null, row 5 (i = 4) is empty: 14 + 1 = 15 of 40
    assert "data.files: 15 of 40 rows of" in str(e.value)
    assert "have no 'solution' (rows 1, 4, 5, 7, 10, 13, 16, 19, 22, 25, ...;" in str(e.value)
    (folder / "rows.csv").write_text("question,solution\nWhat is 1 + 1?,2\nWhat is 2 + 2?,\n")
    with pytest.raises(DataError, match="1 of 2 rows of .*rows.csv have no 'solution' .rows 2;"):
        check_data(_recipe("data.files=rows.csv"))


def test_a_streamed_file_has_its_first_rows_checked_not_the_whole_of_it(folder):
    """data.streaming: validate reads each file's first STREAM_CHECK_ROWS rows (the file may not fit in memory);
    the same columns checks as for loaded data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_cli.data.checks import STREAM_CHECK_ROWS

    n = STREAM_CHECK_ROWS + 500

    def write(rows):
        (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pq.write_table(pa.Table.from_pylist(rows), folder / "rows.parquet", row_group_size=300)

    for name in ("rows.jsonl", "rows.parquet"):
        rows = [{"question": f"What is {i} + 1?", "solution": None if i in (7, n - 3) else str(i + 1)} for i in range(n)]
        write(rows)
        with pytest.raises(DataError, match=rf"data.files: 2 of {n} rows of .*{name} have no 'solution' .rows 8, {n - 2};"):
            check_data(_recipe(f"data.files={name}"))
        with pytest.raises(DataError, match=rf"data.files: 1 of the first {STREAM_CHECK_ROWS} rows of .*{name} have no "
                                            r"'solution' .rows 8;"):
            check_data(_recipe(f"data.files={name}", "data.streaming=true"))
        rows[7]["solution"] = "8"
        write(rows)
        assert check_data(_recipe(f"data.files={name}", "data.streaming=true")) == []  # row n - 2 is not read
    with pytest.raises(DataError, match=r"data.template uses column\(s\) \['questoin'\] \(did you mean 'question'\?\)"):
        check_data(_recipe("data.files=rows.parquet", "data.streaming=true", "data.template={questoin}"))


def test_validate_names_a_generator_that_is_asked_to_stream(tmp_path):
    p = cli("validate", TINY, "data.streaming=true", cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "data.streaming reads data.files or data.dataset; data.generator makes its rows in memory" in p.stdout + p.stderr
    assert "Traceback" not in p.stderr


def test_the_columns_a_reward_receives_are_one_rule_for_validate_and_train():
    from grpo_cli.data.prompts import reward_columns

    cols = {"question": ["q"], "solution": ["4"], "answer": ["stale"]}
    assert reward_columns(cols, "solution") == {"question": ["q"], "solution": ["4"], "answer": ["4"]}
    assert reward_columns(cols, "answer") == cols and reward_columns(cols, None) == cols
    assert reward_columns({"question": ["q"], "answer": ["x"]}, "solution") == {"question": ["q"]}  # no stale answer
