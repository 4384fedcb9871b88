"""Rewards checked before training (kwargs vs signatures, built-in values) and failures reported with
on_error: skip (the first one printed with the user's frame, NaN/inf scored as missing and counted)."""

from __future__ import annotations

import json
import logging
import math
import textwrap

import pytest

from grpo_cli.errors import RecipeError
from grpo_cli.preflight import resolve
from grpo_cli.recipe.files import load_recipe
from grpo_cli.recipe.schema import Recipe, RewardConfig
from grpo_cli.rewards import score
from grpo_cli.rewards.outcomes import reset_reports

from helpers import cli

USER_CODE = textwrap.dedent(
    """
    import json

    def strict(completions, answer, factor=1.0):
        return [factor for _ in completions]

    def loose(completions, **kwargs):
        return [1.0 for _ in completions]

    def parses(completions, **_):
        return [float(json.loads(c)) for c in completions]

    def boom(completions, **_):
        raise ZeroDivisionError("boom in user code")

    def nan_and_inf(completions, **_):
        return [[float("nan"), 1.0, float("-inf"), 2.0][i % 4] for i in range(len(completions))]
    """
)
LINE = {name: i + 1 for i, line in enumerate(USER_CODE.splitlines()) for name in ("json.loads", "raise Zero")
        if name in line}


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(USER_CODE)
    reset_reports()
    yield str(tmp_path / "mine.py")
    reset_reports()


def recipe(*rewards: dict) -> dict:
    return {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
            "rewards": list(rewards), "train": {"max_steps": 1}}


def refused(*rewards: dict) -> str:
    with pytest.raises(ValueError) as e:
        resolve(Recipe.model_validate(recipe(*rewards)))
    return str(e.value)


# --------------------------------------------------------------------------- kwargs at validation

@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("accuracy", {"mod": "boxed"}, "rewards.0.kwargs.mod: not a parameter of the built-in reward 'accuracy' "
                                       "(did you mean 'mode'?); it takes: mode, tag"),
        ("accuracy", {"mode": "boxd"}, "rewards.0.kwargs.mode: unknown answer extraction mode 'boxd' (did you mean "
                                       "'boxed'?); valid: auto, boxed, tag, gsm8k, last_number"),
        ("accuracy", {"tag": ""}, "rewards.0.kwargs.tag: must be a non-empty tag name"),
        ("accuracy", {"strict": "yes"}, "rewards.0.kwargs.strict: must be true or false"),
        ("accuracy", {"answer": "42"}, "rewards.0.kwargs.answer: not a parameter of the built-in reward 'accuracy'"),
        ("format", {"pattern": "(("}, "rewards.0.kwargs.pattern: not a valid regular expression"),
        ("format", {"patern": "x"}, "rewards.0.kwargs.patern: not a parameter of the built-in reward 'format' (did "
                                    "you mean 'pattern'?); it takes: pattern"),
        ("tag_count", {"tags": []}, "rewards.0.kwargs.tags: must be a non-empty list of tag names"),
        ("soft_overlong_punishment", {}, "rewards.0.kwargs.soft_punish_cache: required, an integer >= 1"),
        ("soft_overlong_punishment", {"soft_punish_cache": 0}, "rewards.0.kwargs.soft_punish_cache: must be an integer >= 1 (got 0)"),
        ("soft_overlong_punishment", {"soft_punish_cache": True}, "soft_punish_cache: must be an integer >= 1 (got True)"),
        ("soft_overlong_punishment", {"soft_punish_cache": 8, "max_completion_length": 4},
         "rewards.0.kwargs.soft_punish_cache (8) must be <= kwargs.max_completion_length (4)"),
        ("repetition_penalty", {"ngram": 3}, "(did you mean 'ngram_size'?); it takes: ngram_size, max_penalty"),
        ("repetition_penalty", {"ngram_size": 0}, "rewards.0.kwargs.ngram_size: must be an integer >= 1 (got 0)"),
        ("repetition_penalty", {"max_penalty": 0.5}, "rewards.0.kwargs.max_penalty: must be a number <= 0"),
        ("accuracy", {"completions": ["x"]}, "rewards.0.kwargs.completions: grpo passes prompts, completions, "
                                             "completion_ids to every reward itself"),
        ("mine.py:strict", {"factr": 2.0}, "rewards.0.kwargs.factr: not a parameter of mine.py:strict (its signature "
                                           "has no **kwargs) (did you mean 'factor'?); it takes: answer, factor"),
        ("mine.py:loose", {"prompts": 1}, "rewards.0.kwargs.prompts: grpo passes"),
    ],
)
def test_bad_kwargs_are_refused_naming_the_field(user_file, name, kwargs, message):
    assert message in refused({"name": name, "kwargs": kwargs})


def test_good_kwargs_pass_and_the_index_is_the_failing_reward(user_file):
    resolve(Recipe.model_validate(recipe(
        {"name": "accuracy", "kwargs": {"mode": "boxed", "tag": "answer"}},
        {"name": "format", "kwargs": {"pattern": r"^\d+$"}},
        {"name": "tag_count", "kwargs": {"tags": "answer"}},
        {"name": "soft_overlong_punishment", "kwargs": {"soft_punish_cache": 4, "max_completion_length": 8}},
        {"name": "repetition_penalty", "kwargs": {"ngram_size": 2, "max_penalty": -0.5}},
        {"name": "mine.py:strict", "kwargs": {"factor": 2.0, "answer": ["7"]}},  # a column set by kwargs
        {"name": "mine.py:loose", "kwargs": {"anything": 1, "goes": [2]}},  # **kwargs takes any keyword
    )))
    message = refused({"name": "accuracy"}, {"name": "mine.py:strict", "kwargs": {"scale": 1}})
    assert "rewards.1.kwargs.scale: not a parameter" in message and "rewards.0" not in message


def test_validate_cli_exits_2_on_a_kwarg_typo(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nmodel: {name_or_path: builtin:tiny-qwen2}\ndata: {generator: arithmetic}\n"
                    "rewards:\n  - {name: accuracy, kwargs: {mod: boxed}}\ntrain: {max_steps: 1}\n")
    out = cli("validate", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout
    assert "rewards.0.kwargs.mod: not a parameter of the built-in reward 'accuracy' (did you mean 'mode'?)" in out.stderr
    path.write_text(path.read_text().replace("mod: boxed", "mode: boxd"))
    with pytest.raises(RecipeError, match=r"rewards.0.kwargs.mode: unknown answer extraction mode 'boxd'"):
        resolve(load_recipe(path))


# --------------------------------------------------------------------------- on_error: skip


def run(specs: list[RewardConfig], completions: list[str], step: int = 3):
    n = len(completions)
    return score(specs, ["p"] * n, completions, [[1]] * n, {}, step=step)


@pytest.mark.parametrize("timeout_s", [None, 20.0], ids=["in-process", "child-process"])
def test_skip_prints_the_first_failure_once_with_the_user_frame(user_file, caplog, timeout_s):
    specs = [RewardConfig(name="mine.py:boom", on_error="skip", timeout_s=timeout_s),
             RewardConfig(name="mine.py:parses", on_error="skip", timeout_s=timeout_s),
             RewardConfig(name="format", weight=2.0, kwargs={"pattern": "1"})]
    with caplog.at_level(logging.WARNING, logger="grpo_cli"):
        for step in (1, 2):
            result = run(specs, ["1", "not json"], step=step)
            assert result.errors == {"boom": 1, "parses": 1}  # every failed call is counted
            assert result.per_function["boom"] == [None, None] and result.total == [2.0, 0.0]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one per reward, at its first failure only
    boom, parses = messages
    assert "reward 'boom' (mine.py:boom) failed at step 1 and is scored as missing (on_error: skip): " \
           "ZeroDivisionError: boom in user code" in boom
    assert f"at {user_file}:{LINE['raise Zero']} in boom" in boom
    assert "later failures of this reward are only counted (rewards/boom/errors)" in boom
    # the exception is raised inside json, but the frame shown is the user's line that called it
    assert "JSONDecodeError: Expecting value" in parses and f"at {user_file}:{LINE['json.loads']} in " in parses  # 'parses' or '<listcomp>'


def test_skip_turns_nan_and_inf_into_missing_and_counts_them(user_file, caplog):
    spec = RewardConfig(name="mine.py:nan_and_inf", on_error="skip", weight=0.5)
    with caplog.at_level(logging.WARNING, logger="grpo_cli"):
        result = run([spec, RewardConfig(name="format", kwargs={"pattern": "b"})], ["a", "b", "c", "d"])
        again = run([spec], ["a", "b", "c", "d"])
    assert result.per_function["nan_and_inf"] == [None, 1.0, None, 2.0]
    assert result.nonfinite == {"nan_and_inf": 2} and again.nonfinite == {"nan_and_inf": 2} and result.errors == {}
    # row 0: format 0 only = 0.0; row 1: 0.5 * 1 + 1 = 1.5; row 2: 0.0; row 3: 0.5 * 2 = 1.0
    assert result.total == [0.0, 1.5, 0.0, 1.0]
    assert math.isnan(again.total[0]) and again.total[1] == 0.5
    (message,) = [r.getMessage() for r in caplog.records]
    assert "reward 'nan_and_inf' (mine.py:nan_and_inf) returned nan for completion 0 at step 3; scored as missing" in message
    assert "(rewards/nan_and_inf/nonfinite)" in message


def test_raise_mode_keeps_the_exception_text(user_file):
    from grpo_cli.errors import RewardError

    with pytest.raises(RewardError, match=r"failed at step 3: ZeroDivisionError: boom in user code\n"
                                          r"fix the function, or set on_error: skip"):
        run([RewardConfig(name="mine.py:boom")], ["a"])
    with pytest.raises(RewardError, match=r"failed at step 3: ZeroDivisionError: boom in user code\n\nchild traceback"):
        run([RewardConfig(name="mine.py:boom", timeout_s=20.0)], ["a"])


@pytest.mark.parametrize("timeout_s", [None, 20.0], ids=["in-process", "child-process"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_call_the_signature_refuses_names_the_arguments_and_never_suggests_skip(user_file, timeout_s, on_error):
    # issue 22: the step-1 message said "set on_error: skip", which would drop the reward from every step
    from grpo_cli.errors import RewardError

    spec = RewardConfig(name="mine.py:strict", on_error=on_error, timeout_s=timeout_s)
    with pytest.raises(RewardError) as e:  # strict() has no **kwargs: it cannot take `prompts`
        score([spec], ["p"], ["a"], [[1]], {}, step=1)
    text = str(e.value)
    assert "reward 'strict' (mine.py:strict) cannot take the call grpo makes: TypeError: strict() got an " \
           "unexpected keyword argument 'prompts'" in text
    assert "keyword arguments completion_ids, completions, prompts:" in text
    assert "on_error: skip would not help" in text and "set on_error: skip" not in text
    # a TypeError raised inside the function is an ordinary failure: skip still counts it
    spec = RewardConfig(name="mine.py:parses", on_error="skip", timeout_s=timeout_s)
    assert score([spec], ["p"], ["[1]"], [[1]], {}, step=1).errors == {"parses": 1}


@pytest.mark.slow
def test_train_cli_prints_a_skipped_failure_once_and_logs_the_counts(tmp_path, model_cache):
    (tmp_path / "bad.py").write_text(USER_CODE)
    out_dir = tmp_path / "run"
    rewards = (f'rewards=[{{name: accuracy}}, {{name: "{tmp_path}/bad.py:boom", on_error: skip}}, '
               f'{{name: "{tmp_path}/bad.py:nan_and_inf", on_error: skip}}]')
    out = cli("train", "recipes/ci-tiny.yaml", rewards, "train.max_steps=2", "checkpoint.every_steps=0",
              f"logging.output_dir={out_dir}", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join((out.stdout + out.stderr).split())  # rich wraps long log lines
    assert text.count("ZeroDivisionError: boom in user code") == 1, text[-3000:]
    assert f"bad.py:{LINE['raise Zero']} in boom" in text
    assert text.count("returned nan for completion 0") == 1
    metrics = [m for m in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines())]
    # 8 completions per step: one failed call each step; 2 of every 4 values NaN/inf (rows 0, 2 of each 4)
    assert [m["rewards/boom/errors"] for m in metrics] == [1, 1]
    assert [m["rewards/nan_and_inf/nonfinite"] for m in metrics] == [4, 4]
