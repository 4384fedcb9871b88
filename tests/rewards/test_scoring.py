"""Rewards: built-ins on hand-computed cases, name resolution, and `score` (async, errors, timeouts, totals)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time

import pytest

from grpo_cli.errors import RewardError
from grpo_cli.recipe.schema import RewardConfig
from grpo_cli.rewards import REWARDS, check_reward_name, extract_answer, resolve_reward, reward_log_name, score
from grpo_cli.rewards.builtin import (
    accuracy,
    format_reward,
    reference_text,
    repetition_penalty,
    soft_overlong_punishment,
    tag_count,
)

USER_MODULE = textwrap.dedent(
    """
    import asyncio
    import time

    def length(completions, **_):
        return [float(len(c)) for c in completions]

    def scaled(completions, factor, answer, **_):
        return [factor * float(a) for a in answer]

    def short(completions, **_):
        return [1.0]

    def bad_type(completions, **_):
        return ["yes" for _ in completions]

    def not_a_list(completions, **_):
        return {"a": 1.0}

    def nan(completions, **_):
        return [float("nan") for _ in completions]

    def bools(completions, **_):
        return [c == "x" for c in completions]

    def half_none(completions, **_):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    def all_none(completions, **_):
        return [None for _ in completions]

    def boom(completions, **_):
        raise ZeroDivisionError("boom in user code")

    def sleepy(completions, **_):
        time.sleep(30)
        return [0.0 for _ in completions]

    async def async_a(completions, **_):
        await asyncio.sleep(0.3)
        return [1.0 for _ in completions]

    async def async_b(completions, **_):
        await asyncio.sleep(0.3)
        return [2.0 for _ in completions]

    def huge_int(completions, **_):
        return [10**400 for _ in completions]

    def spawns_and_hangs(completions, pid_file, **_):
        # a helper in its own session, and a daemon whose parent exits at once (double fork)
        import subprocess
        helper = subprocess.Popen(["sleep", "300"], start_new_session=True)
        daemon = subprocess.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        with open(pid_file, "w") as f:
            f.write(f"{helper.pid} {daemon.stdout.strip()}")
        time.sleep(30)
        return [0.0 for _ in completions]

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """`grpo_test_user_rewards` importable as a module, and `rewards_file.py` in the working directory."""
    (tmp_path / "grpo_test_user_rewards.py").write_text(USER_MODULE)
    (tmp_path / "rewards_file.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("grpo_test_user_rewards", None)
    yield "grpo_test_user_rewards"
    sys.modules.pop("grpo_test_user_rewards", None)


def run(names, completions, columns=None, **spec_fields):
    specs = [RewardConfig(name=n, **spec_fields) if isinstance(n, str) else n for n in names]
    n = len(completions)
    return score(specs, ["p"] * n, completions, [[1]] * n, columns or {}, step=7)


def test_import_does_not_pull_torch_or_math_verify():
    code = "import grpo_cli.rewards, sys; assert 'torch' not in sys.modules; assert 'math_verify' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- extraction and accuracy


@pytest.mark.parametrize(
    "text, mode, expected",
    [
        ("so she sold 48 + 24 = 72 clips.\n#### 72", "gsm8k", "72"),
        ("#### 1,000.\nextra", "gsm8k", "1,000"),
        ("no hashes 5", "gsm8k", None),
        (r"thus \boxed{\frac{1}{2}} and \boxed{x^{2}}", "boxed", "x^{2}"),
        (r"\boxed{\frac{3}{4}", "boxed", None),  # unclosed brace
        ("<answer> 7 </answer> then <answer>8</answer>", "tag", "8"),
        ("<final>9</final>", "tag", None),  # default tag is `answer`
        ("it costs $1,234.50 or -3 or 3/4 dollars.", "last_number", "3/4"),
        ("x = 3-5 = -2, done", "last_number", "-2"),
        ("from 3-5", "last_number", "5"),  # a minus after a digit is a subtraction
        ("total 1,000,000 apples", "last_number", "1000000"),
        ("no digits here", "last_number", None),
        (r"<answer>4</answer> \boxed{5} #### 6 7", "auto", "5"),  # boxed first
        ("<answer>4</answer> #### 6 7", "auto", "4"),  # then tag
        ("#### 6 then 7", "auto", "6 then 7"),  # then gsm8k
        ("just 7 and 8.", "auto", "8"),  # then the last number
        ("nothing", "auto", None),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_extract_answer_custom_tag_and_bad_mode():
    assert extract_answer("<final>9</final>", "tag", tag="final") == "9"
    with pytest.raises(ValueError, match="last_number"):
        extract_answer("1", "first_number")


def test_reference_text():
    assert reference_text("Natalia sold 48/2 = 24 clips in May.\n#### 72") == "72"
    assert reference_text(72) == "72"
    assert reference_text(1e-07) == "0.0000001"
    assert reference_text(None) is None


@pytest.mark.parametrize(
    "completion, answer, mode, expected",
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", "gsm8k", 1.0),
        ("#### 71", "#### 72", "gsm8k", 0.0),
        (r"The answer is \boxed{42}.", "42", "boxed", 1.0),
        (r"so \boxed{\frac{1}{2}}", "0.5", "auto", 1.0),
        ("<think>half</think><answer>0.5</answer>", "1/2", "tag", 1.0),  # "0.5" == "1/2"
        ("<answer>1/2</answer>", r"\frac{1}{2}", "auto", 1.0),
        ("the temperature fell to -7 degrees", "-7", "last_number", 1.0),
        ("the temperature fell to 7 degrees", "-7", "last_number", 0.0),
        ("They paid $1,500 in total.", "1500", "last_number", 1.0),  # comma thousands
        ("They paid $1,500 in total.", "#### 1,500", "auto", 1.0),
        ("so x equals 3/4", 0.75, "auto", 1.0),  # numeric reference
        ("I am not sure.", "72", "auto", 0.0),  # no answer at all
        (r"\boxed{\sqrt{2}}", r"\sqrt{2}", "boxed", 1.0),
        ("<answer>Paris</answer>", "paris", "tag", 1.0),  # text: words compared case-insensitively
        ("<answer>Pairs</answer>", "Paris", "tag", 0.0),  # not a product of symbols
    ],
)
def test_accuracy_cases(completion, answer, mode, expected):
    assert accuracy([completion], [answer], mode=mode) == [expected]


def test_accuracy_none_reference_and_missing_column():
    assert accuracy(["#### 1", "#### 2"], [None, "2"], prompts=["p", "p"], unknown=1) == [None, 1.0]
    with pytest.raises(ValueError, match="answer_column"):
        accuracy(["#### 1"])


# --------------------------------------------------------------------------- other built-ins


def test_format_reward():
    good = "<think>\nsteps\n</think>\n<answer>4</answer>\n"  # DOTALL, outer whitespace stripped
    assert format_reward([good, "<answer>4</answer>", "<think>a</think><answer>4</answer> extra"]) == [1.0, 0.0, 0.0]
    assert format_reward(["ANSWER: 4"], pattern=r"ANSWER: \d+") == [1.0]


def test_tag_count():
    completions = [
        "<think>a</think><answer>b</answer>",  # 4 x 0.25 = 1.0, / (0.5 * 2) = 1.0
        "<think>a</think><answer>b",  # 3 x 0.25 = 0.75, / 1.0 = 0.75
        "<think><think>a</think><answer>b</answer>",  # two <think>: 0.75
        "plain text",  # 0.0
    ]
    assert tag_count(completions) == [1.0, 0.75, 0.75, 0.0]
    # one tag: (0.25 + 0) / (0.5 * 1) = 0.5
    assert tag_count(["<answer>b"], tags=["answer"]) == [0.5]


def test_soft_overlong_punishment():
    # Lmax = 10, Lcache = 4, so the penalty starts after Lmax - Lcache = 6 tokens
    ids = [[0] * k for k in (5, 6, 7, 8, 10, 11)]
    # L=5,6: 0 | L=7: (6-7)/4 = -0.25 | L=8: (6-8)/4 = -0.5 | L=10: (6-10)/4 = -1.0 | L=11 > Lmax: -1
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert soft_overlong_punishment(ids, max_completion_length=10, soft_punish_cache=4) == expected
    with pytest.raises(ValueError, match="soft_punish_cache"):
        soft_overlong_punishment(ids, max_completion_length=10)


def test_repetition_penalty():
    texts = ["a b c a b c", "A a A a", "a b", "one two three four"]
    # "a b c a b c", n=3: (a,b,c) (b,c,a) (c,a,b) (a,b,c): 3 distinct of 4 -> (1 - 3/4) * -1 = -0.25
    # "A a A a" lower-cased, n=3: (a,a,a) (a,a,a): 1 distinct of 2 -> (1 - 1/2) * -1 = -0.5
    # "a b": fewer than 3 words -> 0 | all distinct -> 0
    assert repetition_penalty(texts) == [-0.25, -0.5, 0.0, 0.0]
    # n=2 on "A a A a": (a,a) x3, 1 distinct of 3 -> (1 - 1/3) * -0.5 = -1/3
    assert repetition_penalty(["A a A a"], ngram_size=2, max_penalty=-0.5) == [pytest.approx(-1 / 3)]
    with pytest.raises(ValueError, match="max_penalty"):
        repetition_penalty(texts, max_penalty=0.5)


def test_registry_holds_the_builtins():
    assert REWARDS.names() == ["accuracy", "arithmetic_steps", "environment", "format", "judge", "reasoning_gym",
                               "repetition_penalty", "soft_overlong_punishment", "tag_count"]
    assert all(REWARDS[n].__doc__ for n in REWARDS)


# --------------------------------------------------------------------------- names


def test_resolve_module_and_file(user_module):
    assert resolve_reward(f"{user_module}:length")(completions=["abc"]) == [3.0]
    assert resolve_reward("rewards_file.py:length")(completions=["ab"]) == [2.0]
    assert resolve_reward("./rewards_file.py:length") is resolve_reward("rewards_file.py:length")  # loaded once
    assert reward_log_name("rewards_file.py:length") == "length"
    assert reward_log_name("pkg.mod:fn") == "fn"
    assert reward_log_name("accuracy") == "accuracy"


def test_check_reward_name_errors(user_module):
    check_reward_name("accuracy")
    check_reward_name(f"{user_module}:length")
    with pytest.raises(ValueError) as e:
        check_reward_name("acuracy")
    assert "did you mean 'accuracy'" in str(e.value)
    assert "accuracy, arithmetic_steps, environment, format" in str(e.value) and "module:function" in str(e.value)
    assert "file.py:function" in str(e.value)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        check_reward_name("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="file not found: nope/missing.py"):
        check_reward_name("nope/missing.py:fn")
    with pytest.raises(ValueError, match="has no function 'missing'; it defines: .*length"):
        check_reward_name(f"{user_module}:missing")
    with pytest.raises(ValueError, match="has no function 'missing'"):
        check_reward_name("rewards_file.py:missing")
    with pytest.raises(ValueError, match="not a function"):
        check_reward_name(f"{user_module}:NOT_CALLABLE")
    with pytest.raises(ValueError, match="non-empty"):
        check_reward_name(f"{user_module}:")


# --------------------------------------------------------------------------- score


def test_score_columns_kwargs_and_total(user_module):
    specs = [
        RewardConfig(name="soft_overlong_punishment", weight=2.0, kwargs={"soft_punish_cache": 4}),
        RewardConfig(name=f"{user_module}:scaled", weight=0.5, kwargs={"factor": 3.0}),
    ]
    ids = [[0] * 8, [0] * 5]  # soft overlong with Lmax=10 from the columns: -0.5, 0.0
    result = score(specs, ["p", "q"], ["a", "b"], ids, {"answer": ["1", "2"], "max_completion_length": 10})
    assert result.per_function == {"soft_overlong_punishment": [-0.5, 0.0], "scaled": [3.0, 6.0]}
    # 2 * -0.5 + 0.5 * 3 = 0.5 ; 2 * 0 + 0.5 * 6 = 3.0
    assert result.total == [0.5, 3.0]
    assert result.errors == {} and result.timeouts == {}


def test_total_skips_none_and_is_nan_when_all_none(user_module):
    result = run(
        [
            RewardConfig(name=f"{user_module}:half_none", weight=2.0),
            RewardConfig(name=f"{user_module}:all_none", weight=5.0),
        ],
        ["a", "b", "c"],
    )
    assert result.per_function["all_none"] == [None, None, None]
    # row 0: 2 * 1.0 (all_none gives nothing) = 2.0 ; row 1: nothing at all -> NaN ; row 2: 2.0
    assert result.total[0] == 2.0 and math.isnan(result.total[1]) and result.total[2] == 2.0


def test_bools_become_floats_and_duplicate_names_get_suffixes(user_module):
    result = run(["format", "format", f"{user_module}:bools", "rewards_file.py:bools"], ["x", "y"])
    assert list(result.per_function) == ["format", "format_2", "bools", "bools_2"]
    assert result.per_function["bools"] == [1.0, 0.0] and type(result.per_function["bools"][0]) is float
    assert result.total == [2.0, 0.0]  # 0 + 0 + 1 + 1 ; 0 + 0 + 0 + 0


def test_async_rewards_run_concurrently(user_module):
    start = time.perf_counter()
    result = run([f"{user_module}:async_a", "rewards_file.py:async_b", "format"], ["x"])
    elapsed = time.perf_counter() - start
    assert result.per_function == {"async_a": [1.0], "async_b": [2.0], "format": [0.0]}
    assert elapsed < 0.55, f"two 0.3 s async rewards took {elapsed:.2f} s: not concurrent"


@pytest.mark.parametrize(
    "fn, message",
    [
        ("short", r"'short' returned 1 values for 2 completions"),
        ("bad_type", r"'bad_type' returned a str \('yes'\) for completion 0"),
        ("not_a_list", r"'not_a_list' returned a dict"),
        ("huge_int", r"'huge_int' returned an integer of 1329 bits for completion 0, too large for a float"),
    ],
)
def test_wrong_output_names_the_function(user_module, fn, message):
    with pytest.raises(RewardError, match=message):
        run([f"{user_module}:{fn}"], ["a", "b"], on_error="skip")  # a broken contract raises even with skip


def test_nan_raises_by_default(user_module):
    with pytest.raises(RewardError, match=r"'nan' returned nan for completion 0; .*or set on_error: skip"):
        run([f"{user_module}:nan"], ["a", "b"])  # with skip it is a missing reward: test_reward_checks.py


def test_exception_raise_or_skip(user_module):
    message = r"'boom' \(grpo_test_user_rewards:boom\) failed at step 7: ZeroDivisionError: boom"
    with pytest.raises(RewardError, match=message) as e:
        run([f"{user_module}:boom"], ["a"])
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    specs = [
        RewardConfig(name=f"{user_module}:boom", on_error="skip"),
        RewardConfig(name="rewards_file.py:boom", on_error="skip"),
        RewardConfig(name=f"{user_module}:length", weight=0.5),
    ]
    result = score(specs, ["p", "p"], ["ab", "abcd"], [[1], [1]], {})
    assert result.per_function == {"boom": [None, None], "boom_2": [None, None], "length": [2.0, 4.0]}
    assert result.errors == {"boom": 1, "boom_2": 1}
    assert result.total == [1.0, 2.0]  # 0.5 * 2 ; 0.5 * 4


def test_timeout_kills_child_skip_and_raise(user_module):
    specs = [
        RewardConfig(name="rewards_file.py:sleepy", timeout_s=1.0, on_error="skip"),
        RewardConfig(name="rewards_file.py:length", timeout_s=20.0),  # re-resolved from the file in the child
        RewardConfig(name="accuracy", timeout_s=20.0),
        RewardConfig(name="rewards_file.py:boom", timeout_s=20.0, on_error="skip"),
    ]
    start = time.perf_counter()
    result = score(specs, ["p"], ["#### 72"], [[1]], {"answer": ["72"]})
    elapsed = time.perf_counter() - start
    assert result.per_function == {"sleepy": [None], "length": [7.0], "accuracy": [1.0], "boom": [None]}
    assert result.timeouts == {"sleepy": 1} and result.errors == {"boom": 1}
    assert result.total == [8.0]
    assert elapsed < 12.0, f"the 1 s timeout took {elapsed:.1f} s"  # generous: the first call starts the fork server

    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"'sleepy' \(rewards_file.py:sleepy\) timed out after 0.5 s at step 7"):
        run(["rewards_file.py:sleepy"], ["a"], timeout_s=0.5)
    assert time.perf_counter() - start < 5.0
    with pytest.raises(RewardError, match="ZeroDivisionError: boom in user code"):
        run(["rewards_file.py:boom"], ["a"], timeout_s=20.0)


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie has exited and only waits for its parent to read its status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_timeout_kills_what_the_reward_started_in_other_process_groups(user_module, tmp_path):
    pid_file = tmp_path / "pids"
    spec = RewardConfig(name="rewards_file.py:spawns_and_hangs", timeout_s=2.0, on_error="skip",
                        kwargs={"pid_file": str(pid_file)})
    result = score([spec], ["p"], ["a"], [[1]], {})
    assert result.timeouts == {"spawns_and_hangs": 1}
    pids = [int(x) for x in pid_file.read_text().split()]
    assert len(pids) == 2 and all(pid > 0 for pid in pids)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if _alive(pid)]
    for pid in survivors:  # do not leave them behind if the assertion fails
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert survivors == []
