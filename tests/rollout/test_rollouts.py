"""The rollouts the engine receives (grpo_cli/rollout/rollouts.py) without vLLM: DAPO's dynamic sampling as a wrapper
(rounds sampled until B groups have signal, exact resume), a schedule of the caller's own handed to the engine, and
the recorded rollouts of `grpo replay` (the replay's own tests: tests/trainer/test_replay.py)."""

import json

import pytest

from grpo_cli.recipe.files import load_recipe
from grpo_cli.rollout.protocol import Rollouts
from grpo_cli.trainer.engine import Engine

from helpers import read_jsonl, stable


def _recipe(*extra):
    return load_recipe("recipes/ci-tiny.yaml", [
        "rewards=[{name: 'tests/signal_rewards.py:odd_answers_only'}]", "train.max_steps=4", "checkpoint.every_steps=2",
        "checkpoint.keep_last=null", *extra,
    ])


def _data_position(ckpt) -> dict:
    state = json.loads((ckpt / "trainer/trainer_state.json").read_text())
    return state["data"]


@pytest.mark.usefixtures("model_cache")
def test_dynamic_sampling_trains_only_on_groups_with_signal_and_resumes_exactly(tmp_path):
    Engine(_recipe(), tmp_path / "plain").fit()
    plain = read_jsonl(tmp_path / "plain/metrics.jsonl")
    assert max(m["frac_reward_zero_std"] for m in plain) > 0  # the data has groups without signal

    on = ("algorithm.dynamic_sampling.enabled=true", "algorithm.dynamic_sampling.max_rounds=8")
    Engine(_recipe(*on), tmp_path / "full").fit()
    full = read_jsonl(tmp_path / "full/metrics.jsonl")
    assert [m["frac_reward_zero_std"] for m in full] == [0.0] * 4
    assert any(m["dynamic_sampling/rounds"] > 1 for m in full)
    for m in full:  # every group sampled is trained, filtered out, or left over once B were found
        assert m["dynamic_sampling/rounds"] * 2 == 2 + m["dynamic_sampling/filtered_groups"] + m["dynamic_sampling/surplus_groups"]
    for x in read_jsonl(tmp_path / "full/rollouts.jsonl"):
        assert int(x["answer"]) % 2 == 1  # only the odd answers have signal
    # the data position counts every prompt sampled, kept or not
    rounds = [m["dynamic_sampling/rounds"] for m in full]
    assert _data_position(tmp_path / "full/checkpoints/step-4")["index"] == 2 * sum(rounds)

    cut = tmp_path / "cut"
    Engine(_recipe(*on, "train.max_steps=2"), cut).fit()
    Engine(_recipe(*on), cut, resume="auto").fit()
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in full]


@pytest.mark.usefixtures("model_cache")
def test_too_few_groups_with_signal_complete_the_batch_and_say_so(tmp_path):
    # a reward that is 0 everywhere: no group ever has signal
    r = load_recipe("recipes/ci-tiny.yaml", ["rewards=[{name: 'tests/signal_rewards.py:odd_answers_only', weight: 0.0}]",
                                             "train.max_steps=1", "checkpoint.every_steps=0",
                                             "algorithm.dynamic_sampling={enabled: true, max_rounds: 3}"])
    Engine(r, tmp_path / "run").fit()
    (m,) = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert m["dynamic_sampling/rounds"] == 3 and m["frac_reward_zero_std"] == 1.0
    assert m["dynamic_sampling/filtered_groups"] == 3 * 2 - 2 and m["dynamic_sampling/surplus_groups"] == 0
    assert len(read_jsonl(tmp_path / "run/rollouts.jsonl")) == 8  # still B*G rows trained


PROTOCOL = sorted(name for name in vars(Rollouts) if not name.startswith("_"))


def test_every_schedule_implements_the_whole_protocol():
    from grpo_cli.rollout.dynamic import DynamicSampling
    from grpo_cli.rollout.recorded import Recorded
    from grpo_cli.rollout.rollouts import Ahead, Sampled

    assert {"next", "after_update", "checkpoint_parts", "close"} <= set(PROTOCOL)
    for cls in (Sampled, Ahead, DynamicSampling, Recorded):
        missing = [name for name in PROTOCOL if not callable(getattr(cls, name, None))]
        assert not missing, (cls.__name__, missing)


@pytest.mark.usefixtures("model_cache")
def test_the_engine_trains_on_the_rollouts_it_is_handed_through_the_protocol_alone(tmp_path):
    # a schedule of the caller's own, built with build_rollouts' keywords: a wrapper that has the protocol's methods
    # and nothing else, so the engine reaching past them (say, for a generator) fails here
    from grpo_cli.rollout.rollouts import build_rollouts

    calls: list[str] = []

    def delegate(name):
        def method(self, *args, **kwargs):
            calls.append(name)
            return getattr(self.inner, name)(*args, **kwargs)
        return method

    Wrapped = type("Wrapped", (), {"__init__": lambda self, inner: setattr(self, "inner", inner),
                                   **{name: delegate(name) for name in PROTOCOL}})

    def build(recipe, **parts):
        return Wrapped(build_rollouts(recipe, **parts))

    recipe = _recipe("train.max_steps=3", "checkpoint.every_steps=3", "eval={limit: 2}")
    Engine(recipe, tmp_path / "plain").fit()
    Engine(recipe, tmp_path / "wrapped", rollouts=build).fit()
    plain, wrapped = (read_jsonl(tmp_path / f"{name}/metrics.jsonl") for name in ("plain", "wrapped"))
    assert [stable(m) for m in wrapped] == [stable(m) for m in plain] and len(plain) == 3
    assert calls.count("next") == 3 and calls.count("after_update") == 3
    assert calls.count("prepare") == calls.count("start") == calls.count("close") == 1
    assert calls.count("checkpoint_parts") == 1 and calls.count("eval_generator") == 1  # the one eval, at step 3
    assert calls.index("prepare") < calls.index("start") < calls.index("next") and calls[-1] == "close"
