"""Iterative reference refresh (DeepSeekMath Algorithm 1's pi_ref <- pi_theta; TR-DPO's mix-up, TRL's names):
the mixing rule, the KL right after a reset, checkpointed reference weights and exact resume."""

import pytest
import torch

from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.train.engine import Engine

from helpers import read_jsonl, stable

torch.set_num_threads(1)


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


def _as_written_before_parts(checkpoint):
    """Rewrite a checkpoint's trainer_state.json as grpo wrote it before the run's state was saved by part name (the
    refresh count under `ref_model_syncs`; the weights file the same), with its manifest entry to match."""
    import hashlib
    import json

    state_file = checkpoint / "trainer/trainer_state.json"
    state = json.loads(state_file.read_text())
    state["ref_model_syncs"] = state.pop("ref_model")["syncs"]
    state_file.write_text(json.dumps(state, indent=1))
    manifest = checkpoint / "trainer/manifest.json"
    doc = json.loads(manifest.read_text())
    doc["files"]["trainer/trainer_state.json"] = hashlib.sha256(state_file.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(doc, indent=1))


@pytest.mark.usefixtures("model_cache")
def test_a_checkpoint_written_before_the_parts_had_names_resumes_the_same(tmp_path):
    Engine(_recipe(), tmp_path / "full").fit()
    old = tmp_path / "old"
    Engine(_recipe("train.max_steps=3"), old).fit()
    _as_written_before_parts(old / "checkpoints/step-3")
    Engine(_recipe(), old, resume="auto").fit()
    resumed = read_jsonl(old / "metrics.jsonl")
    assert resumed[-1]["ref_model/syncs"] == 2 and resumed[2]["kl"] < 1e-6  # the reset of step 2 came back
    assert [stable(m) for m in resumed] == [stable(m) for m in read_jsonl(tmp_path / "full/metrics.jsonl")]
