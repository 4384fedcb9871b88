"""Multi-turn episodes with environments (rollout.environment, issue 14 part 1) on the hf backend: a tiny model
that ends its turns, scripted environments (tests/envs.py). Token in, token out: the episode's tokens are the
sampled tokens and the template-rendered observation tokens, nothing re-encoded; observations are masked out of
the loss and lengths; failures and timeouts are counted; records hold the turns; resume is exact."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.agents.observations import Observations
from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.datatypes import PromptBatch
from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import Recipe, RolloutConfig
from grpo_cli.rollout.hf import HFGenerator

from helpers import ROOT, cli, read_jsonl, stable, train_on_echo

torch.set_num_threads(1)
ENVS = str(ROOT / "tests/envs.py")


def runner_for(turn_model, tmp_path, **rollout):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.recipe.schema import DataConfig

    tok = AutoTokenizer.from_pretrained(turn_model)
    model = AutoModelForCausalLM.from_pretrained(turn_model)
    cfg = RolloutConfig(max_completion_length=24, **rollout)
    data = DataConfig(generator="arithmetic", template="{prompt}")
    return EpisodeRunner(cfg, data, tok, HFGenerator(model, tok, cfg), context_limit=1024), tok


def batch_of(tok, questions: list[str]) -> PromptBatch:
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions]
    return PromptBatch(texts=texts, input_ids=[tok(t, add_special_tokens=False)["input_ids"] for t in texts],
                       columns={"prompt": questions, "answer": ["7"] * len(questions)}, indices=list(range(len(texts))))


def test_episode_tokens_are_sampled_plus_template_rendered_observations(turn_model, tmp_path):
    torch.manual_seed(0)
    runner, tok = runner_for(turn_model, tmp_path, environment=f"{ENVS}:Echo", environment_kwargs={"turns": 3},
                             max_turns=3)
    rollout, columns = runner.run(batch_of(tok, ["What is 3 + 4?"] * 4), with_reward=True)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    three_turns = 0
    for r in range(len(rollout)):
        turns = rollout.turns[r]
        n = int(rollout.completion_mask[r].sum())
        ids = rollout.completion_ids[r, :n].tolist()
        # the completion is the turns' tokens in order, nothing else
        assert ids == [t for turn in turns for t in turn["tokens"]]
        observed = rollout.observation_mask[r, :n].tolist()
        assert observed == [int(turn["role"] == "environment") for turn in turns for _ in turn["tokens"]]
        assert rollout.trained_mask()[r].sum().item() == sum(len(t["tokens"]) for t in turns if t["role"] == "assistant")
        assert [t["role"] for t in turns] == ["assistant", "environment"] * (len(turns) // 2) + ["assistant"]
        for k, turn in enumerate(turns):
            if turn["role"] == "environment":  # tokenized once, as the template renders it after the turn
                assert turns[k - 1]["tokens"][-1] == eos
                assert turn["tokens"] == Observations(tok).ids([{"role": "user", "content": turn["text"]}], eos)
        # and the whole episode is what the chat template renders for the conversation
        messages = [{"role": "user", "content": "What is 3 + 4?"}]
        for turn in turns:
            text = tok.decode(turn["tokens"], skip_special_tokens=True) if turn["role"] == "assistant" else turn["text"]
            messages.append({"role": "assistant" if turn["role"] == "assistant" else "user", "content": text})
        rendered = tok.apply_chat_template(messages, tokenize=False)
        sequence = tok.decode(rollout.prompt_ids[r][rollout.prompt_mask[r].bool()].tolist() + ids)
        assert rendered.startswith(sequence) and rendered[len(sequence):] in ("", "\n")
        three_turns += sum(t["role"] == "assistant" for t in turns) == 3
        assert columns["environment_reward"][r] in (0.0, 1.0)
    assert three_turns >= 2  # the model ends its turns: most episodes run all three


def test_asynchronous_episodes_and_their_checkpointed_batches(turn_model, tmp_path):
    """rollout.max_staleness with an environment: the pipeline's worker runs the episodes; a batch in flight at a
    checkpoint comes back token for token, with its turns, observation mask, environment rewards and counts."""
    import json

    from grpo_cli.rollout.pipeline import RolloutPipeline

    torch.manual_seed(0)
    runner, tok = runner_for(turn_model, tmp_path, environment=f"{ENVS}:Echo", environment_kwargs={"turns": 3},
                             max_turns=3)
    batches = [batch_of(tok, ["What is 3 + 4?", "What is 1 + 1?"]), batch_of(tok, ["What is 2 + 2?"] * 2)]
    pipe = RolloutPipeline(runner.generator, 1, group_size=2, loaded_step=0, episodes=runner, with_reward=True)
    for b in batches:
        pipe.submit_batch(b)
    state = json.loads(json.dumps(pipe.state()))  # as a checkpoint stores it
    again = RolloutPipeline(runner.generator, 1, group_size=2, loaded_step=0, episodes=runner, with_reward=True)
    again.restore(state, lambda idx: batches[0] if idx == batches[0].indices else batches[1])
    for _ in batches:
        (b1, a, c1, n1), (b2, b, c2, n2) = pipe.next(), again.next()
        assert b1.indices == b2.indices and n1 == n2 and n1["episodes"] == 4 and c1 == c2
        assert [t["role"] for t in c1["turns"][0]][:2] == ["assistant", "environment"]
        assert all(r in (0.0, 1.0) for r in c1["environment_reward"])
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "observation_mask", "truncated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.turns == b.turns and a.completions == b.completions and a.prompts == b.prompts
    pipe.close()
    again.close()


def test_observation_text_follows_the_end_of_turn(turn_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(turn_model)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    user = [{"role": "user", "content": "hi there"}]
    assert Observations(tok).text(user, eos) == "\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    two = [{"role": "tool", "content": "4"}, {"role": "tool", "content": "9"}]
    assert Observations(tok).text(two, eos) == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>tool\n9<|im_end|>\n" \
                                               "<|im_start|>assistant\n"
    # a turn that ended on another EOS id than the template's end of turn gets the template's whole end of turn
    other = Observations(tok).text([{"role": "user", "content": "x"}], tok.convert_tokens_to_ids("a"))
    assert other.startswith("<|im_end|>\n<|im_start|>user\nx")


def test_budgets_truncate_and_reset_text_reaches_the_prompt(turn_model, tmp_path):
    torch.manual_seed(0)
    runner, tok = runner_for(turn_model, tmp_path, environment=f"{ENVS}:Echo",
                             environment_kwargs={"turns": 50, "hint": "(hint for {answer})"}, max_turns=50)
    runner.context_limit = 120
    rollout, _ = runner.run(batch_of(tok, ["What is 3 + 4?"] * 3), with_reward=False)
    for r in range(3):
        assert "What is 3 + 4?\n\n(hint for 7)" in rollout.prompts[r]
        total = int(rollout.prompt_mask[r].sum()) + int(rollout.completion_mask[r].sum())
        assert total <= 120 and bool(rollout.truncated[r])  # the context limit ended each episode
    runner.context_limit = 1024
    runner.cfg = runner.cfg.model_copy(update={"max_completion_length": 6})
    rollout, _ = runner.run(batch_of(tok, ["What is 3 + 4?"] * 3), with_reward=False)
    assert all(rollout.trained_mask()[r].sum() <= 6 for r in range(3)) and rollout.truncated.all()


def test_failures_and_timeouts_end_the_episode_and_are_counted(turn_model, tmp_path, caplog):
    torch.manual_seed(0)
    runner, tok = runner_for(turn_model, tmp_path, environment=f"{ENVS}:Flaky",
                             environment_kwargs={"raise_on_second": True}, max_turns=4)
    rollout, _ = runner.run(batch_of(tok, ["What is 3 + 4?"] * 3), with_reward=False)
    second = sum(sum(t["role"] == "assistant" for t in turns) >= 2 for turns in rollout.turns)
    assert runner.take_counts() == {"episodes": 3, "samples": 3, "errors": second, "timeouts": 0, "tool_calls": 0, "tool_failures": 0}
    assert second >= 1
    assert "the environment broke" in caplog.text and "envs.py" in caplog.text
    assert all(sum(t["role"] == "assistant" for t in turns) <= 2 for turns in rollout.turns)

    runner, tok = runner_for(turn_model, tmp_path, environment=f"{ENVS}:Flaky",
                             environment_kwargs={"hang_on_second": True}, max_turns=4, environment_timeout_s=2.0)
    import time

    t0 = time.monotonic()
    rollout, _ = runner.run(batch_of(tok, ["What is 3 + 4?"] * 3), with_reward=False)
    second = sum(sum(t["role"] == "assistant" for t in turns) >= 2 for turns in rollout.turns)
    assert runner.take_counts() == {"episodes": 3, "samples": 3, "errors": 0, "timeouts": second, "tool_calls": 0, "tool_failures": 0}
    assert second >= 1
    assert time.monotonic() - t0 < 30  # all three hung at once, under one deadline, and were killed


def test_validation_refuses_bad_environments():
    base = {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
            "rewards": [{"name": "accuracy"}], "train": {"max_steps": 1}}
    resolve(Recipe.model_validate({**base, "rollout": {"environment": f"{ENVS}:Echo", "max_turns": 2}}))
    asynchronous = {"environment": f"{ENVS}:Echo", "backend": "vllm", "vllm": {"mode": "server"}, "max_staleness": 1}
    assert resolve(Recipe.model_validate({**base, "rollout": asynchronous})).recipe.rollout.max_staleness == 1
    cases = [
        ({"environment": f"{ENVS}:Missing"}, "rollout.environment: environment"),
        ({"environment": f"{ENVS}:NoStep"}, "rollout.environment: " + ENVS + ":NoStep has no method step"),
        ({"environment": f"{ENVS}:not_a_class"}, "is a function, not a class"),
        ({"environment": f"{ENVS}:Echo", "environment_kwargs": {"turnz": 2}}, "rollout.environment_kwargs: Echo"),
        ({"max_turns": 2}, "rollout.max_turns (2) needs rollout.environment"),
    ]
    for rollout, message in cases:
        with pytest.raises(ValueError) as e:
            resolve(Recipe.model_validate({**base, "rollout": rollout}))
        assert message in str(e.value), (message, str(e.value))
    with pytest.raises(ValueError, match="rewards.0.name: the reward `environment` needs rollout.environment"):
        resolve(Recipe.model_validate({**base, "rewards": [{"name": "environment"}]}))
    with pytest.raises(ValueError, match="has no method reward"):
        resolve(Recipe.model_validate({**base, "rewards": [{"name": "environment"}],
                                       "rollout": {"environment": f"{ENVS}:NoReward"}}))


def test_cli_validate_exits_2_naming_the_entry():
    out = cli("validate", "recipes/ci-tiny.yaml", "rollout.environment=tests/envs.py:NoStep", timeout=120)
    assert out.returncode == 2 and "rollout.environment:" in out.stdout + out.stderr and "has no method step" in \
        out.stdout + out.stderr


@pytest.mark.slow
def test_train_on_episodes_logs_turns_and_resumes_exactly(turn_model, tmp_path, model_cache):
    straight = tmp_path / "straight"
    out = train_on_echo(turn_model, straight, "train.max_steps=4")
    assert out.returncode == 0, out.stderr[-3000:]
    metrics, records = read_jsonl(straight / "metrics.jsonl"), read_jsonl(straight / "rollouts.jsonl")
    assert len(records) == 4 * 8
    for m in metrics:
        step = [r for r in records if r["step"] == m["step"]]
        sampled = [sum(len(t["tokens"]) for t in r["turns"] if t["role"] == "assistant") for r in step]
        assert [r["length"] for r in step] == sampled  # lengths count sampled tokens only
        assert m["completions/mean_length"] == pytest.approx(sum(sampled) / len(sampled))
        turns = [sum(t["role"] == "assistant" for t in r["turns"]) for r in step]
        assert m["turns/mean"] == pytest.approx(sum(turns) / len(turns)) and m["turns/max"] == max(turns)
        assert m["environment/errors"] == 0 and m["environment/timeouts"] == 0
        assert all(r["rewards"]["environment"] in (0.0, 1.0) for r in step)
    assert max(m["turns/max"] for m in metrics) == 3
    r = records[0]
    assert {t["role"] for t in r["turns"]} <= {"assistant", "environment"} and all(
        set(t) == {"role", "text", "tokens"} for t in r["turns"])

    shown = cli("inspect-rollouts", str(straight), "--step", "1", "--format", "markdown", timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    env_turn = next(t for r in records if r["step"] == 1 for t in r["turns"] if t["role"] == "environment")
    assert f"[environment] {env_turn['text']}" in shown.stdout and "[assistant] " in shown.stdout

    evaluated = cli("eval", str(straight), "--limit", "4", "-n", "2", "-o", str(tmp_path / "eval"), timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    samples = read_jsonl(tmp_path / "eval" / "samples.jsonl")
    assert len(samples) == 4 * 3 and all(s["turns"][0]["role"] == "assistant" for s in samples)
    assert any(t["role"] == "environment" for s in samples for t in s["turns"])  # episodes, as in training
    assert all(s["rewards"]["environment"] in (0.0, 1.0) for s in samples if s["kind"] == "greedy")

    resumed = tmp_path / "resumed"
    assert train_on_echo(turn_model, resumed, "train.max_steps=2").returncode == 0
    out = train_on_echo(turn_model, resumed, "train.max_steps=4", "--resume", "auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(resumed / "metrics.jsonl")] == [stable(m) for m in metrics]
    assert [x["turns"] for x in read_jsonl(resumed / "rollouts.jsonl")] == [x["turns"] for x in records]


@pytest.mark.slow
def test_the_shipped_guessing_game_trains(turn_model, tmp_path, model_cache):
    out = cli("train", "recipes/guess-number.yaml", f"model.name_or_path={turn_model}", "model.gguf_file=null",
              "train.max_steps=1", "train.prompts_per_step=1", "train.micro_batch_size=8", "train.threads=1",
              "rollout.max_completion_length=16", f"logging.output_dir={tmp_path / 'guess'}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (m,) = read_jsonl(tmp_path / "guess" / "metrics.jsonl")
    assert m["environment/errors"] == 0 and m["environment/timeouts"] == 0 and m["turns/max"] >= 2
    records = read_jsonl(tmp_path / "guess" / "rollouts.jsonl")
    said = {t["text"] for r in records for t in r["turns"] if t["role"] == "environment"}
    assert said <= {"Answer with a number.", "Higher.", "Lower.", "Correct!"} and said
    assert all(r["rewards"]["environment"] is not None for r in records)


def test_guessing_game_rules():
    import importlib.util

    spec = importlib.util.spec_from_file_location("guess", ROOT / "recipes/envs/guess_number.py")
    guess = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guess)
    env = guess.GuessTheNumber()
    assert "higher or lower" in env.reset({"answer": "12"})
    assert env.step("hmm") == ("Answer with a number.", False)
    assert env.step("It is 10") == ("Higher.", False) and env.step("15?") == ("Lower.", False)
    assert env.step("so 12") == ("Correct!", True) and env.reward() == pytest.approx(0.8)  # 3 guesses: 1 - 2 x 0.1
    fresh = guess.GuessTheNumber()
    fresh.reset({"answer": 3})
    assert fresh.step("4") == ("Lower.", False) and fresh.reward() == 0.0
