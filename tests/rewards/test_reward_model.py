"""Reward models (`model:PATH`): a tiny random Qwen2ForSequenceClassification built offline scores
prompt + completion with its own chat template; its reward is its logit, batched or not; it sums with
rule rewards; validation refuses what cannot be a reward; one real `grpo train` through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import Recipe, RewardConfig
from grpo_cli.rewards import resolve_reward, reward_log_name, score
from grpo_cli.rewards import reward_model as rm

from helpers import build_reward_model, cli, read_jsonl

CHAT = "<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{c}<|im_end|>\n"  # ChatML, the fixture's template


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("rms") / "tiny-rm")


def by_hand(folder: str, text: str, keep_last: int | None = None) -> float:
    """The model's own logit for one unpadded text (its last `keep_last` tokens): what the reward must equal."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][-(keep_last or 0):]])
    with torch.no_grad():
        return model(ids).logits[0, 0].item()


def test_reward_is_the_models_logit_on_its_chat_template_batched(rm_dir):
    users = ["What is 2 + 3?", "What is 10 - 4?", "What is 7 * 6?"]
    completions = ["5", "The answer is 6, because 10 - 4 = 6.", "42"]
    policy_prompts = [f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n" for u in users]
    spec = RewardConfig(name=f"model:{rm_dir}", kwargs={"batch_size": 2})  # 2 batches, padding in the first
    result = score([spec], policy_prompts, completions, [[1]] * 3, {}, user_prompts=users)
    expected = [by_hand(rm_dir, CHAT.format(u=u, c=c)) for u, c in zip(users, completions)]
    assert result.per_function["rm_tiny-rm"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert len(set(expected)) == 3  # three different texts, three different scores: the test can fail
    # loaded once per process: the same function object, one cached model
    assert resolve_reward(spec.name) is resolve_reward(spec.name)
    assert [k for k in rm._LOADED if k[0] == rm_dir] == [(rm_dir, "cpu")]
    assert not next(rm._LOADED[(rm_dir, "cpu")][1].parameters()).requires_grad


def test_without_user_prompts_or_chat_template_the_text_is_prompt_plus_completion(rm_dir, tmp_path):
    plain = build_reward_model(tmp_path / "plain-rm", chat_template=False)
    prompt, completion = "Q: What is 2 + 3?\nA:", " 5"
    for folder in (plain, rm_dir):  # rm_dir: no user_prompts given (e.g. `grpo eval`), so no chat template
        result = score([RewardConfig(name=f"model:{folder}")], [prompt], [completion], [[1]], {})
        assert list(result.per_function.values())[0] == pytest.approx([by_hand(folder, prompt + completion)], rel=1e-4)


def test_max_length_keeps_the_end_of_the_text(rm_dir):
    completion = "x " * 200 + "the end"
    result = score([RewardConfig(name=f"model:{rm_dir}", kwargs={"max_length": 16})], ["p"], [completion], [[1]], {},
                   user_prompts=["hi"])
    tail = by_hand(rm_dir, CHAT.format(u="hi", c=completion), keep_last=16)
    assert result.total == pytest.approx([tail], rel=1e-4)
    assert tail != pytest.approx(by_hand(rm_dir, CHAT.format(u="hi", c=completion), keep_last=17), rel=1e-4)


def test_sums_with_rule_rewards_and_none(rm_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules.py").write_text("def odd_none(completions, **_):\n"
                                       "    return [None if i % 2 else 1.0 for i in range(len(completions))]\n")
    specs = [RewardConfig(name=f"model:{rm_dir}", weight=2.0), RewardConfig(name="rules.py:odd_none", weight=0.5),
             RewardConfig(name="format", weight=3.0, kwargs={"pattern": "4"})]
    users, completions = ["u1", "u2"], ["4", "5"]
    result = score(specs, ["p1", "p2"], completions, [[1], [1]], {}, user_prompts=users)
    assert list(result.per_function) == ["rm_tiny-rm", "odd_none", "format"]
    r0, r1 = (by_hand(rm_dir, CHAT.format(u=u, c=c)) for u, c in zip(users, completions))
    # row 0: 2 * rm + 0.5 * 1 + 3 * 1 ; row 1: 2 * rm + (None: left out) + 3 * 0
    assert result.total == pytest.approx([2 * r0 + 3.5, 2 * r1], rel=1e-4)
    assert reward_log_name(f"model:{rm_dir}/") == "rm_tiny-rm" and reward_log_name("model:org/Skywork-RM") == "rm_Skywork-RM"


def recipe(name: str, **fields) -> dict:
    return {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
            "rewards": [{"name": "accuracy"}, {"name": name, **fields}], "train": {"max_steps": 1}}


def test_validation_reads_only_the_config(rm_dir, tmp_path):
    resolve(Recipe.model_validate(recipe(f"model:{rm_dir}", kwargs={"batch_size": 4, "max_length": 512})))
    two = build_reward_model(tmp_path / "two-labels", num_labels=2)
    causal = build_reward_model(tmp_path / "causal", causal=True)
    cases = [
        (f"model:{two}", {}, None, f"rewards.1.name: {two} has num_labels 2; a reward model gives one score per text"),
        (f"model:{causal}", {}, None, "rewards.1.name: " + causal + " is a Qwen2ForCausalLM, not a sequence-classification"),
        (f"model:{tmp_path / 'nope'}", {}, None, f"rewards.1.name: reward model folder not found: {tmp_path / 'nope'}"),
        (f"model:{rm_dir}", {"batch_sise": 2}, None, "rewards.1.kwargs.batch_sise: not a setting of a reward model (did "
                                                     "you mean 'batch_size'?); it takes: batch_size, max_length"),
        (f"model:{rm_dir}", {"max_length": 0}, None, "rewards.1.kwargs.max_length: must be an integer >= 1 (got 0)"),
        (f"model:{rm_dir}", {}, 5.0, "rewards.1.timeout_s: not supported for reward models"),
        ("model:", {}, None, "rewards.1.name: `model:` needs a folder or hub id"),
    ]
    for name, kwargs, timeout_s, message in cases:
        with pytest.raises(ValueError) as e:
            resolve(Recipe.model_validate(recipe(name, kwargs=kwargs, timeout_s=timeout_s)))
        assert message in str(e.value), (name, str(e.value))
    assert rm._LOADED.get((two, "cpu")) is None  # nothing was loaded to validate


@pytest.mark.slow
def test_train_through_the_cli_logs_the_reward_model(rm_dir, tmp_path, model_cache):
    out_dir = tmp_path / "run"
    rewards = f'rewards=[{{name: accuracy}}, {{name: "model:{rm_dir}", weight: 0.5, kwargs: {{batch_size: 4}}}}]'
    out = cli("train", "recipes/ci-tiny.yaml", rewards, "train.max_steps=2", "checkpoint.every_steps=0",
              f"logging.output_dir={out_dir}", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(isinstance(m["rewards/rm_tiny-rm/mean"], float) for m in metrics)
    rollouts = read_jsonl(out_dir / "rollouts.jsonl")
    r = rollouts[0]
    # the reward in the log is the model's logit on [user: the prompt before the policy's template, assistant: completion]
    user = r["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert r["rewards"]["rm_tiny-rm"] == pytest.approx(by_hand(rm_dir, CHAT.format(u=user, c=r["completion"])),
                                                       rel=1e-3, abs=1e-5)
    assert json.loads(json.dumps(r["rewards"]))  # plain JSON numbers
