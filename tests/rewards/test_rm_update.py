"""Reward-model updates with replay (DeepSeekMath Algorithm 1, last line; grpo_cli/rewards/rm_update.py):
the losses, accuracies and replay arithmetic against hand-worked numbers; a tiny reward model that learns a rule
from labelled groups, with replay drawn from earlier periods; `grpo train` with an updated reward model whose
rewards change after the first update, checkpointed, and resumed to the same numbers; validation."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_cli.recipe.schema import Recipe, RewardConfig
from grpo_cli.rewards import reward_model as rm
from grpo_cli.rewards import score
from grpo_cli.rewards.rm_update import (
    RewardModelUpdater,
    correct_count,
    holdout_count,
    ordered_pairs,
    pairwise_loss,
    pointwise_loss,
    replay_count,
    step_groups,
)

from helpers import build_reward_model, cli, read_jsonl, stable

torch.set_num_threads(1)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_losses_accuracies_and_counts_by_hand():
    scores = torch.tensor([2.0, -1.0, 0.5])
    # BCE(x, 1) = log(1 + e^-x), BCE(x, 0) = log(1 + e^x)
    expected = (softplus(-2.0) + softplus(-1.0) + softplus(-0.5)) / 3
    assert pointwise_loss(scores, torch.tensor([1.0, 0.0, 1.0])).item() == pytest.approx(expected, rel=1e-6)
    assert pointwise_loss(scores, torch.tensor([1.0, 0.0, 1.0])).item() == pytest.approx(0.304756, abs=1e-6)
    # a soft label: y log sigma(x) + (1 - y) log(1 - sigma(x)) at y = 0.25, x = 2
    soft = 0.25 * softplus(-2.0) + 0.75 * softplus(2.0)
    assert pointwise_loss(torch.tensor([2.0]), torch.tensor([0.25])).item() == pytest.approx(soft, rel=1e-6)

    assert ordered_pairs([1, 0, 1]) == [(0, 1), (2, 1)]
    assert ordered_pairs([0.5, 0.5]) == [] and ordered_pairs([0.2, 0.7, 0.1]) == [(0, 2), (1, 0), (1, 2)]
    # groups [1, 0, 1] and [0, 0]: pairs (0, 1), (2, 1) of the first; none in the second
    s = torch.tensor([2.0, -1.0, 0.5, 3.0, 4.0])
    assert pairwise_loss(s, [[1, 0, 1], [0, 0]]).item() == pytest.approx((softplus(-3.0) + softplus(-1.5)) / 2, rel=1e-6)
    assert pairwise_loss(s, [[1, 0, 1], [0, 0]]).item() == pytest.approx(0.125000, abs=1e-5)
    assert pairwise_loss(torch.tensor([1.0, 2.0]), [[1, 1]]) is None

    assert correct_count("pointwise", [2.0, -1.0, -0.5], [[1, 0, 1]]) == (2, 3)
    assert correct_count("pointwise", [0.1, -0.1], [[0.5], [0.4]]) == (2, 2)  # label >= 0.5 is "correct"
    assert correct_count("pairwise", [2.0, -1.0, -3.0], [[1, 0, 1]]) == (1, 2)
    assert correct_count("pairwise", [1.0, 1.0], [[1, 0]]) == (0, 1)  # a tie is not an order

    assert [replay_count(9, 0.1, 100), replay_count(18, 0.1, 100), replay_count(9, 0.1, 0), replay_count(10, 0.5, 3)] \
        == [1, 2, 0, 3]
    assert [holdout_count(8, 0.1), holdout_count(1, 0.5), holdout_count(4, 0.0), holdout_count(3, 0.9)] == [1, 0, 0, 2]
    groups = step_groups(["p"] * 4, ["u"] * 4, ["a", "b", "c", "d"], [1.0, None, 0.0, 1.0], 2)
    assert [[s["completion"] for s in g] for g in groups] == [["a", "b"], ["c", "d"]]


@pytest.fixture()
def fresh_rm(tmp_path):
    folder = build_reward_model(tmp_path / "tiny-rm")
    yield folder
    rm._LOADED.pop((folder, "cpu"), None)


def period(k: int, n_groups: int = 6, size: int = 4) -> list[list[dict]]:
    """Labelled groups, half and half: a completion spelled in letters is right (1), one with digits is wrong (0) (the
    random model happens to score digits higher: it starts wrong)."""
    out = []
    for g in range(n_groups):
        rows = []
        for j in range(size):
            digits = j % 2 == 0
            text = f"the answer is {7 * k + 3 * g + j}" if digits else "the answer is " + "xyzw"[j] * (1 + (g + k) % 3)
            rows.append({"prompt": f"Q{k}.{g}: ", "user": f"What is {k} + {g}?", "completion": text,
                         "label": 0.0 if digits else 1.0})
        out.append(rows)
    return out


@pytest.mark.parametrize("objective", ["pointwise", "pairwise"])
def test_updates_learn_the_labels_with_replay_from_earlier_periods(fresh_rm, objective):
    spec = RewardConfig(name=f"model:{fresh_rm}", update={"every_steps": 2, "objective": objective, "epochs": 4,
                                                          "learning_rate": 3e-3, "batch_size": 8, "replay_fraction": 0.25,
                                                          "holdout_fraction": 0.2})
    u = RewardModelUpdater(0, spec, label_index=1, log_name="rm_tiny-rm", seed=0)
    name, text = spec.name, ("Q0.0: ", "What is 0 + 0?", "the answer is 12")
    before = score([spec], [text[0]], [text[2]], [[1]], {}, user_prompts=[text[1]]).total[0]
    runs = []
    for k in range(4):
        u.record(period(2 * k)[:3])  # a period of two steps, three groups each
        assert not u.due(2 * k + 1)
        u.record(period(2 * k + 1)[:3])
        assert u.due(2 * k + 2)
        runs.append(u.update(2 * k + 2))
        assert u.pending == []
    p = "reward_model/rm_tiny-rm/"
    # 6 groups a period: ceil(0.2 x 6) = 2 held back, 4 trained; replay 4 x 0.25 / 0.75 = 1.33 -> 1 (none at first)
    assert [r[p + "held_out_groups"] for r in runs] == [2, 2, 2, 2]
    assert [r[p + "trained_groups"] for r in runs] == [4, 4, 4, 4]
    assert [r[p + "replayed_groups"] for r in runs] == [0, 1, 1, 1]
    assert [r[p + "buffer_groups"] for r in runs] == [4, 8, 12, 16] and u.updates == 4
    # it learns: accuracy on each new period before training on it ends high, and above where it began
    acc = [r[p + "accuracy_before"] for r in runs]
    assert acc[-1] >= 0.9 and acc[-1] > acc[0], acc
    assert runs[-1][p + "accuracy"] >= 0.9 and runs[-1][p + "loss"] < runs[0][p + "loss"]
    # the reward is the updated model's score
    after = score([spec], [text[0]], [text[2]], [[1]], {}, user_prompts=[text[1]]).total[0]
    assert after != pytest.approx(before, abs=1e-3)
    assert not any(q.requires_grad for q in rm.loaded(name)[1].parameters())  # scoring stays without autograd
    # a second updater restored from the first's state continues with the same buffer and weights
    twin = RewardModelUpdater(0, spec, label_index=1, log_name="rm_tiny-rm", seed=0)
    twin.load_state_dict(u.state_dict(), u.tensors())
    assert twin.buffer == u.buffer and twin.updates == 4


def test_pointwise_refuses_labels_outside_0_1(fresh_rm):
    spec = RewardConfig(name=f"model:{fresh_rm}", update={"every_steps": 1})
    u = RewardModelUpdater(1, spec, label_index=0, log_name="rm", seed=0)
    from grpo_cli.errors import RewardError

    with pytest.raises(RewardError, match=r"rewards\[1\].update: objective pointwise needs labels in \[0, 1\].*2.5"):
        u.record([[{"prompt": "p", "user": None, "completion": "c", "label": 2.5}]])
    RewardModelUpdater(1, spec.model_copy(update={"update": spec.update.model_copy(update={"objective": "pairwise"})}),
                       label_index=0, log_name="rm", seed=0).record([[{"prompt": "p", "user": None, "completion": "c",
                                                                        "label": 2.5}]])


def recipe(rewards: list[dict]) -> dict:
    return {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
            "rewards": rewards, "train": {"max_steps": 1}}


def test_validation_names_the_field(fresh_rm):
    model = {"name": f"model:{fresh_rm}", "update": {"every_steps": 2}}
    Recipe.model_validate(recipe([{"name": "accuracy"}, model]))  # the one verifiable reward labels
    cases = [
        ([{"name": "accuracy", "update": {"every_steps": 2}}],
         "rewards.0.update: only a reward model (name: model:PATH) is trained during the run"),
        ([{"name": "accuracy"}, {"name": "format"}, model], "rewards.2.update.label: name the verifiable reward"),
        ([model], "rewards.0.update.label: name the verifiable reward that labels the reward model's samples "
                  "(outcome rewards that are not reward models: none)"),
        ([{"name": "accuracy"}, {**model, "update": {"every_steps": 2, "label": "acuracy"}}],
         "rewards.1.update.label: 'acuracy' is neither the name of a reward in this recipe nor the name one is "
         "logged under (accuracy, rm_tiny-rm)"),
        ([{"name": "accuracy"}, {**model, "update": {"every_steps": 2, "label": model["name"]}}],
         "rewards.1.update.label: " + repr(model["name"]) + " is a reward model or step-level"),
        ([{"name": "accuracy"}, {**model, "update": {"every_steps": 0}}], "rewards.1.update.every_steps"),
        ([{"name": "accuracy"}, {**model, "update": {"every_steps": 2, "replay_fraction": 1.0}}],
         "rewards.1.update.replay_fraction"),
    ]
    for rewards, message in cases:
        with pytest.raises(ValueError) as e:
            Recipe.model_validate(recipe(rewards))
        assert message in str(e.value), (message, str(e.value))
    ok = Recipe.model_validate(recipe([{"name": "accuracy"}, {"name": "format"},
                                       {**model, "update": {"every_steps": 2, "label": "format"}}]))
    assert ok.rewards[2].update.label == "format"
    with_file = recipe([{"name": "accuracy"}, {"name": "tests/signal_rewards.py:digit_steps", "level": "step"},
                        {"name": "recipes/rewards/toy.py:digit_fraction"},
                        {**model, "update": {"every_steps": 2, "label": "digit_fraction"}}])  # by its log name
    Recipe.model_validate(with_file)


def test_cli_exits_2_naming_the_field(tmp_path):
    out = cli("validate", "recipes/ci-tiny.yaml", "rewards=[{name: accuracy, update: {every_steps: 2}}]", timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "rewards.0.update: only a reward model" in out.stdout + out.stderr


def train(rm_dir, out_dir, *args, update: bool = True):
    label = "recipes/rewards/toy.py:digit_fraction"  # in [0, 1]: a soft pointwise label
    upd = f", update: {{every_steps: 2, label: '{label}', learning_rate: 0.003, epochs: 2}}" if update else ""
    rewards = f'rewards=[{{name: accuracy}}, {{name: "{label}"}}, {{name: "model:{rm_dir}", weight: 0.5{upd}}}]'
    return cli("train", "recipes/ci-tiny.yaml", rewards, "checkpoint.every_steps=2", f"logging.output_dir={out_dir}",
               *args, timeout=300)


@pytest.mark.slow
def test_train_updates_the_reward_model_and_resumes_exactly(fresh_rm, tmp_path, model_cache):
    straight, fixed = tmp_path / "straight", tmp_path / "fixed"
    for out_dir, update in ((straight, True), (fixed, False)):
        out = train(fresh_rm, out_dir, "train.max_steps=4", update=update)
        assert out.returncode == 0, out.stderr[-3000:]
    m, f = read_jsonl(straight / "metrics.jsonl"), read_jsonl(fixed / "metrics.jsonl")
    p = "reward_model/rm_tiny-rm/"
    assert [x[p + "updates"] for x in m] == [0, 1, 1, 2]
    assert [p + "loss" in x for x in m] == [False, True, False, True]
    # 2 steps x 2 prompts = 4 groups a period: 1 held back, 3 trained; 3 x 0.1 / 0.9 -> 0 replayed
    assert [(x[p + "trained_groups"], x[p + "held_out_groups"]) for x in (m[1], m[3])] == [(3, 1), (3, 1)]
    assert m[3][p + "buffer_groups"] == 6 and all(0 <= x[p + "accuracy_before"] <= 1 for x in (m[1], m[3]))
    # the same rewards until the first update, other ones after: the policy is rewarded by the updated model
    key = "rewards/rm_tiny-rm/mean"
    assert [x[key] for x in m[:2]] == pytest.approx([x[key] for x in f[:2]], rel=1e-6)
    assert m[2][key] != pytest.approx(f[2][key], abs=1e-4)
    state_dir = straight / "checkpoints" / "step-2" / "trainer"
    assert (state_dir / "reward_model_2.safetensors").is_file()
    assert not (fixed / "checkpoints" / "step-2" / "trainer" / "reward_model_2.safetensors").exists()

    # 2 steps (a checkpoint after the first update), then --resume to 4: the same numbers as the straight run
    resumed = tmp_path / "resumed"
    assert train(fresh_rm, resumed, "train.max_steps=2").returncode == 0
    rm._LOADED.clear()  # (the CLI runs in its own process anyway)
    out = train(fresh_rm, resumed, "train.max_steps=4", "--resume", "auto")
    assert out.returncode == 0, out.stderr[-3000:]
    r = read_jsonl(resumed / "metrics.jsonl")
    assert [stable(x) for x in r] == [stable(x) for x in m]


@pytest.mark.multiprocess
def test_two_processes_train_one_reward_model_on_every_row(fresh_rm, tmp_path, model_cache):
    # B=3 prompts x G=4 over 2 processes (group 1 split): each period's 6 groups are gathered whole, every process
    # trains the same copy, so step 3's rewards on both processes' rows are the step-2 checkpoint's model's scores
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from helpers import ROOT

    out_dir = tmp_path / "mp"
    label = "recipes/rewards/toy.py:digit_fraction"
    rewards = (f'rewards=[{{name: "{label}"}}, {{name: "model:{fresh_rm}", weight: 0.5, update: {{every_steps: 2, '
               'learning_rate: 0.003, epochs: 2}}]')
    p = subprocess.run([sys.executable, "-m", "grpo_cli", "train", "recipes/ci-tiny.yaml", "-o", str(out_dir),
                        "--num-processes", "2", "train.prompts_per_step=3", "train.micro_batch_size=3",
                        "train.max_steps=3", rewards, "checkpoint.every_steps=2"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = read_jsonl(out_dir / "metrics.jsonl")
    q = "reward_model/rm_tiny-rm/"
    assert (m[1][q + "trained_groups"], m[1][q + "held_out_groups"]) == (5, 1)  # ceil(0.1 x 6) = 1 held back
    tok = AutoTokenizer.from_pretrained(fresh_rm)
    model = AutoModelForSequenceClassification.from_pretrained(fresh_rm)
    saved = load_file(str(out_dir / "checkpoints/step-2/trainer/reward_model_1.safetensors"))
    assert any((saved[k] - v).abs().max() > 1e-4 for k, v in model.named_parameters())  # it was trained
    model.load_state_dict(saved, strict=False)
    rows = [r for r in read_jsonl(out_dir / "rollouts.jsonl") if r["step"] == 3]
    assert len(rows) == 12
    for r in rows:
        user = r["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        text = rm.texts_for(tok, [r["prompt"]], [user], [r["completion"]])
        with torch.no_grad():
            expected = model(**rm.encode(tok, text, 1024, "cpu")).logits[0, 0].item()
        assert r["rewards"]["rm_tiny-rm"] == pytest.approx(expected, rel=1e-3, abs=1e-5)
