"""Iterative reference refresh (DeepSeekMath Algorithm 1's pi_ref <- pi_theta; TR-DPO's mix-up, TRL's names):
the mixing rule, the KL right after a reset, checkpointed reference weights and exact resume."""

import pytest
import torch

from grpo_cli.train.engine import Engine
from grpo_cli.models.loading import mix_into
from grpo_cli.recipe.schema import RecipeError, load_recipe

from helpers import read_jsonl, stable

torch.set_num_threads(1)


def test_mix_into_is_alpha_policy_plus_one_minus_alpha_reference():
    ref, policy = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[1.0, 2.0]])), ref.bias.fill_(4.0)
        policy.weight.copy_(torch.tensor([[3.0, -2.0]])), policy.bias.fill_(0.0)
    mix_into(ref, policy, 0.25)
    # 0.25 * 3 + 0.75 * 1 = 1.5; 0.25 * -2 + 0.75 * 2 = 1.0; 0.25 * 0 + 0.75 * 4 = 3.0
    assert ref.weight.tolist() == [[1.5, 1.0]] and ref.bias.tolist() == [3.0]
    mix_into(ref, policy, 1.0)  # Algorithm 1's reset
    assert torch.equal(ref.weight, policy.weight) and torch.equal(ref.bias, policy.bias)
    assert policy.weight.tolist() == [[3.0, -2.0]]  # the policy is untouched


def test_it_needs_a_reference_and_full_weights():
    with pytest.raises(RecipeError, match="sync_ref_model.*beta = 0"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.sync_ref_model=true"])
    with pytest.raises(RecipeError, match="sync_ref_model with LoRA"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.sync_ref_model=true", "algorithm.beta=0.04", "model.lora.r=4"])


def _recipe(*extra):
    return load_recipe("recipes/ci-tiny.yaml", [
        "algorithm.beta=0.05", "algorithm.sync_ref_model=true", "algorithm.ref_model_mixup_alpha=1.0",
        "algorithm.ref_model_sync_steps=2", "train.max_steps=5", "train.learning_rate=1e-2", "checkpoint.every_steps=2",
        "checkpoint.keep_last=null", *extra,
    ])


@pytest.mark.usefixtures("model_cache")
def test_the_kl_after_a_reset_is_zero_and_resume_is_exact(tmp_path):
    Engine(_recipe(), tmp_path / "full").fit()
    full = read_jsonl(tmp_path / "full/metrics.jsonl")
    assert [m["ref_model/syncs"] for m in full] == [0, 1, 1, 2, 2]  # after the updates of steps 2 and 4
    # step 1: reference = initial policy = the policy that is trained: KL 0; steps 3 and 5 follow a reset
    assert [m["kl"] < 1e-6 for m in full] == [True, False, True, False, True], [m["kl"] for m in full]
    # checkpoints hold the refreshed reference once there is one (step 2's update ends with the first reset)
    assert all((tmp_path / f"full/checkpoints/step-{k}/trainer/ref_model.safetensors").is_file() for k in (2, 4, 5))

    cut = tmp_path / "cut"
    Engine(_recipe("train.max_steps=3"), cut).fit()  # stops right after a reset (step 2) and one more step
    Engine(_recipe(), cut, resume="auto").fit()
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in full]


@pytest.mark.usefixtures("model_cache")
def test_without_the_refresh_the_kl_grows(tmp_path):
    Engine(_recipe("algorithm.sync_ref_model=false"), tmp_path / "run").fit()
    kl = [m["kl"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")]
    assert kl[0] < 1e-6 and all(k > 1e-6 for k in kl[1:])
    assert "ref_model/syncs" not in read_jsonl(tmp_path / "run/metrics.jsonl")[0]
    assert not (tmp_path / "run/checkpoints/step-4/trainer/ref_model.safetensors").exists()  # the base is the reference
