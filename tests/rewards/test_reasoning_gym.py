"""reasoning-gym's own scorers as a reward (issue 39 item 4): the generator's rows keep their place, the reward
`reasoning_gym` rebuilds each row's entry from it and calls its task's `score_answer`, as the task's authors wrote it."""

import json
from pathlib import Path

import pytest
from helpers import cli, read_jsonl

reasoning_gym = pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install reasoning-gym)")

from grpo_cli.data.generators import GENERATORS  # noqa: E402
from grpo_cli.errors import DataError  # noqa: E402
from grpo_cli.rewards import REWARDS  # noqa: E402
from grpo_cli.rewards.kwargs import check_kwargs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# tasks of many kinds: sums, word problems, lists, strings, puzzles with several right answers, and arc_agi, whose
# metadata holds tuples (a JSON copy of it scores the right grid 0.05)
TASKS = ["chain_sum", "basic_arithmetic", "gsm_symbolic", "arc_agi", "word_sorting", "countdown", "letter_counting",
         "lcm", "spell_backward", "propositional_logic", "fraction_simplification", "family_relationships"]


def _through_a_file(rows: list[dict]) -> dict[str, list]:
    """The rows as the trainer passes them to a reward: column-wise, after a JSON round trip (a data file)."""
    rows = json.loads(json.dumps(rows))
    return {k: [r[k] for r in rows] for k in rows[0]}


def _score(completions, columns, **kwargs):
    return REWARDS["reasoning_gym"](prompts=columns["prompt"], completions=completions,
                                    completion_ids=[[1]] * len(completions), **columns, **kwargs)


@pytest.mark.parametrize("task", TASKS)
def test_each_task_is_scored_by_its_own_scorer_on_its_own_entry(task):
    rows = GENERATORS["reasoning_gym"](n=4, seed=11, task=task)
    own = reasoning_gym.create_dataset(task, size=4, seed=11)
    assert [r["prompt"] for r in rows] == [own[i]["question"] for i in range(4)]
    columns = _through_a_file(rows)
    wrong = ["<answer>7 apples</answer>", "<answer></answer>", "no tags at all", "<answer>x</answer>"]
    assert _score(wrong, columns) == [own.score_answer(a, own[i]) for i, a in enumerate(["7 apples", "", None, "x"])]
    if own[0]["answer"] is not None:
        gold = [f"Thinking... <answer>{own[i]['answer']}</answer>" for i in range(4)]
        assert _score(gold, columns) == [1.0] * 4
        whole = [str(own[i]["answer"]) for i in range(4)]
        assert _score(whole, columns, extract="whole") == [1.0] * 4


def test_a_mix_of_tasks_by_weight_keeps_each_rows_place():
    rows = GENERATORS["reasoning_gym"](n=300, seed=5, task={"chain_sum": {"weight": 3, "min_terms": 3, "max_terms": 3},
                                                             "lcm": {}})
    tasks = [r["task"] for r in rows]
    assert 0.68 < tasks.count("chain_sum") / 300 < 0.82  # 3:1 by weight
    assert rows == GENERATORS["reasoning_gym"](n=300, seed=5, task={"chain_sum": {"weight": 3, "min_terms": 3,
                                                                                  "max_terms": 3}, "lcm": {}})
    sums = [r for r in rows if r["task"] == "chain_sum"]
    own = reasoning_gym.create_dataset("chain_sum", size=len(sums), seed=5, min_terms=3, max_terms=3)
    assert [r["prompt"] for r in sums] == [own[i]["question"] for i in range(len(sums))]
    assert all(len(json.loads(r["metadata"])["num_terms"] * [0]) == 3 for r in sums)
    columns = _through_a_file(rows)
    gold = [f"<answer>{a}</answer>" for a in columns["answer"]]
    assert _score(gold, columns) == [1.0] * 300
    wrong = _score(["<answer>-1</answer>"] * 300, columns)
    assert all(w < 1.0 for w, a in zip(wrong, columns["answer"]) if a != "-1")
    assert [w for w, t in zip(wrong, tasks) if t == "chain_sum"] == [own.score_answer("-1", own[i]) for i in range(len(sums))]


def test_rows_without_their_place_are_scored_from_their_metadata():
    """A file written from reasoning-gym elsewhere has task, answer and metadata (JSON) only."""
    rows = GENERATORS["reasoning_gym"](n=3, seed=2, task="basic_arithmetic")
    columns = {k: [r[k] for r in rows] for k in ("prompt", "task", "answer", "metadata")}
    assert _score([f"<answer>{a}</answer>" for a in columns["answer"]], columns) == [1.0] * 3
    assert _score(["<answer>nope</answer>"] * 3, columns) == [0.0] * 3


def test_extraction_modes_and_bad_settings():
    rows = GENERATORS["reasoning_gym"](n=2, seed=0, task="chain_sum")
    columns = _through_a_file(rows)
    a, b = columns["answer"]
    assert _score([f"So the sum is {a}.", f"It is {b}, I think"], columns, extract="auto") == [1.0, 1.0]
    assert _score([f"<final>{a}</final>", f"<answer>{b}</answer>"], columns, tag="final") == [1.0, 0.0]
    with pytest.raises(ValueError, match="kwargs.extract: 'boxed' is not an extraction; valid: tag, whole, auto"):
        check_kwargs("reasoning_gym", REWARDS["reasoning_gym"], {"extract": "boxed"})
    with pytest.raises(ValueError, match="kwargs.mode: not a parameter of the built-in reward 'reasoning_gym'"):
        check_kwargs("reasoning_gym", REWARDS["reasoning_gym"], {"mode": "tag"})
    with pytest.raises(DataError, match="could not create task 'no_such_task'"):
        GENERATORS["reasoning_gym"](n=3, seed=0, task="no_such_task")
    with pytest.raises(DataError, match="give each task's settings under its name"):
        GENERATORS["reasoning_gym"](n=3, seed=0, task=["chain_sum", "lcm"], min_terms=2)


def _recipe(tmp_path, data: str) -> str:
    text = (ROOT / "recipes/ci-tiny.yaml").read_text()
    text = text.replace("  generator_kwargs:", "  #").replace("  generator: arithmetic ", f"  {data}\n  #")
    text = text.replace("rewards/toy.py:digit_fraction", "reasoning_gym")
    (tmp_path / "r.yaml").write_text(text.replace("rewards/", str(ROOT / "recipes/rewards") + "/"))
    return str(tmp_path / "r.yaml")


def test_validate_names_the_column_a_file_lacks(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "What is 2 + 2?", "answer": "4"}\n' * 4)
    p = cli("validate", _recipe(tmp_path, f"files: {tmp_path / 'd.jsonl'}"))
    assert p.returncode == 2, p.stderr
    assert "rewards.1: parameter 'task' of reward reasoning_gym is no dataset column" in p.stderr


@pytest.mark.slow
def test_a_run_scores_every_completion_with_its_tasks_scorer(tmp_path):
    """`grpo train` on a mix of two tasks: every logged reward is the row's task's own score of the completion (the
    random policy's text gets spell_backward's partial credit, which differs row by row)."""
    data = "generator: reasoning_gym\n  generator_kwargs: {size: 32, seed: 7, task: {spell_backward: {}, lcm: {}}}"
    p = cli("train", _recipe(tmp_path, data), "-o", str(tmp_path / "run"), "train.max_steps=2",
            "rewards.1.kwargs={extract: whole}", "checkpoint.every_steps=0")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run/rollouts.jsonl")
    assert len(rows) == 16
    problems = GENERATORS["reasoning_gym"](n=32, seed=7, task={"spell_backward": {}, "lcm": {}})
    scored, partial = 0, set()
    for row in rows:
        source = problems[row["data_index"]]
        assert source["prompt"] in row["prompt"]
        own = reasoning_gym.create_dataset(source["task"], size=source["task_size"], seed=source["task_seed"])
        expected = own.score_answer(row["completion"].strip(), own[source["task_index"]])
        assert row["rewards"]["reasoning_gym"] == pytest.approx(expected)
        scored += 1
        partial.add(round(expected, 6))
    assert scored == 16 and len(partial) > 1  # spell_backward's scorer gives credit by the letters: the rows differ
