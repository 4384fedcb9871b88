"""`grpo inspect-rollouts` on hand-made rollouts with known numbers, and on a real tiny run."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.errors import InspectError
from grpo_cli.views.inspect_rollouts import run
from grpo_cli.views.rollouts import (
    arrange,
    best_worst,
    complete_steps,
    group_stats,
    load_records,
    match_prompt,
    parse_where,
    reward_names,
    select,
    short_prompt,
    step_stats,
    visible,
)
from grpo_cli.views.rollouts_markdown import md_cell, render_markdown, render_prompt_markdown

import helpers

ROOT = Path(__file__).resolve().parents[2]
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
# (step, group, data_index, question, answer, [(accuracy, format, advantage, length, truncated, completion)] x G=4)
GROUPS = [
    (1, 0, 10, "What is 1 + 1?", "2", [(1, 0, 0.866, 5, False, "2"), (0, 0, -0.866, 16, True, "1 + 1 = 3 and"),
                                       (1, 0, 0.866, 6, False, "it is 2"), (0, 0, -0.866, 16, True, "eleven")]),
    (1, 1, 20, "What is 2 + 2?", "4", [(0, 0, 0.0, 16, True, f"five {i}") for i in range(4)]),
    (2, 0, 10, "What is 1 + 1?", "2", [(1, 0, 0.2, 6, False, "2."), (1, 0.5, 1.0, 9, False, "1 | 1\nso 2"),
                                       (1, 0, 0.2, 7, False, "<think>hm</think> 2"), (0, 0, -1.4, 16, True, "3")]),
    (2, 1, 30, "What is 3 + 3?", "6", [(0, 0.5, 0.0, 4, False, "a"), (0, 0.5, 0.0, 5, False, "b"),
                                       (0, 0.5, 0.0, 16, True, "c"), (None, 0.5, 0.0, 3, False, "d")]),
]  # step 2 group 1 sample 3: the accuracy function failed (null), so the total is null too
METRICS = [{"step": 1, "reward": 0.25, "clip_ratio/region_mean": 0.0},
           {"step": 2, "reward": 0.714, "clip_ratio/region_mean": 0.025}]


def make_records(groups=GROUPS) -> list[dict]:
    out = []
    for step, group, index, q, answer, samples in groups:
        for i, (acc, fmt, adv, length, trunc, text) in enumerate(samples):
            out.append({"step": step, "group": group, "sample": i, "data_index": index, "prompt": CHATML.format(q=q),
                        "answer": answer, "completion": text, "rewards": {"accuracy": acc, "format": fmt},
                        "reward": None if acc is None else acc + fmt, "advantage": adv, "length": length,
                        "truncated": trunc})
    return out


RECORDS = make_records()


def rec(step: int, group: int, sample: int) -> dict:
    return next(r for r in RECORDS if (r["step"], r["group"], r["sample"]) == (step, group, sample))


def keys(records) -> list[tuple[int, int, int]]:
    return [(r["step"], r["group"], r["sample"]) for r in records]


def lines(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "rollouts.jsonl").write_text(lines(RECORDS))
    (tmp_path / "metrics.jsonl").write_text(lines(METRICS))
    return tmp_path


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "300"}  # wide enough that rich never wraps a header or a completion
    return helpers.cli("inspect-rollouts", *args, env=env, timeout=120)


# ----- reading ------------------------------------------------------------------------------------
def test_cut_last_line_and_garbage_are_skipped_and_counted(tmp_path):
    text = lines(RECORDS)
    cut = text[: len(text) - 40]  # the last record loses its tail, as when a crash cuts a write
    (tmp_path / "rollouts.jsonl").write_text(cut)
    records, skipped = load_records(tmp_path / "rollouts.jsonl")
    assert (len(records), skipped) == (15, 1)
    assert records == RECORDS[:15]
    (tmp_path / "rollouts.jsonl").write_text("not json\n" + cut)
    assert load_records(tmp_path / "rollouts.jsonl")[1] == 2
    p = cli(str(tmp_path), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "skipped 2 incomplete or malformed lines"
    assert keys(json.loads(p.stdout)) == [(2, 0, 1), (2, 0, 0), (2, 0, 2), (2, 0, 3), (2, 1, 0), (2, 1, 1), (2, 1, 2)]


def test_a_line_separator_inside_a_completion_does_not_split_the_record(tmp_path):
    r = {**RECORDS[0], "completion": "a\u2028b\x85c"}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(r, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_records(tmp_path / "rollouts.jsonl") == ([r], 0)


# ----- selection, sorting, statistics --------------------------------------------------------------
def test_default_view_is_the_latest_step_with_exact_header(run_dir):
    p = cli(str(run_dir))
    assert p.returncode == 0, p.stderr
    # step 2 rewards (null dropped): 1, 1.5, 1, 0, .5, .5, .5 -> mean 5/7 = 0.714; sum of squared deviations
    # 10/7 -> stdev sqrt(10/7/6) = 0.488; group stds 0.629 and 0 -> mean 0.315; truncated: g0 s3, g1 s2
    assert ("step 2 | 8 completions in 2 groups | reward 0.714 ± 0.488 (std n-1) | mean group std 0.315 | "
            "zero-std groups 1/2 | truncated 2/8 (0.25) | clip_ratio/region_mean 0.025") in p.stdout
    assert "step 1 |" not in p.stdout and "eleven" not in p.stdout
    for text in ("2.", "1 | 1", "so 2", "<think>hm</think> 2", "What is 3 + 3?", "answer: 6"):
        assert text in p.stdout
    assert "<|im_start|>" not in p.stdout  # the chat template is stripped to the user turn
    assert "1 (best)" in p.stdout and "3 (worst)" in p.stdout


def test_sorting_within_a_group():
    g = select(RECORDS, step=2, group=0)
    assert [r["sample"] for r in arrange(g, "reward")] == [1, 0, 2, 3]  # 1.5, 1, 1 (ties by sample), 0
    assert [r["sample"] for r in arrange(g, "length")] == [3, 1, 2, 0]  # 16, 9, 7, 6
    assert [r["sample"] for r in arrange(g, "advantage")] == [1, 0, 2, 3]  # 1.0, 0.2, 0.2, -1.4
    assert [r["sample"] for r in arrange(select(RECORDS, step=2, group=1), "reward")] == [0, 1, 2, 3]  # null last
    assert keys(arrange(select(RECORDS, step=None), "reward", limit=1)) == [(1, 0, 0), (1, 1, 0), (2, 0, 1), (2, 1, 0)]


def test_group_and_step_statistics_are_hand_computed():
    # step 1 group 0 rewards 1, 0, 1, 0: mean 0.5, stdev sqrt(4 * 0.25 / 3) = 0.5774
    s = group_stats(select(RECORDS, step=1, group=0))
    assert (s.n, s.mean) == (4, 0.5) and s.std == pytest.approx(0.577350, abs=1e-6)
    # step 2 group 0 rewards 1, 1.5, 1, 0: mean 0.875, squared deviations sum 1.1875 -> sqrt(1.1875 / 3) = 0.6292
    assert group_stats(select(RECORDS, step=2, group=0)).std == pytest.approx(0.629153, abs=1e-6)
    assert group_stats(select(RECORDS, step=2, group=1)) == type(s)(4, 0.5, 0.0)  # null reward ignored
    one = step_stats(select(RECORDS, step=1))
    # step 1: two 1s and six 0s: mean 0.25, squared deviations 2 * 0.5625 + 6 * 0.0625 = 1.5 -> sqrt(1.5 / 7) = 0.4629
    assert (one.mean, one.zero_std_groups, one.truncated, one.groups) == (0.25, 1, 6, 2)
    assert one.std == pytest.approx(0.462910, abs=1e-6) and one.mean_group_std == pytest.approx(0.577350 / 2, abs=1e-6)
    two = step_stats(select(RECORDS, step=2))
    assert two.mean == pytest.approx(5 / 7) and two.std == pytest.approx(0.487950, abs=1e-6)
    assert (two.zero_std_groups, two.truncated) == (1, 2)
    assert best_worst(select(RECORDS, step=2, group=0)) == (1, 3)
    assert best_worst(select(RECORDS, step=1, group=0)) == (0, 3)  # ties: best is the first, worst the last sample
    assert best_worst(select(RECORDS, step=2, group=1)) == (None, None)  # all equal: nothing to highlight


# ----- filters ------------------------------------------------------------------------------------
ALL_FIELDS = "fields: reward, advantage, length, step, group, sample, truncated, data_index"


def where(*texts: str) -> list:
    return [parse_where(t, reward_names(RECORDS)) for t in texts]


def test_where_filters_and_together():
    # 0.5 is not < 0.5, and a null reward never matches
    assert keys(select(RECORDS, where=where("reward < 0.5"))) == [
        (1, 0, 1), (1, 0, 3), (1, 1, 0), (1, 1, 1), (1, 1, 2), (1, 1, 3), (2, 0, 3)]
    assert keys(select(RECORDS, where=where("rewards.accuracy == 1"))) == [
        (1, 0, 0), (1, 0, 2), (2, 0, 0), (2, 0, 1), (2, 0, 2)]
    assert keys(select(RECORDS, where=where("rewards.accuracy == 1", "length > 6"))) == [(2, 0, 1), (2, 0, 2)]
    assert keys(select(RECORDS, step=2, where=where("truncated==1"))) == [(2, 0, 3), (2, 1, 2)]
    assert keys(select(RECORDS, where=where("rewards.accuracy != 0", "step >= 2", "sample<=0"))) == [(2, 0, 0)]
    assert keys(select(RECORDS, where=where("truncated == false", "advantage > 0.5"))) == [
        (1, 0, 0), (1, 0, 2), (2, 0, 1)]


@pytest.mark.parametrize("text, message", [
    ("reward <", "expected FIELD OP NUMBER"), ("reward ~ 1", "expected FIELD OP NUMBER"),
    ("reward = 1", "expected FIELD OP NUMBER"), ("__import__('os') > 1", "unknown field"),
    ("rewards.missing > 0", "unknown field"), ("reward < abc", "bad number"),
])
def test_bad_where_is_an_error_listing_the_fields(text, message):
    with pytest.raises(InspectError, match=message) as e:
        parse_where(text, ["accuracy", "format"])
    if message != "bad number":
        assert ALL_FIELDS + ", rewards.accuracy, rewards.format;" in str(e.value)


def test_json_output_is_the_selected_records(run_dir):
    p = cli(str(run_dir), "--step", "all", "--where", "rewards.accuracy == 1", "--where", "length > 6",
            "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [rec(2, 0, 1), rec(2, 0, 2)]  # sorted by reward: 1.5 then 1.0
    p = cli(str(run_dir), "--step", "1", "--group", "0", "--sort", "length", "--limit", "2", "--format", "json")
    assert json.loads(p.stdout) == [rec(1, 0, 1), rec(1, 0, 3)]  # the two 16-token completions


def test_errors_exit_2_without_traceback(tmp_path, run_dir):
    for args, message in [
        ([str(tmp_path / "nope")], "error: run folder not found"),
        ([str(run_dir), "--where", "reward <<< 1"], ALL_FIELDS + ", rewards.accuracy, rewards.format;"),
    ]:
        p = cli(*args)  # a real process: exit status and stderr as a user sees them
        assert p.returncode == 2, (args, p.stderr)
        assert message in p.stderr and "Traceback" not in p.stderr, p.stderr
    (tmp_path / "empty").mkdir()
    for args, message in [
        ([str(tmp_path / "empty")], "has no rollouts.jsonl"),
        ([str(run_dir), "--where", "rewards.fmt > 0"], "unknown field 'rewards.fmt'"),
        ([str(run_dir), "--step", "7"], "error: step 7 is not in rollouts.jsonl (steps 1..2)"),
        ([str(run_dir), "--step", "first"], "error: bad --step 'first'"),
        ([str(run_dir), "--sort", "speed"], "error: bad --sort 'speed'"),
        ([str(run_dir), "--format", "html"], "error: bad --format 'html'"),
        ([str(run_dir), "--prompt", "What is 9 + 9"], "error: no prompt matches"),
        ([str(run_dir), "--prompt", "10", "--follow"], "error: --follow and --prompt do not combine"),
    ]:
        r = CliRunner().invoke(app, ["inspect-rollouts", *args])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (args, r.output)
        assert message in r.output, r.output


# ----- markdown -----------------------------------------------------------------------------------
MD_STEP2 = """# Step 2

step 2 | 8 completions in 2 groups | reward 0.714 ± 0.488 (std n-1) | mean group std 0.315 | zero-std groups 1/2 | truncated 2/8 (0.25) | clip_ratio/region_mean 0.025

## Step 2 · group 0 · data_index 10

> What is 1 + 1?

**Answer:** 2 · group reward 0.875 ± 0.629 (std n-1, 4 completions)

| sample | reward | accuracy | format | advantage | length | truncated | completion |
|---:|---:|---:|---:|---:|---:|:--|:--|
| 1 (best) | 1.500 | 1.000 | 0.500 | 1.000 | 9 | no | 1 \\| 1<br>so 2 |
| 0 | 1.000 | 1.000 | 0.000 | 0.200 | 6 | no | 2. |
| 2 | 1.000 | 1.000 | 0.000 | 0.200 | 7 | no | &lt;think&gt;hm&lt;/think&gt; 2 |
| 3 (worst) | 0.000 | 0.000 | 0.000 | -1.400 | 16 | yes | 3 |

## Step 2 · group 1 · data_index 30

> What is 3 + 3?

**Answer:** 6 · group reward 0.500 ± 0.000 (std n-1, 4 completions)

| sample | reward | accuracy | format | advantage | length | truncated | completion |
|---:|---:|---:|---:|---:|---:|:--|:--|
| 0 | 0.500 | 0.000 | 0.500 | 0.000 | 4 | no | a |
| 1 | 0.500 | 0.000 | 0.500 | 0.000 | 5 | no | b |
| 2 | 0.500 | 0.000 | 0.500 | 0.000 | 16 | yes | c |
| 3 | n/a | n/a | 0.500 | 0.000 | 3 | no | d |
"""


def test_markdown_is_exact_and_every_table_row_has_the_same_cells():
    shown = arrange(select(RECORDS, step=2), "reward")
    md = render_markdown(shown, RECORDS, {m["step"]: m for m in METRICS})
    assert md == MD_STEP2
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert {len(re.split(r"(?<!\\)\|", row)) for row in rows} == {10}  # 8 cells + the two outer pipes
    # with a filter, group statistics still describe the whole group
    md = render_markdown(arrange(select(RECORDS, step=2, where=where("reward < 0.5"))), RECORDS, {})
    assert "group reward 0.875 ± 0.629 (std n-1, 4 completions)" in md and "| 3 (worst) | 0.000 |" in md
    assert "group 1" not in md and "clip_ratio" not in md


def test_markdown_through_the_cli(run_dir):
    p = cli(str(run_dir), "--format", "markdown")
    assert p.returncode == 0, p.stderr
    assert p.stdout == MD_STEP2 + "\n"


def test_text_helpers():
    assert short_prompt(CHATML.format(q="What is 1 + 1?")) == "What is 1 + 1?"
    two_turns = ("<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
                 "<|im_start|>user\n second \n<|im_end|>\n")
    assert short_prompt(two_turns) == "second"
    llama = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert short_prompt(llama) == "Hi there"
    assert short_prompt("  Question: 2 + 2?\nAnswer:") == "Question: 2 + 2?\nAnswer:"
    assert md_cell("a|b\r\nc<d>&") == "a\\|b<br>c&lt;d&gt;&amp;"
    assert visible("ok\x1a\x00\tz\n") == "ok\\x1a\\x00\tz\n"


# ----- --prompt -----------------------------------------------------------------------------------
def test_prompt_across_steps():
    by_index, by_text = match_prompt(RECORDS, "10"), match_prompt(RECORDS, "what is 1 + 1")
    assert keys(by_index) == keys(by_text) == [(1, 0, i) for i in range(4)] + [(2, 0, i) for i in range(4)]
    md = render_prompt_markdown(arrange(by_index), RECORDS)
    assert "| 1 | 0 | 0.500 | 0.577 | 1.000: 2<br>1.000: it is 2<br>0.000: 1 + 1 = 3 and<br>0.000: eleven |" in md
    assert ("| 2 | 0 | 0.875 | 0.629 | 1.500: 1 \\| 1 so 2<br>1.000: 2.<br>1.000: &lt;think&gt;hm&lt;/think&gt; 2<br>"
            "0.000: 3 |") in md
    assert md.startswith("## Prompt data_index 10\n\n> What is 1 + 1?\n\n**Answer:** 2\n")


def test_prompt_view_through_the_cli(run_dir):
    p = cli(str(run_dir), "--prompt", "What is 1 + 1", "--limit", "1")
    assert p.returncode == 0, p.stderr
    # table rows inside a panel: step, group, mean, std, then the best completion (--limit 1) as "reward: text"
    rows = [line.strip("│ ").split() for line in p.stdout.splitlines() if re.match(r"│\s*[12]\s+0\s", line)]
    assert rows == [["1", "0", "0.500", "0.577", "1.000:", "2"],
                    ["2", "0", "0.875", "0.629", "1.500:", "1", "|", "1", "so", "2"]]


# ----- --follow -----------------------------------------------------------------------------------
def test_complete_steps_waits_for_the_metrics_line():
    assert complete_steps(RECORDS, [1]) == {1}
    assert complete_steps(RECORDS, [1, 2]) == {1, 2}
    assert complete_steps([], []) == set()


def test_follow_prints_a_step_appended_after_it_started(run_dir, capsys):
    step3 = make_records([(3, 0, 40, "What is 4 + 4?", "8", [(1, 0, 0.5, 4, False, "8"), (0, 0, -0.5, 5, False, "9"),
                                                         (1, 0, 0.5, 4, False, "8!"), (0, 0, -0.5, 16, True, "7")])])

    def trainer():  # writes step 3 the way a running trainer can be seen: a record cut mid-line, then the rest
        time.sleep(0.3)
        text = lines(step3)
        with open(run_dir / "rollouts.jsonl", "a") as f:
            f.write(text[:-30])
            f.flush()
            time.sleep(0.3)
            f.write(text[-30:])
        time.sleep(0.3)
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 3, "clip_ratio/region_mean": 0.5}) + "\n")

    t = threading.Thread(target=trainer)
    t.start()
    run(run_dir, step=None, group=None, sort="reward", where=[], limit=None, fmt="json", follow_=True, prompt=None,
        follow_timeout=1.6, poll_interval=0.05)
    t.join()
    out, err = capsys.readouterr()
    printed = [json.loads(line) for line in out.splitlines()]
    assert [keys(p) for p in printed] == [keys(arrange(select(RECORDS, step=2))),  # the initial view, then step 3
                                          [(3, 0, 0), (3, 0, 2), (3, 0, 1), (3, 0, 3)]]
    assert printed[1][0] == step3[0] and "skipped" not in err


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_follow_waits_for_a_run_folder_that_does_not_exist_yet(tmp_path):
    run, out, err = tmp_path / "runs/new", tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as o, open(err, "w") as e:
        proc = helpers.popen("inspect-rollouts", run, "--follow", "--format", "json", "--poll-interval", "0.05", stdout=o,
                             stderr=e, cwd=ROOT)
    try:
        wait_for(lambda: "waiting for" in err.read_text() or proc.poll() is not None)
        assert proc.poll() is None, err.read_text()  # it did not exit: it waits
        assert err.read_text().strip() == f"waiting for {run / 'rollouts.jsonl'} ... (Ctrl-C to stop)"
        run.mkdir(parents=True)  # the trainer starts: the folder, then step 1's rollouts and metrics line
        (run / "rollouts.jsonl").write_text(lines(select(RECORDS, step=1)))
        (run / "metrics.jsonl").write_text(lines(METRICS[:1]))
        wait_for(lambda: out.read_text().endswith("\n") or proc.poll() is not None)
        assert proc.poll() is None, err.read_text()
        printed = [json.loads(line) for line in out.read_text().splitlines()]
        assert [keys(p) for p in printed] == [keys(arrange(select(RECORDS, step=1)))]
        assert err.read_text().count("waiting for") == 1 and f"following {run / 'rollouts.jsonl'}" in err.read_text()
    finally:
        proc.kill()
        proc.wait()


# ----- a real run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A 2-step ci-tiny training run (one per module: both tests below read it)."""
    tmp = tmp_path_factory.mktemp("real")
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp / "cache")}
    out = tmp / "run"
    p = helpers.cli("train", "recipes/ci-tiny.yaml", "-o", out, "train.max_steps=2", env=env)
    assert p.returncode == 0, p.stderr
    return out


def test_a_tab_in_a_completion_does_not_wrap_its_table_cell(tmp_path):
    """A sampled tab (a real ci-tiny completion) is measured as one cell and drawn as up to eight, so rich wrapped
    the line mid-word inside a 300-column table; the view expands tabs before the table measures the text."""
    text = "c How\t79 7What\x18 84oks 12110\ufffd49121116sy"
    groups = [(1, 0, 10, "What is 1 + 1?", "2", [(1, 0, 0.5, 16, True, text), (0, 0, -0.5, 3, False, "3"),
                                                 (1, 0, 0.5, 2, False, "2"), (0, 0, -0.5, 2, False, "4")])]
    (tmp_path / "rollouts.jsonl").write_text(lines(make_records(groups)))
    p = cli(str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert " ".join(visible(text).split()) in " ".join(p.stdout.split()), p.stdout


@pytest.mark.slow
def test_real_tiny_run_default_view_shows_every_completion_of_the_latest_step(real_run):
    records, skipped = load_records(real_run / "rollouts.jsonl")
    latest = [r for r in records if r["step"] == 2]
    assert skipped == 0 and len(latest) == 8  # ci-tiny: 2 prompts x G=4
    p = cli(str(real_run))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("step 2 | 8 completions in 2 groups | reward ")
    assert "step 1 |" not in p.stdout
    flat = " ".join(p.stdout.split())
    for r in latest:
        assert " ".join(visible(r["completion"]).split()) in flat, r["completion"]
    assert p.stdout.count(" · group ") == 2


@pytest.mark.slow
@pytest.mark.parametrize("columns", ["80", None])  # an 80-column terminal; piped with no COLUMNS (100 wide)
def test_narrow_or_piped_output_wraps_completions_readably(real_run, columns):
    # a table with 7 score columns left 4 characters for the completion at 80 columns: one fragment a line
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    p = helpers.cli("inspect-rollouts", real_run, "--step", "all", env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    width = int(columns or 100)
    out = p.stdout.splitlines()
    assert max(map(len, out)) <= width, max(out, key=len)
    inner = [line.strip("│ ") for line in out]  # without the panel's borders
    records, _ = load_records(real_run / "rollouts.jsonl")
    assert len(records) == 16
    for r in records:
        text = " ".join(visible(r["completion"]).split())
        # a completion that fits the width is shown whole on one line, not cut into fragments
        assert len(text) > width - 8 or any(text in " ".join(line.split()) for line in inner), (text, p.stdout)
        assert text in " ".join(" ".join(inner).split())
    # every score of every completion is shown: rewards with their names, advantage, length
    assert len(re.findall(r"(?<!\S)reward=", p.stdout)) == len(re.findall(r"(?<!\S)adv=", p.stdout)) == 16
    assert sum(0 < len(line) <= 6 for line in inner) <= 2, p.stdout  # no column of 4-character fragments


def test_the_command_never_imports_torch(run_dir):
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom grpo_cli.cli import app\n"
            f"r = CliRunner().invoke(app, ['inspect-rollouts', {str(run_dir)!r}, '--step', 'all'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_help_has_copy_paste_examples():
    r = CliRunner().invoke(app, ["inspect-rollouts", "--help"])
    assert r.exit_code == 0
    example = "grpo inspect-rollouts runs/quickstart --step all --where 'reward < 0.5' --where 'truncated == 1'\n"
    assert example in r.output  # on one line: click does not rewrap the \\b paragraph
