"""data.curriculum (issue 39 item 3): a row whose last group gave no signal is drawn with probability
no_signal_weight when its turn comes, passed over otherwise, before anything is sampled for it; its marks and the
draws resume exactly and are the same on every process."""

from pathlib import Path

import pytest
from datasets import Dataset

from grpo_cli.data.curriculum import Curriculum
from grpo_cli.data.prompts import DatasetRows

from helpers import ROOT, cli, read_jsonl


def _rows(n: int = 40, weight: float = 0.25, seed: int = 3) -> DatasetRows:
    return DatasetRows(Dataset.from_dict({"x": list(range(n))}), shuffle=True, seed=seed,
                       curriculum=Curriculum(weight, seed))


def test_a_group_without_signal_marks_its_row():
    c = Curriculum(0.5, 0)
    nan = float("nan")
    c.observe([7, 8, 9, 10], [1, 1, 1, 0, 1, 0, 0.5, 0.5 + 1e-7, 0.5, 1, nan, nan], group_size=3)
    assert c.no_signal == {7: True, 8: False, 9: True, 10: True}  # equal; differ; within 1e-6; one reward given
    c.observe([7], [0, 1, 1], 3)
    assert c.no_signal[7] is False  # its last group decides


def test_marked_rows_come_back_at_their_weight_and_the_others_always():
    rows = _rows()
    rows.curriculum.observe(list(range(20)), [1.0] * 20 * 4, group_size=4)  # rows 0-19: no signal
    seen = {r: 0 for r in range(40)}
    epochs = 200
    taken = rows.take(40 * epochs)  # every epoch passes over some marked rows, so this runs past 200 epochs
    for r in taken[: len(taken)]:
        seen[r] += 1
    last_epoch = rows.epoch
    assert all(seen[r] == last_epoch or seen[r] == last_epoch + 1 for r in range(20, 40))  # drawn every epoch
    share = sum(seen[r] for r in range(20)) / (20 * last_epoch)
    assert 0.22 < share < 0.28, share  # 0.25, over ~250 epochs x 20 rows
    assert rows.curriculum.metrics()["curriculum/no_signal_rows"] == 20


def test_the_draws_resume_exactly_and_repeat_with_the_seed():
    a, b = _rows(), _rows()
    for rows in (a, b):
        rows.curriculum.observe([1, 5, 9, 13, 30], [2.0] * 5 * 2, group_size=2)
    first = a.take(57)
    state = a.state_dict()
    rest = a.take(200)
    assert b.take(257) == first + rest  # the same seed and marks draw the same rows
    c = _rows()
    c.load_state_dict(state)  # a resumed run: position and marks from the checkpoint
    assert c.take(200) == rest
    assert state["curriculum"] == {"no_signal": [1, 5, 9, 13, 30], "signal": []}
    other = _rows(seed=4)
    other.curriculum.observe([1, 5, 9, 13, 30], [2.0] * 10, group_size=2)
    assert other.take(257) != first + rest


def _run(out: Path, *args: str) -> list[dict]:
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(out), "data.generator_kwargs.size=8",
            f"rewards=[{{name: '{ROOT}/tests/signal_rewards.py:odd_answers_only'}}]", "train.max_steps=12",
            "checkpoint.every_steps=6", *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return read_jsonl(out / "metrics.jsonl")


@pytest.mark.slow
def test_a_run_passes_over_groups_without_signal_and_resumes_exactly(tmp_path):
    """8 rows, 2 a step, 12 steps (3 epochs); the rows with an even answer give every completion 0. Without a
    curriculum they come back every epoch; with no_signal_weight 0.01 they are passed over once their group was
    seen, so fewer groups without signal are trained. Six steps, then a resume for six: the same steps."""
    plain = _run(tmp_path / "plain")
    with_it = _run(tmp_path / "curriculum", "data.curriculum={no_signal_weight: 0.01}")
    share = [sum(m["frac_reward_zero_std"] for m in ms[4:]) / 8 for ms in (plain, with_it)]  # after the first epoch
    assert share[1] < share[0] - 0.2, share
    assert sum(m["curriculum/passed_over"] for m in with_it) > 0
    assert "curriculum/passed_over" not in plain[0]
    resumed = tmp_path / "resumed"
    _run(resumed, "data.curriculum={no_signal_weight: 0.01}", "train.max_steps=6")
    again = _run(resumed, "data.curriculum={no_signal_weight: 0.01}", "--resume", "auto")
    keys = ("reward", "frac_reward_zero_std", "curriculum/passed_over", "curriculum/no_signal_rows", "loss")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in with_it]
    rows = lambda run: [(r["step"], r["data_index"], r["completion"]) for r in read_jsonl(run / "rollouts.jsonl")]  # noqa: E731
    assert rows(resumed) == rows(tmp_path / "curriculum")
