"""verifiers environments trained unchanged (issue 37 item 2): two tasksets written as verifiers (0.4.0, v1)
tasksets are, a single-turn one with a rubric and a multi-turn Env, run by verifiers itself (its Env, its null chat
harness in a local subprocess, its rewards) against grpo's OpenAI-compatible endpoint (rollout.agent: verifiers:...)."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.agents.programs import AgentRunner
from grpo_cli.datatypes import PromptBatch
from grpo_cli.preflight import resolve
from grpo_cli.recipe.files import load_recipe
from grpo_cli.recipe.schema import Recipe

from helpers import ROOT, cli, read_jsonl

pytest.importorskip("verifiers")
torch.set_num_threads(1)
REVERSE = f"verifiers:{ROOT}/recipes/verifiers/vf_reverse_letters.py"
GUESS = f"verifiers:{ROOT}/recipes/verifiers/vf_guess_number.py"


def test_the_tasksets_tasks_are_the_rows_and_a_bad_taskset_names_the_field():
    recipe = load_recipe("recipes/verifiers-guess.yaml")
    assert recipe.data.generator == "verifiers" and [r.name for r in recipe.rewards] == ["environment"]
    assert recipe.data.generator_kwargs == {"taskset": str(ROOT / "recipes/verifiers/vf_guess_number.py"),
                                            "taskset_config": {"size": 32, "high": 6}}
    resolve(recipe)
    from grpo_cli.data.sources import load_rows

    rows = load_rows(recipe.data, 0)
    assert len(rows) == 32 and rows[3] == {"task": 3, "prompt": "The number is from 1 to 6. Your guess?"}
    base = {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "train": {"max_steps": 1}}
    for agent, kwargs, said in ((f"{REVERSE[:-3]}_missing.py", {}, "rollout.agent: verifiers taskset"),
                                (REVERSE, {"taskset_config": {"sise": 3}}, "rollout.agent: verifiers taskset")):
        with pytest.raises(ValueError, match=said):
            resolve(Recipe.model_validate({**base, "data": {"generator": "arithmetic"},
                                           "rollout": {"agent": agent, "agent_kwargs": kwargs}}))


def run(turn_model, agent: str, config: dict, tasks: list[int], **rollout):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.rollout.hf import HFGenerator

    tok, model = AutoTokenizer.from_pretrained(turn_model), AutoModelForCausalLM.from_pretrained(turn_model)
    recipe = Recipe.model_validate({"name": "t", "model": {"name_or_path": turn_model}, "train": {"max_steps": 1},
                                    "rollout": {"agent": agent, "agent_kwargs": {"taskset_config": config}, **rollout}})
    runner = AgentRunner(recipe.rollout, recipe.data, tok, HFGenerator(model, tok, recipe.rollout), 1024)
    texts = [tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)] * len(tasks)
    batch = PromptBatch(texts=texts, input_ids=[tok(t)["input_ids"] for t in texts],
                        columns={"task": tasks, "prompt": ["x"] * len(tasks)}, indices=list(range(len(tasks))))
    try:
        return runner.run(batch, with_reward=True), runner.take_counts()
    finally:
        runner.close()


def test_a_single_turn_taskset_with_its_rubric(turn_model):
    torch.manual_seed(0)
    (rollout, columns), counts = run(turn_model, REVERSE, {"size": 8}, [0, 0, 5], max_turns=1,
                                     max_completion_length=16)
    assert counts["errors"] == 0 == counts["timeouts"] and counts["rewrites"] == 0
    from grpo_cli.data.tasksets import load_taskset

    words = [t.data.prompt for t in load_taskset(REVERSE.removeprefix("verifiers:"), {"size": 8})]
    for i, task in enumerate([0, 0, 5]):
        assert rollout.prompts[i].startswith("<|im_start|>system\nReverse the word") and words[task] in rollout.prompts[i]
        assert [t["role"] for t in rollout.turns[i]] == ["assistant"]
        from difflib import SequenceMatcher

        said = rollout.turns[i][0]["text"].strip()
        assert columns["environment_reward"][i] == pytest.approx(SequenceMatcher(None, said, words[task][::-1]).ratio())


def test_a_multi_turn_environment(turn_model):
    torch.manual_seed(0)
    (rollout, columns), counts = run(turn_model, GUESS, {"size": 4, "high": 6}, [0, 1, 2], max_turns=4,
                                     max_completion_length=40)
    assert counts["errors"] == 0 == counts["timeouts"] and counts["rewrites"] == 0  # verifiers' history extends ours
    roles = [[t["role"] for t in turns] for turns in rollout.turns]
    assert max(r.count("assistant") for r in roles) >= 2
    hints = [t["text"] for turns in rollout.turns for t in turns if t["role"] != "assistant"]
    assert hints and set(hints) <= {"Higher.", "Lower.", "Answer with a number."}
    assert all(r in (0.0, 1.0) for r in columns["environment_reward"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["verifiers-reverse", "verifiers-guess"])
def test_train_a_verifiers_recipe(recipe, turn_model, tmp_path, model_cache):
    # 2 steps of 1 task x 2 episodes: verifiers prepares each episode's harness process (~7 s on 2 cores)
    out = cli("train", f"recipes/{recipe}.yaml", f"model.name_or_path={turn_model}", "train.max_steps=2",
              "train.prompts_per_step=1", "algorithm.num_generations=2", "train.micro_batch_size=2",
              f"logging.output_dir={tmp_path / 'run'}", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["agent/errors"] == 0 == m["agent/timeouts"] and "rewards/environment/mean" in m for m in metrics)
