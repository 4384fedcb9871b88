"""TRL's environment contract (issue 37 item 1), accepted as TRL writes it: public methods are tools, reset(**columns)
returns the prompt (no data section needed), get_reward() is the reward, several classes routed by a row's
`environment` column with only their own tools. Scripted policies call the tools; a real run trains the recipe."""

from __future__ import annotations

import re

import pytest
import torch

from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.datatypes import PromptBatch
from grpo_cli.errors import DataError
from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import Recipe
from grpo_cli.rollout.common import Samples

from helpers import ROOT, cli, read_jsonl

torch.set_num_threads(1)
ENVS = str(ROOT / "tests/trl_envs.py")
BASE = {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "train": {"max_steps": 1}}


class CallingPolicy:
    """Calls the first tool its prompt describes (increment: by the number in the user's message; run_code; move:
    `action`), then, after a tool answer, says "done". Token ids in, token ids out, like a backend."""

    def __init__(self, tok, action: str = "up") -> None:
        self.tok, self.action, self.pad_id = tok, action, tok.pad_token_id
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")
        self.contexts: list[str] = []

    def call(self, context: str) -> str:
        user = context.rsplit("<|im_start|>user\n", 1)[1]
        for name, args in (("increment", {"step": int((re.findall(r"\d+", user) or ["1"])[0])}),
                           ("run_code", {"code": "print(13)"}), ("move", {"action": self.action})):
            if f'"name": "{name}"' in context.split("<|im_start|>user")[0]:
                return '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, str(args).replace("'", '"'))
        return "no tool"

    def sample(self, token_ids, budgets):
        tokens, finished = [], []
        for ids, budget in zip(token_ids, budgets):
            context = self.tok.decode(ids)
            self.contexts.append(context)
            text = "done" if "<|im_start|>tool\n" in context else self.call(context)
            toks = self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos]
            tokens.append(toks[:budget])
            finished.append(len(toks) <= budget)
        return Samples(tokens, None, finished)


def setup(raw: dict, action: str = "up"):
    from transformers import AutoTokenizer

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    recipe = Recipe.model_validate({**BASE, **raw})
    resolve(recipe)
    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    policy = CallingPolicy(tok, action)
    return EpisodeRunner(recipe.rollout, recipe.data, tok, policy, context_limit=1024), tok, recipe


def rows_batch(tok, recipe, columns: dict[str, list]) -> PromptBatch:
    from grpo_cli.data.prompts import encode_prompts, render_prompt

    n = len(next(iter(columns.values())))
    rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    texts = [render_prompt(r, recipe.data, tok) for r in rows]
    return PromptBatch(texts=texts, input_ids=encode_prompts(texts, tok, None), columns=columns, indices=list(range(n)))


def test_no_data_and_no_rewards_the_environment_owns_both():
    recipe = Recipe.model_validate({**BASE, "rollout": {"environment": str(ROOT / "recipes/envs/increment.py:IncrementEnv"),
                                                        "max_turns": 2}})
    assert recipe.data.generator == "blank" and [r.name for r in recipe.rewards] == ["environment"]
    spec = resolve(recipe).environments[None]
    assert (spec.api, spec.tools, spec.reward_method) == ("tools", ("increment",), "get_reward")
    assert spec.schemas[0]["function"]["parameters"]["properties"]["step"]["type"] == "integer"
    with pytest.raises(ValueError, match=r"data\n  Field required"):  # without an environment, data is required
        Recipe.model_validate({**BASE, "rewards": [{"name": "accuracy"}]})


def test_self_sampling_environment_writes_the_prompt_and_scores_itself(model_cache):
    r, tok, recipe = setup({"rollout": {"environment": str(ROOT / "recipes/envs/increment.py:IncrementEnv"),
                                        "max_turns": 2}})
    rollout, columns = r.run(rows_batch(tok, recipe, {"prompt": [""] * 4}), with_reward=True)
    for i in range(4):
        target = int(re.search(r"Increment the counter by (\d)\.", rollout.prompts[i]).group(1))
        assert rollout.prompts[i].endswith(f"<|im_start|>user\nIncrement the counter by {target}.<|im_end|>\n"
                                           "<|im_start|>assistant\n")  # reset's text is the whole user message
        assert '"name": "increment"' in rollout.prompts[i]  # its method, described as a tool
        roles = [(t["role"], t["text"]) for t in rollout.turns[i]]
        assert roles == [("assistant", '<tool_call>{"name": "increment", "arguments": {"step": %d}}</tool_call>' % target),
                         ("tool", str(target)), ("assistant", "done")]
    assert columns["environment_reward"] == [1.0] * 4  # get_reward: the counter reached the target
    assert r.take_counts() == {"episodes": 4, "samples": 4, "errors": 0, "timeouts": 0, "tool_calls": 4, "tool_failures": 0}


def test_dataset_columns_reach_reset_as_keywords(model_cache):
    r, tok, recipe = setup({"data": {"generator": "arithmetic"},  # the rows below stand in for a dataset
                            "rewards": [{"name": "environment"}],
                            "rollout": {"environment": f"{ENVS}:IncrementEnv", "max_turns": 3}})
    batch = rows_batch(tok, recipe, {"prompt": ["Increment the counter to 3.", "Increment the counter to 5."],
                                     "target": [3, 4], "level": ["a", "b"]})
    rollout, columns = r.run(batch, with_reward=True)
    assert columns["environment_reward"] == [1.0, 0.0]  # the second row's target is 4, the prompt says 5
    assert [t["text"] for t in rollout.turns[1]][1] == "5"


def test_routed_environments_each_with_only_its_tools(model_cache):
    raw = {"data": {"generator": "arithmetic", "prompt_column": None},
           "rewards": [{"name": "environment"}],
           "rollout": {"environment": {"coding": f"{ENVS}:CodingEnv", "game": f"{ENVS}:GameEnv"}, "max_turns": 2}}
    r, tok, recipe = setup(raw)
    routes = ["coding", "game", "game", "coding"]
    rollout, columns = r.run(rows_batch(tok, recipe, {"environment": routes}), with_reward=True)
    for i, route in enumerate(routes):
        own, other = ("run_code", "move") if route == "coding" else ("move", "run_code")
        assert f'"name": "{own}"' in rollout.prompts[i] and f'"name": "{other}"' not in rollout.prompts[i]
        first = "Compute the 7th Fibonacci number." if route == "coding" else "Reach the goal tile."
        assert f"<|im_start|>user\n{first}<|im_end|>" in rollout.prompts[i]
        assert rollout.turns[i][1]["text"] == ("13" if route == "coding" else "moved up")
    assert columns["environment_reward"] == [1.0, None, None, 1.0]  # GameEnv owns no reward: None, as in TRL
    with pytest.raises(DataError, match=r"a row's 'environment' is 'chess', which is not a route"):
        r.run(rows_batch(tok, recipe, {"environment": ["chess"]}), with_reward=True)


def test_a_method_that_raises_is_answered_and_one_that_hangs_ends_the_episode(model_cache):
    raw = {"data": {"generator": "arithmetic", "prompt_column": None},
           "rewards": [{"name": "environment"}],
           "rollout": {"environment": {"game": f"{ENVS}:GameEnv", "coding": f"{ENVS}:CodingEnv"}, "max_turns": 3,
                       "environment_timeout_s": 2}}
    r, tok, recipe = setup(raw, action="sideways")
    rollout, _ = r.run(rows_batch(tok, recipe, {"environment": ["game"]}), with_reward=True)
    assert rollout.turns[0][1]["text"].startswith("error: move raised ValueError: unknown action 'sideways'")
    assert [t["role"] for t in rollout.turns[0]] == ["assistant", "tool", "assistant"]  # the episode went on
    assert r.take_counts() == {"episodes": 1, "samples": 1, "errors": 0, "timeouts": 0, "tool_calls": 1, "tool_failures": 1}
    r, tok, recipe = setup(raw, action="down")
    rollout, columns = r.run(rows_batch(tok, recipe, {"environment": ["game", "coding"]}), with_reward=True)
    assert [t["role"] for t in rollout.turns[0]] == ["assistant"] and columns["environment_reward"] == [None, 1.0]
    assert r.take_counts()["timeouts"] == 1


@pytest.mark.parametrize("timeout", [None, 5])
def test_an_environment_that_cannot_run_stops_the_run(timeout, model_cache):
    from grpo_cli.errors import EnvironmentUnavailable

    r, tok, recipe = setup({"rewards": [{"name": "format"}], "rollout": {
        "environment": f"{ENVS}:Unavailable", "max_turns": 2, "environment_timeout_s": timeout}})
    with pytest.raises(EnvironmentUnavailable, match="Unavailable: no room for another session"):
        r.run(rows_batch(tok, recipe, {"prompt": [""] * 2}), with_reward=True)


def test_validation_names_the_field():
    env = f"{ENVS}:IncrementEnv"
    cases = [
        ({"environment": env, "max_turns": 1}, "rollout.max_turns (1): " + env + "'s methods are tools"),
        ({"environment": f"{ENVS}:Undescribed", "max_turns": 2},
         "rollout.environment: Undescribed.poke is a public method, so a tool (TRL's contract)"),
        ({"environment": {"a": env, "b": f"{ENVS}:Missing"}, "max_turns": 2}, "rollout.environment.b: environment"),
        ({"environment": {"a": env}, "environment_kwargs": {"c": {}}, "max_turns": 2},
         "rollout.environment_kwargs.c: not a route of rollout.environment (a)"),
        ({"environment": {"a": env}, "environment_kwargs": {"a": {"size": 3}}, "max_turns": 2},
         "rollout.environment_kwargs.a: IncrementEnv() does not take {'size': 3}"),
        ({"environment": env, "tools": [str(ROOT / "tests/more_tools/increment.py:increment")], "max_turns": 2},
         "rollout.environment: its method increment is a tool, and rollout.tools.0 has that name too"),
    ]
    for rollout, message in cases:
        with pytest.raises(ValueError) as e:
            resolve(Recipe.model_validate({**BASE, "rollout": rollout}))
        assert message in str(e.value), (message, str(e.value))
    out = cli("validate", "recipes/trl-increment.yaml", "rollout.max_turns=1", timeout=120)
    assert out.returncode == 2 and "rollout.max_turns (1)" in out.stdout + out.stderr


@pytest.mark.slow
def test_train_trl_recipe_without_data_or_rewards(tmp_path, model_cache):
    out = cli("train", "recipes/trl-increment.yaml", "train.max_steps=2", f"logging.output_dir={tmp_path / 'run'}",
              timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rewards/environment/mean"] >= 0 and "tools/call_frequency" in m for m in metrics)
    records = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert all(re.search(r"user\nIncrement the counter by [1-6]\.<\|im_end\|>", r["prompt"]) for r in records)


def test_a_staticmethod_is_a_tool_with_all_its_arguments():
    from grpo_cli.agents.environments import method_schema, tool_methods

    class Env:
        def reset(self, **kwargs) -> None:
            return None

        @staticmethod
        def add(a: int, b: int) -> int:
            """Add two numbers.

            Args:
                a: The first.
                b: The second.
            """
            return a + b

    assert tool_methods(Env) == ["add"]
    assert method_schema(Env, "add")["function"]["parameters"]["required"] == ["a", "b"]  # no `self` to drop
