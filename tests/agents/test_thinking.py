"""Thinking models across turns (issue 37 item 4): a Qwen3-style chat template (tests/fixtures/qwen3.jinja, Qwen3's
own, as TRL ships it) drops an earlier turn's <think> block once a user turn follows, so its next turn's context is
not an extension of the episode. The template is detected and said so; episodes run on it (they raised a ValueError
before), token in, token out, keeping every sampled token."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.agents.observations import Observations
from grpo_cli.datatypes import PromptBatch
from grpo_cli.recipe.schema import DataConfig, RolloutConfig
from grpo_cli.rollout.common import Samples

from helpers import ROOT

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


def test_episodes_run_on_it_token_in_token_out_and_say_so(tok, caplog):
    cfg = RolloutConfig(max_completion_length=200, max_turns=3, environment=f"{ENVS}:Echo",
                        environment_kwargs={"turns": 3})
    with caplog.at_level(logging.WARNING):
        runner = EpisodeRunner(cfg, DataConfig(generator="arithmetic", template="{prompt}"), tok, Thinker(tok), 2048)
    assert "renders an earlier assistant turn differently once a user message follows" in caplog.text
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
