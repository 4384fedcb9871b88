"""Tool calling in episodes (rollout.tools, issue 14): parsing `<tool_call>` blocks, running calls in children
with timeouts, errors as the tool's answer, the tools described in the prompt, a scripted policy that calls a
tool and reads its answer (token in, token out), counts, validation, and `grpo train` with tools."""

from __future__ import annotations

import time

import pytest
import torch

from grpo_cli.agents.observations import Observations
from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.agents.tools import Call, ToolBox, parse_calls
from grpo_cli.data.prompts import system_text
from grpo_cli.datatypes import PromptBatch
from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import DataConfig, Recipe, RolloutConfig
from grpo_cli.rollout.common import Samples

from helpers import ROOT, cli, read_jsonl

torch.set_num_threads(1)
TOOLS = str(ROOT / "tests/calc_tools.py")
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_parse_calls():
    calls = parse_calls(f"Let me add. {CALL} and <tool_call>\n{{\"name\": \"slow\", \"arguments\": \"{{\\\"seconds\\\": 1}}\"}}\n</tool_call>")
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 2, "b": 3}, None), ("slow", {"seconds": 1}, None)]
    bad = parse_calls("<tool_call>{name: add}</tool_call><tool_call>[1]</tool_call>"
                      '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>')
    assert [c.name for c in bad] == [None, None, "add"]
    assert bad[0].error.startswith("the tool call is not valid JSON") and "JSON object" in bad[1].error
    assert bad[2].error == "the tool call's arguments must be a JSON object"
    assert parse_calls("no call here") == [] and parse_calls("<tool_call>unclosed") == []


def test_toolbox_answers_errors_and_timeouts_concurrently():
    box = ToolBox([f"{TOOLS}:add", f"{TOOLS}:slow", f"{TOOLS}:broken"], timeout_s=2.0)
    assert [s["function"]["name"] for s in box.schemas] == ["add", "slow", "broken"]
    assert box.schemas[0]["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first number."}
    t0 = time.monotonic()
    out = box.run([Call("add", {"a": 2, "b": 3}), Call("slow", {"seconds": 30}), Call("slow", {"seconds": 30}),
                   Call("broken", {"x": 7}), Call("add", {"a": 1}), Call("mul", {}), Call(None, {}, "not JSON")])
    assert time.monotonic() - t0 < 10  # both slow calls under one 2 s deadline, killed
    assert out[0] == ("5", True)
    assert out[1] == out[2] == ("error: the tool did not answer within 2 s", False)
    assert out[3][1] is False and out[3][0].startswith("error: ValueError: broken tool got 7 (at calc_tools.py:")
    assert out[4][1] is False and "TypeError" in out[4][0] and "'b'" in out[4][0]
    assert out[5] == ("error: there is no tool 'mul'; the tools are: add, slow, broken", False)
    assert out[6] == ("error: not JSON", False)


def test_prompt_describes_the_tools():
    from transformers import AutoTokenizer

    from grpo_cli.agents.tools import schemas
    from grpo_cli.data.prompts import render_prompt
    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    tools = schemas([f"{TOOLS}:add"])
    cfg = DataConfig(generator="arithmetic", template="{prompt}", system_prompt="Be brief.")
    text = render_prompt({"prompt": "What is 2 + 3?"}, cfg, tok, tools=tools)
    # the tiny ChatML template ignores `tools`: ours goes into the system message, after the recipe's
    assert text.startswith("<|im_start|>system\nBe brief.\n\n" + system_text(tools)) and '"name": "add"' in text
    tok.chat_template = ("{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}"
                         "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    own = render_prompt({"prompt": "What is 2 + 3?"}, cfg, tok, tools=tools)
    assert own.startswith("<tools>[{") and system_text(tools) not in own  # a template that knows tools renders them


class ScriptedPolicy:
    """Stands in for the model in the tool loop: first turn a call (as `first`), then "The answer is <the last tool
    answer it can see in its context>". Token ids in, token ids out, like a backend."""

    def __init__(self, tok, first: str) -> None:
        self.tok, self.first, self.pad_id = tok, first, tok.pad_token_id
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")

    def sample(self, token_ids, budgets):
        tokens, finished = [], []
        for ids, budget in zip(token_ids, budgets):
            context = self.tok.decode(ids)
            if "<|im_start|>tool\n" not in context:
                text = self.first
            else:
                text = "The answer is " + context.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
            toks = self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos]
            tokens.append(toks[:budget])
            finished.append(len(toks) <= budget)
        return Samples(tokens, None, finished)


def runner(first: str, **rollout):
    from transformers import AutoTokenizer

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    cfg = RolloutConfig(max_completion_length=200, max_turns=3, tools=[f"{TOOLS}:add", f"{TOOLS}:broken"], **rollout)
    return EpisodeRunner(cfg, DataConfig(generator="arithmetic", template="{prompt}"), tok, ScriptedPolicy(tok, first),
                         context_limit=1024), tok


def batch(tok, n: int) -> PromptBatch:
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return PromptBatch(texts=[text] * n, input_ids=[ids] * n, columns={"answer": ["5"] * n}, indices=list(range(n)))


def test_a_call_its_answer_and_the_final_turn(model_cache):
    r, tok = runner(CALL)
    rollout, _ = r.run(batch(tok, 2), with_reward=False)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for row in range(2):
        turns = rollout.turns[row]
        assert [(t["role"], t["text"]) for t in turns] == [("assistant", CALL), ("tool", "5"), ("assistant", "The answer is 5")]
        assert turns[1]["tokens"] == Observations(tok).ids([{"role": "tool", "content": "5"}], eos)
        n = int(rollout.completion_mask[row].sum())
        assert rollout.completion_ids[row, :n].tolist() == [x for t in turns for x in t["tokens"]]
        assert rollout.observation_mask[row, :n].tolist() == [int(t["role"] == "tool") for t in turns for _ in t["tokens"]]
        assert not rollout.truncated[row]
    assert r.take_counts() == {"episodes": 2, "samples": 2, "errors": 0, "timeouts": 0, "tool_calls": 2, "tool_failures": 0}


def test_bad_calls_are_answered_and_counted(model_cache):
    two = CALL + '<tool_call>{"name": "broken", "arguments": {"x": 1}}</tool_call><tool_call>oops</tool_call>'
    r, tok = runner(two)
    rollout, _ = r.run(batch(tok, 1), with_reward=False)
    tool = rollout.turns[0][1]
    assert tool["role"] == "tool" and tool["text"].startswith("5\nerror: ValueError: broken tool got 1")
    assert "error: the tool call is not valid JSON" in tool["text"]
    assert r.take_counts()["tool_calls"] == 3 and r.take_counts() == {
        "episodes": 0, "samples": 0, "errors": 0, "timeouts": 0, "tool_calls": 0, "tool_failures": 0}  # taken: reset
    r, tok = runner(two)
    r.run(batch(tok, 1), with_reward=False)
    assert r.take_counts()["tool_failures"] == 2


def test_calls_in_the_last_turn_are_not_run_and_no_call_ends_the_episode(model_cache):
    r, tok = runner(CALL, max_episode_length=None)
    r.cfg = r.cfg.model_copy(update={"max_turns": 1})
    rollout, _ = r.run(batch(tok, 1), with_reward=False)
    assert [t["role"] for t in rollout.turns[0]] == ["assistant"] and r.take_counts()["tool_calls"] == 0
    r, tok = runner("The answer is 5")
    rollout, _ = r.run(batch(tok, 1), with_reward=False)
    assert [t["role"] for t in rollout.turns[0]] == ["assistant"]  # no call: the final answer


def test_validation_names_the_tool_entry():
    base = {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
            "rewards": [{"name": "accuracy"}], "train": {"max_steps": 1}}
    resolve(Recipe.model_validate({**base, "rollout": {"tools": [f"{TOOLS}:add"], "max_turns": 2}}))
    cases = [
        ([f"{TOOLS}:add", f"{TOOLS}:missing"], 2, "rollout.tools.1: tool"),
        ([f"{TOOLS}:no_hints"], 2, "rollout.tools.0: " + TOOLS + ":no_hints cannot be described to the model"),
        ([f"{TOOLS}:add", str(ROOT / "tests/more_tools/clash.py:add")], 2,
         "rollout.tools.1: a tool named 'add' is already rollout.tools.0"),
        ([f"{TOOLS}:add"], 1, "rollout.tools needs rollout.max_turns >= 2"),
    ]
    for tools, turns, message in cases:
        with pytest.raises(ValueError) as e:
            resolve(Recipe.model_validate({**base, "rollout": {"tools": tools, "max_turns": turns}}))
        assert message in str(e.value), (message, str(e.value))
    out = cli("validate", "recipes/ci-tiny.yaml", "rollout.tools=[tests/calc_tools.py:no_hints]", "rollout.max_turns=2",
              timeout=120)
    assert out.returncode == 2 and "rollout.tools.0:" in out.stdout + out.stderr


@pytest.mark.slow
def test_train_with_tools(turn_model, tmp_path, model_cache):
    out = cli("train", "recipes/ci-tiny.yaml", f"model.name_or_path={turn_model}", "rollout.tools=[tests/calc_tools.py:add]",
              "rollout.max_turns=2", "train.max_steps=2", f"logging.output_dir={tmp_path / 'run'}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(m["tools/call_frequency"] >= 0 and m["tools/failure_frequency"] >= 0 for m in metrics)
    assert "environment/errors" not in metrics[0]
    records = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert '"name": "add"' in records[0]["prompt"]  # the prompt describes the tool
    assert all(r["turns"][0]["role"] == "assistant" for r in records)


def test_the_shipped_calculator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calculator", ROOT / "recipes/tools/calculator.py")
    calc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calc)
    assert [calc.calculate(e) for e in ("47 * 38", "(2 + 3) / 2", "10 / 2", "-3 ** 2", "2 ** 10")] == \
        ["1786", "2.5", "5", "-9", "1024"]
    for bad in ("__import__('os')", "x + 1", "2 ** 1000", "[1, 2]"):
        with pytest.raises(ValueError):
            calc.calculate(bad)
    box = ToolBox([str(ROOT / "recipes/tools/calculator.py:calculate")], timeout_s=5.0)
    assert box.run(parse_calls('<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 34"}}</tool_call>')) \
        == [("408", True)]
