"""Process supervision end to end: step-level rewards checked, mapped to tokens, trained on per-token
advantages (DeepSeekMath sec. 4.1.3), logged per step, resumed exactly."""

import pytest
import torch

from grpo_cli.errors import RecipeError, RewardError
from grpo_cli.preflight import resolve
from grpo_cli.recipe.files import load_recipe
from grpo_cli.rewards import REWARDS
from grpo_cli.rewards.steps import check_steps, step_mean, token_at, token_end_offsets
from grpo_cli.trainer.engine import Engine

from helpers import read_jsonl, stable

torch.set_num_threads(1)


class CharTokenizer:
    """One token per character (ids are code points)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_offsets_map_text_ends_to_tokens():
    tok = CharTokenizer()
    offsets = token_end_offsets(tok, [[ord(c) for c in "ab c"]])[0]
    assert offsets == [1, 2, 3, 4]
    assert token_at(offsets, 2) == 1 and token_at(offsets, 4) == 3 and token_at(offsets, 99) == 3


def test_the_arithmetic_steps_reward_scores_each_equation():
    text = "3 + 4 = 7\nthen 5 * 2 = 11, and 8 / 0 = 1"
    offsets = list(range(1, len(text) + 1))  # one character per token
    (steps,) = REWARDS["arithmetic_steps"]([text], completion_offsets=[offsets])
    ends = [text.index("7") + 1, text.index("11") + 2, len(text)]
    assert steps == [(ends[0] - 1, 1.0), (ends[1] - 1, 0.0), (ends[2] - 1, 0.0)]
    assert REWARDS["arithmetic_steps"](["no equation here"], completion_offsets=[[1] * 16]) == [[]]


def test_malformed_steps_are_named():
    assert check_steps("s", [[(0, 1.0), (2, None)], None], [3, 1], skip=False) == ([[(0, 1.0), (2, None)], None], 0)
    with pytest.raises(RewardError, match="outside its 3 tokens"):
        check_steps("s", [[(3, 1.0)]], [3], skip=False)
    with pytest.raises(RewardError, match=r"expected \(token_index: int"):
        check_steps("s", [[(1.5, 1.0)]], [3], skip=False)
    with pytest.raises(RewardError, match="list of 2 entries"):
        check_steps("s", [[]], [3, 3], skip=False)
    assert check_steps("s", [[(0, float("nan"))]], [3], skip=True) == ([[(0, None)]], 1)
    assert step_mean([(0, 1.0), (1, None), (2, 0.0)]) == 0.5 and step_mean(None) is None


def test_a_step_reward_must_be_used_as_one():
    with pytest.raises(RecipeError, match="arithmetic_steps' is step-level: set level: step"):
        resolve(load_recipe("recipes/ci-tiny.yaml", ["rewards=[{name: arithmetic_steps}]"]))
    with pytest.raises(RecipeError, match="dynamic_sampling decides by the outcome"):
        resolve(load_recipe("recipes/ci-tiny.yaml", ["rewards=[{name: arithmetic_steps, level: step}]",
                                                     "algorithm.dynamic_sampling.enabled=true"]))


def _recipe(*extra):
    return load_recipe("recipes/ci-tiny.yaml", [
        "rewards=[{name: accuracy}, {name: 'tests/signal_rewards.py:digit_steps', level: step, weight: 0.5}]",
        "train.max_steps=4", "checkpoint.every_steps=2", "train.learning_rate=1e-2",
        "eval={every_steps: 2, limit: 2, max_new_tokens: 6}", *extra,  # eval scores the step reward too
    ])


@pytest.mark.usefixtures("model_cache")
def test_training_with_step_rewards_logs_them_and_resumes_exactly(tmp_path, monkeypatch):
    import grpo_cli.algo.advantages as advantages_module

    seen = []
    real = advantages_module.process_advantages
    monkeypatch.setattr(advantages_module, "process_advantages",
                        lambda steps, G, T: seen.append((steps, G, T)) or real(steps, G, T))
    Engine(_recipe(), tmp_path / "full").fit()
    metrics = read_jsonl(tmp_path / "full/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and "rewards/digit_steps/mean" in metrics[0]
    assert "eval/rewards/digit_steps/mean" in metrics[1]
    records = [x for x in read_jsonl(tmp_path / "full/rollouts.jsonl") if x["step"] == 1]
    assert len(records) == 8 and all("digit_steps" in x["steps"] for x in records)
    # the logged per-completion value is its mean step reward; the steps trained are the logged ones
    for x in records:
        rewards = [r for _, r in x["steps"]["digit_steps"]]
        assert x["rewards"]["digit_steps"] == (pytest.approx(sum(rewards) / len(rewards)) if rewards else None)
    assert [[list(s) for s in row] for row in seen[0][0]] == [x["steps"]["digit_steps"] for x in records]
    assert seen[0][1] == 4 and len(seen) == 4
    # the outcome advantages come from accuracy alone; the logged reward adds the step rewards' weighted mean
    for x in records:
        step_part = 0.0 if x["rewards"]["digit_steps"] is None else 0.5 * x["rewards"]["digit_steps"]
        assert x["reward"] == pytest.approx(x["rewards"]["accuracy"] + step_part, abs=1e-6)
    # how many steps, and how many groups the steps teach nothing (equal step rewards, or fewer than two)
    steps = [x["steps"]["digit_steps"] for x in records]
    assert metrics[0]["rewards/digit_steps/steps_per_completion"] == pytest.approx(sum(map(len, steps)) / 8)
    no_signal = [len({r for _, r in sum(steps[g:g + 4], [])}) < 2 for g in (0, 4)]
    assert metrics[0]["rewards/digit_steps/frac_zero_std"] == sum(no_signal) / 2

    # grpo inspect-rollouts shows them under each completion
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    shown = CliRunner().invoke(app, ["inspect-rollouts", str(tmp_path / "full"), "--step", "1", "--format", "markdown"])
    assert shown.exit_code == 0 and shown.output.count("steps digit_steps: ") == 8, shown.output
    first = records[0]["steps"]["digit_steps"]
    if first:
        assert f"steps digit_steps: {first[0][1]:.3f}@{first[0][0]}" in shown.output

    cut = tmp_path / "cut"
    Engine(_recipe("train.max_steps=2"), cut).fit()
    Engine(_recipe(), cut, resume="auto").fit()
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in metrics]


@pytest.mark.usefixtures("model_cache")
def test_with_step_rewards_alone_the_metrics_show_the_advantages_that_trained(tmp_path):
    # issue 21: advantages/abs_mean logged 0.0 and reward null every step while the step advantages trained
    r = load_recipe("recipes/ci-tiny.yaml", [
        "rewards=[{name: 'tests/signal_rewards.py:digit_steps', level: step}]", "train.max_steps=3",
        "train.learning_rate=1e-2", "checkpoint.every_steps=0",
    ])
    Engine(r, tmp_path / "run").fit()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    records = read_jsonl(tmp_path / "run/rollouts.jsonl")
    trained = 0
    for m in metrics:
        rows = [x for x in records if x["step"] == m["step"]]
        means = [x["rewards"]["digit_steps"] for x in rows if x["rewards"]["digit_steps"] is not None]
        assert m["reward"] == pytest.approx(sum(means) / len(means), abs=1e-6)  # each completion's mean step reward
        for x in rows:  # float32, as every logged reward
            assert x["reward"] == (None if x["rewards"]["digit_steps"] is None
                                   else pytest.approx(x["rewards"]["digit_steps"], abs=1e-6))
        # the groups without signal are the step rewards' (there is no outcome reward)
        assert m["frac_reward_zero_std"] == pytest.approx(m["rewards/digit_steps/frac_zero_std"])
        if m["frac_reward_zero_std"] < 1:
            trained += 1
            assert m["advantages/abs_mean"] > 0.05 and m["grad_norm"] > 0, m
            # a group with step signal: its completions' advantages as trained (mean A_t) are not all 0
            assert any(abs(x["advantage"]) > 1e-3 for x in rows)
        else:
            assert m["advantages/abs_mean"] == 0 and all(x["advantage"] == 0 for x in rows)
    assert trained >= 2, [m["frac_reward_zero_std"] for m in metrics]


@pytest.mark.slow
@pytest.mark.usefixtures("model_cache")
def test_the_tiny_model_learns_from_step_rewards_alone(tmp_path):
    # no outcome reward at all: every gradient comes from the per-token step advantages
    r = load_recipe("recipes/ci-tiny.yaml", [
        "rewards=[{name: 'tests/signal_rewards.py:digit_steps', level: step}]", "train.max_steps=30",
        "train.learning_rate=3e-3", "train.prompts_per_step=4", "train.micro_batch_size=16", "checkpoint.every_steps=0",
        "logging.rollouts=false",
    ])
    Engine(r, tmp_path / "run").fit()
    means = [m["rewards/digit_steps/mean"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")]
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    assert last > first + 0.15, (first, last)
