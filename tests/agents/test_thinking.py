"""Thinking models across turns (issue 37 item 4): a Qwen3-style chat template (tests/fixtures/qwen3.jinja, Qwen3's
own, as TRL ships it) drops an earlier turn's <think> block once a user turn follows, so its next turn's context is
not an extension of the episode. The template is detected and said so. By default (rollout.history_change: split)
the next turn is sampled in the template's rendering, as deployed, and trained as a new sample of the episode, every
sampled token once; `keep` stays token in, token out, keeping every sampled token in the later contexts."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.agents.observations import Observations
from grpo_cli.datatypes import PromptBatch
from grpo_cli.recipe.schema import DataConfig, RolloutConfig
from grpo_cli.rollout.common import Samples

from helpers import ROOT, cli, read_jsonl, stable, train_on_echo

torch.set_num_threads(1)
ENVS = str(ROOT / "tests/envs.py")
QWEN3 = (ROOT / "tests/fixtures/qwen3.jinja").read_text()


@pytest.fixture()
def tok(model_cache):
    from transformers import AutoTokenizer

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    chatml = tok.chat_template
    tok.chat_template = QWEN3
    yield tok
    tok.chat_template = chatml


def test_a_qwen3_template_is_detected_per_role(tok):
    assert Observations(tok).changes_history == {"user": True, "tool": False}  # tools keep the reasoning
    # enable_thinking false: the empty <think> block the generation prompt writes is dropped after any message
    assert Observations(tok, {"enable_thinking": False}).changes_history == {"user": True, "tool": True}
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert Observations(tok).text([{"role": "user", "content": "x"}], eos) == \
        "\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert Observations(tok).text([{"role": "tool", "content": "5"}], eos) == \
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_a_chatml_template_extends(model_cache):
    from transformers import AutoTokenizer

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    chatml = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    assert Observations(chatml).changes_history == {"user": False, "tool": False}


class Thinker:
    """Thinks, then answers; token ids in, token ids out."""

    def __init__(self, tok) -> None:
        self.tok, self.pad_id, self.eos = tok, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_end|>")
        self.contexts: list[str] = []

    def sample(self, token_ids, budgets, **_):
        self.contexts += [self.tok.decode(ids) for ids in token_ids]
        toks = self.tok(f"<think>\nturn {len(self.contexts)}\n</think>\n\n42", add_special_tokens=False)["input_ids"]
        return Samples([toks + [self.eos] for _ in token_ids], None, [True] * len(token_ids))


def test_keep_runs_episodes_token_in_token_out_and_says_so(tok, caplog):
    cfg = RolloutConfig(max_completion_length=200, max_turns=3, environment=f"{ENVS}:Echo",
                        environment_kwargs={"turns": 3}, history_change="keep")
    with caplog.at_level(logging.WARNING):
        runner = EpisodeRunner(cfg, DataConfig(generator="arithmetic", template="{prompt}"), tok, Thinker(tok), 2048)
    assert "renders an earlier assistant turn differently once a user message follows" in caplog.text
    assert "rollout.history_change: keep" in caplog.text
    text = tok.apply_chat_template([{"role": "user", "content": "What is 6 * 7?"}], tokenize=False,
                                   add_generation_prompt=True)
    batch = PromptBatch(texts=[text], input_ids=[tok(text, add_special_tokens=False)["input_ids"]],
                        columns={"prompt": ["What is 6 * 7?"], "answer": ["42"]}, indices=[0])
    rollout, _ = runner.run(batch, with_reward=True)
    turns = rollout.turns[0]
    assert [t["role"] for t in turns] == ["assistant", "environment"] * 2 + ["assistant"]
    n = int(rollout.completion_mask[0].sum())
    assert rollout.completion_ids[0, :n].tolist() == [x for t in turns for x in t["tokens"]]  # nothing re-encoded
    third = runner.generator.contexts[-1]
    assert "<think>\nturn 1\n</think>" in third and "<think>\nturn 2\n</think>" in third  # kept: token in, token out
    # the template itself would have dropped them: this is what a deployed model sees at the third turn
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    for t in turns[:-1]:
        messages.append({"role": "assistant" if t["role"] == "assistant" else "user",
                         "content": tok.decode(t["tokens"], skip_special_tokens=True) if t["role"] == "assistant"
                         else t["text"]})
    deployed = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<think>\nturn 1" not in deployed and "<think>\nturn 2" not in deployed and deployed != third


def deployed_contexts(tok, question: str, turns: list[dict]) -> list[str]:
    """What a deployed model is given at each turn: the template's rendering of the conversation so far (the
    assistant's answers as it wrote them, the environment's as user messages)."""
    messages, out = [{"role": "user", "content": question}], []
    for t in turns:
        if t["role"] == "assistant":
            out.append(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            messages.append({"role": "assistant", "content": t["text"]})
        else:
            messages.append({"role": "user", "content": t["text"]})
    return out


def split_episode(tok, caplog):
    cfg = RolloutConfig(max_completion_length=200, max_turns=3, environment=f"{ENVS}:Echo",
                        environment_kwargs={"turns": 3})
    assert cfg.history_change == "split"  # the default: what a deployed model sees
    with caplog.at_level(logging.WARNING):
        runner = EpisodeRunner(cfg, DataConfig(generator="arithmetic", template="{prompt}"), tok, Thinker(tok), 2048)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 6 * 7?"}], tokenize=False,
                                   add_generation_prompt=True)
    batch = PromptBatch(texts=[text], input_ids=[tok(text, add_special_tokens=False)["input_ids"]],
                        columns={"prompt": ["What is 6 * 7?"], "answer": ["42"]}, indices=[0])
    rollout, _ = runner.run(batch, with_reward=True)
    return runner, rollout


def test_split_samples_each_turn_in_the_deployed_context_and_holds_every_token_once(tok, caplog):
    runner, rollout = split_episode(tok, caplog)
    assert "trained as a new sample of the episode (rollout.history_change: split" in caplog.text
    turns = rollout.turns[0]
    assert [t["role"] for t in turns] == ["assistant", "environment"] * 2 + ["assistant"]
    deployed = deployed_contexts(tok, "What is 6 * 7?", turns)
    assert runner.generator.contexts == deployed  # every turn sampled in what a deployed model sees
    assert "<think>\nturn 1" not in deployed[2] and "<think>\nturn 2" not in deployed[2]
    sampled = [t["tokens"] for t in turns if t["role"] == "assistant"]
    n = int(rollout.completion_mask[0].sum())
    assert rollout.completion_ids[0, :n].tolist() == [x for toks in sampled for x in toks]  # each sampled token once
    assert int(rollout.observation_mask[0].sum()) == 0  # the environment's turns are in the later contexts
    ends = [len(sampled[0]), len(sampled[0]) + len(sampled[1])]
    assert rollout.segments[0] == [[ends[0], tok(deployed[1], add_special_tokens=False)["input_ids"]],
                                   [ends[1], tok(deployed[2], add_special_tokens=False)["input_ids"]]]
    assert [t.get("sample") for t in turns if t["role"] == "environment"] == [1, 2]
    assert runner.take_counts()["samples"] == 3


def test_a_split_episode_trains_as_its_samples_with_the_episode_advantage(tok, caplog, model_cache):
    from transformers import AutoModelForCausalLM

    from grpo_cli.algo.logprobs import token_logprobs
    from grpo_cli.algo.losses import trained_mask
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig
    from grpo_cli.trainer.samples import keeps_rows, training_rows

    _, rollout = split_episode(tok, caplog)
    two = rollout.cat([rollout, rollout.select([0])], tok.pad_token_id)  # and an episode split the same way
    two.segments[1] = []  # ... now unsplit: one sample, its observations in its completion
    mask = trained_mask(two, False)
    rows, adv, m = training_rows(two, torch.tensor([0.5, -0.5]), mask, SimpleNamespace(count=1))
    assert len(rows) == 4 and adv.tolist() == [0.5, 0.5, 0.5, -0.5]
    assert not keeps_rows(two, SimpleNamespace(count=1), 1)  # the update trains other rows than it was given
    unsplit = two.select([1, 1])
    unsplit.segments = [[], []]
    assert keeps_rows(unsplit, SimpleNamespace(count=1), 2)
    assert training_rows(unsplit, torch.tensor([0.5, -0.5]), mask, SimpleNamespace(count=1))[0] is unsplit
    unsplit.segments = None  # several processes: rows dealt by mini-batch are others, one mini-batch keeps them
    assert not keeps_rows(unsplit, SimpleNamespace(count=2), 2) and keeps_rows(unsplit, SimpleNamespace(count=2), 1)
    assert m.sum() == mask.sum() and m[:3].sum() == mask[0].sum()  # every trained token, once
    turns = rollout.turns[0]
    contexts = deployed_contexts(tok, "What is 6 * 7?", turns)
    sampled = [t["tokens"] for t in turns if t["role"] == "assistant"]
    for k in range(3):
        assert rows.prompt_ids[k][rows.prompt_mask[k].bool()].tolist() == tok(contexts[k], add_special_tokens=False)[
            "input_ids"]
        assert rows.completion_ids[k][rows.completion_mask[k].bool()].tolist() == sampled[k]
    assert rows.completion_ids[3][rows.completion_mask[3].bool()].tolist() == \
        two.completion_ids[1][two.completion_mask[1].bool()].tolist()  # the unsplit episode: its row as it was
    # the split rows' log-probs are each sample's own, computed alone (padding and batching change nothing)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    with torch.no_grad():
        together, _ = token_logprobs(model, rows.prompt_ids, rows.prompt_mask, rows.completion_ids,
                                     rows.completion_mask)
        for k in range(3):
            ctx = torch.tensor([tok(contexts[k], add_special_tokens=False)["input_ids"]])
            alone, _ = token_logprobs(model, ctx, torch.ones_like(ctx), torch.tensor([sampled[k]]),
                                      torch.ones(1, len(sampled[k]), dtype=torch.long))
            assert (together[k, : len(sampled[k])] - alone[0]).abs().max() < 1e-5


@pytest.fixture()
def thinking_model(turn_model, tmp_path):
    """The test's turn-ending tiny model, with Qwen3's chat template."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "thinking-model"
    shutil.copytree(turn_model, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = QWEN3
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_split_episodes_train_replay_and_resume_exactly(thinking_model, tmp_path, model_cache):
    straight = tmp_path / "straight"
    out = train_on_echo(thinking_model, straight, "logging.replay=true", "train.max_steps=3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trained as a new sample of the episode" in out.stdout + out.stderr
    metrics, records = read_jsonl(straight / "metrics.jsonl"), read_jsonl(straight / "rollouts.jsonl")
    for m in metrics:
        step = [r for r in records if r["step"] == m["step"]]
        samples = [1 + sum(t["role"] == "environment" for t in r["turns"]) for r in step]
        assert m["episodes/samples"] == pytest.approx(sum(samples) / len(samples))
        sampled = [sum(len(t["tokens"]) for t in r["turns"] if t["role"] == "assistant") for r in step]
        assert [r["length"] for r in step] == sampled and m["completions/mean_length"] == pytest.approx(
            sum(sampled) / len(sampled))
    assert max(m["episodes/samples"] for m in metrics) > 1.5  # most episodes run several turns
    saved = json.loads((straight / "replay" / "step-3" / "process-0.json").read_text())
    assert any(saved["rollout"]["segments"])  # a replay trains the same samples
    replayed = cli("replay", str(straight), "--step", "3", timeout=300)
    assert replayed.returncode == 0, replayed.stderr[-3000:]

    resumed = tmp_path / "resumed"
    assert train_on_echo(thinking_model, resumed, "logging.replay=true", "train.max_steps=2").returncode == 0
    out = train_on_echo(thinking_model, resumed, "logging.replay=true", "train.max_steps=3", "--resume", "auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(resumed / "metrics.jsonl")] == [stable(m) for m in metrics]
