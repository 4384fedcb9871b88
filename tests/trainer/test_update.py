"""The update's parts with state of their own. Iterative reference refresh (DeepSeekMath Algorithm 1's
pi_ref <- pi_theta; TR-DPO's mix-up, TRL's names): the mixing rule, the KL right after a reset, checkpointed
reference weights and exact resume. The entropy bonus: its gradient, its adaptive coefficient, exact resume."""

import pytest
import torch

from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.trainer.engine import Engine

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


# ----- the entropy bonus (TRL 1.16's entropy_coef / use_adaptive_entropy) ----------------------------------------
def _grads_of_one_update(tmp_path, *overrides, adv_scale=0.0):
    """One PolicyUpdate of step 1's rows on ci-tiny, advantages times `adv_scale`; -> (engine, rollout, mask, the
    gradient the optimizer step saw, by parameter name)."""
    from grpo_cli.algo.losses import trained_mask
    from grpo_cli.process.clock import Clock

    eng = Engine(load_recipe("recipes/ci-tiny.yaml", [*overrides, "checkpoint.every_steps=0"]), tmp_path)
    s = eng.rollouts.next(1, Clock(torch.device("cpu")))
    seen = {}

    def capture(*_):  # (the window the step closes)
        seen.update({n: p.grad.clone() for n, p in eng.policy.named_parameters()})
        eng.optimizer.zero_grad(set_to_none=True)
        return 0.0

    eng.update._optimizer_step = capture
    mask = trained_mask(s.rollout, False)
    eng.update(s.rollout, adv_scale * torch.ones(len(s.rollout)), mask)  # adv_scale: a number or [n] advantages
    return eng, s.rollout, mask, seen


@pytest.mark.usefixtures("model_cache")
def test_the_entropy_bonus_gradient_is_minus_c_times_the_mean_entropy_gradient(tmp_path):
    from grpo_cli.algo.logprobs import token_logprobs

    # advantages 0 and beta 0: the policy term has no gradient, only the bonus does; two micro-batches of 4 rows
    eng, ro, mask, got = _grads_of_one_update(tmp_path, "algorithm.entropy_coef=0.3")
    expected = {n: torch.zeros_like(p) for n, p in eng.policy.named_parameters()}
    for sl in (slice(0, 4), slice(4, 8)):  # TRL: per micro-batch c * masked mean entropy / accumulation steps
        eng.policy.zero_grad(set_to_none=True)
        _, ent = token_logprobs(eng.policy, ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl],
                               ro.completion_mask[sl], entropy_grad=True)
        (-0.3 * (ent * mask[sl]).sum() / mask[sl].sum() / 2).backward()
        for n, p in eng.policy.named_parameters():
            expected[n] += p.grad
    assert max((got[n] - expected[n]).abs().max().item() for n in got) < 1e-6
    assert max(g.abs().max().item() for g in got.values()) > 1e-4  # not vacuous
    # and it points uphill: a small step along -grad raises the mean entropy of the same rows
    with torch.no_grad():
        def mean_entropy():
            _, e = token_logprobs(eng.policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                  with_entropy=True)
            return ((e * mask).sum() / mask.sum()).item()

        before = mean_entropy()
        for n, p in eng.policy.named_parameters():
            p -= 1e-2 * got[n]
        assert mean_entropy() > before


@pytest.mark.usefixtures("model_cache")
def test_no_bonus_means_no_entropy_gradient(tmp_path):
    _, _, _, got = _grads_of_one_update(tmp_path)
    assert all(g is None or g.abs().max().item() == 0 for g in got.values())


def _entropy_recipe(*extra):
    return load_recipe("recipes/ci-tiny.yaml", [
        "algorithm.use_adaptive_entropy=true", "algorithm.entropy_coef=0.01", "algorithm.entropy_coef_delta=0.02",
        "algorithm.entropy_coef_max=0.05", "train.max_steps=5", "checkpoint.every_steps=2", "checkpoint.keep_last=null",
        "train.micro_batch_size=8", *extra,
    ])


@pytest.mark.usefixtures("model_cache")
def test_adaptive_entropy_is_logged_follows_the_rule_and_resumes_exactly(tmp_path):
    # the tiny model's entropy is ~6.6 nats: a target of 100 keeps it below (c rises), one of 1 above (c falls)
    Engine(_entropy_recipe("algorithm.entropy_target=100"), tmp_path / "up").fit()
    up = read_jsonl(tmp_path / "up/metrics.jsonl")
    assert [round(m["entropy_coef"], 6) for m in up] == [0.03, 0.05, 0.05, 0.05, 0.05]
    # step 1 applies nothing (no entropy measured yet); later steps the previous step's c: one micro-batch, mu = 1,
    # so the logged entropy is the bonus's mean entropy and loss = policy_loss - c H
    assert up[0]["loss"] == up[0]["policy_loss"]
    for prev, m in zip(up, up[1:]):
        assert m["loss"] == pytest.approx(m["policy_loss"] - prev["entropy_coef"] * m["entropy"], abs=1e-5)
    Engine(_entropy_recipe("algorithm.entropy_target=1"), tmp_path / "down").fit()
    down = read_jsonl(tmp_path / "down/metrics.jsonl")
    assert [round(m["entropy_coef"], 6) for m in down] == [0.0] * 5  # 0.01 - 0.02, clamped at the min
    assert all(m["loss"] == m["policy_loss"] for m in down)  # H above the target: no bonus

    cut = tmp_path / "cut"
    Engine(_entropy_recipe("algorithm.entropy_target=100", "train.max_steps=3"), cut).fit()
    state = (cut / "checkpoints/step-2/trainer/trainer_state.json").read_text()
    assert '"entropy_control"' in state and '"entropy_coef": 0.05' in state
    Engine(_entropy_recipe("algorithm.entropy_target=100"), cut, resume="auto").fit()
    assert [stable(m) for m in read_jsonl(cut / "metrics.jsonl")] == [stable(m) for m in up]


def test_entropy_settings_are_checked():
    with pytest.raises(RecipeError, match="entropy_coef_min"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.use_adaptive_entropy=true", "algorithm.entropy_coef_min=0.5",
                                             "algorithm.entropy_coef_max=0.1"])
    a = load_recipe("recipes/ci-tiny.yaml", []).algorithm
    assert (a.entropy_coef, a.use_adaptive_entropy, a.entropy_coef_min, a.entropy_coef_max, a.entropy_coef_delta,
            a.entropy_target) == (0.0, False, 0.0, 1.0, 0.005, 0.2)  # TRL 1.16's defaults
    assert not a.entropy_bonus


@pytest.mark.usefixtures("model_cache")
def test_top_entropy_quantile_masks_the_policy_term_but_keeps_the_normaliser(tmp_path):
    # issue 21's TRL comparison found grpo aggregating over the kept tokens only: for loss_type grpo each sequence's
    # mean then ran over its high-entropy tokens (about twice TRL's loss at q = 0.5). TRL and arXiv:2506.01939 put
    # the indicator inside the sum and keep the normaliser: sum_t I[H_t >= tau] l_t / |o_i|.
    from grpo_cli.algo.logprobs import token_logprobs

    adv = torch.tensor([1.0, -0.5, 2.0, -1.0, 0.3, -2.0, 1.5, -0.7])
    eng, ro, mask, got = _grads_of_one_update(tmp_path, "algorithm.loss_type=grpo",
                                              "algorithm.top_entropy_quantile=0.5", adv_scale=adv)
    expected = {n: torch.zeros_like(p) for n, p in eng.policy.named_parameters()}
    for sl in (slice(0, 4), slice(4, 8)):
        eng.policy.zero_grad(set_to_none=True)
        logps, ent = token_logprobs(eng.policy, ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl],
                                    ro.completion_mask[sl], with_entropy=True)
        m = mask[sl].float()
        high = (ent >= torch.quantile(ent[m.bool()], 0.5)).float() * m
        w = torch.exp(logps - logps.detach())  # on-policy: 1, with the gradient of log pi
        per_token = -w * adv[sl, None] * high  # inside the clip range
        ((per_token * m).sum(-1) / m.sum(-1)).mean().div(2).backward()  # two micro-batches
        for n, p in eng.policy.named_parameters():
            expected[n] += p.grad
    assert max((got[n] - expected[n]).abs().max().item() for n in got) < 1e-6


@pytest.mark.usefixtures("model_cache")
def test_a_lower_bound_on_the_sampler_ratio_is_applied_and_counted(tmp_path):
    # issue 38 item 5: a bfloat16 sampler's ratios to the float32 trainer are 1 +- 0.002; a lower bound of 0.999
    # catches about a tenth of the tokens: dropped (mask) or raised to it (truncate), which changes the loss
    from grpo_cli.algo.losses import trained_mask
    from grpo_cli.process.clock import Clock

    def update(mode, *bound):
        eng = Engine(load_recipe("recipes/ci-tiny.yaml", ["rollout.dtype=bfloat16", f"rollout.importance_sampling={mode}",
                                                          *bound, "checkpoint.every_steps=0"]), tmp_path / f"{mode}{bound}")
        s = eng.rollouts.next(1, Clock(torch.device("cpu")))
        assert s.rollout.sampling_logps is not None
        adv = torch.ones(len(s.rollout))  # the loss: minus the weighted ratio, about -1 a token
        return eng.update(s.rollout, adv, trained_mask(s.rollout, False)).means(eng.procs)

    for mode in ("token_mask", "token_truncate"):
        free, bounded = update(mode), update(mode, "rollout.importance_sampling_min=0.999")
        assert "sampling/importance_sampling_below_min" not in free
        assert 0.05 < bounded["sampling/importance_sampling_below_min"] < 0.95, bounded
        if mode == "token_mask":  # ~1 of 10 tokens out of the objective -1 a token
            assert bounded["loss"] > free["loss"] + 0.5 * bounded["sampling/importance_sampling_below_min"], bounded
        else:  # those weights raised to the bound (by < 0.003 each)
            assert free["loss"] - 3e-3 * bounded["sampling/importance_sampling_below_min"] < bounded["loss"] < \
                free["loss"] - 1e-7, (bounded["loss"], free["loss"])
        assert bounded["sampling/importance_sampling_ratio/mean"] == free["sampling/importance_sampling_ratio/mean"]


@pytest.mark.usefixtures("model_cache")
def test_packed_training_forwards_train_the_same_as_padded_ones(tmp_path):
    # issue 38 item 4: train.packing changes the layout of every training forward (the policy's with its gradient,
    # the old policy's for mu = 2 with mini-batches, the reference's for the KL) and no number of the run
    def run(packing):
        recipe = load_recipe("recipes/ci-tiny.yaml", [
            f"train.packing={packing}", "algorithm.beta=0.04", "algorithm.num_iterations=2", "train.mini_batches=2",
            "algorithm.entropy_coef=0.01", "train.micro_batch_size=2", "train.max_steps=3", "train.learning_rate=1e-2",
            "rollout.max_completion_length=24", "checkpoint.every_steps=0"])
        eng = Engine(recipe, tmp_path / str(packing))
        assert eng.update.forward_kw["packing"] is packing and eng.update.forward_kw["shared_prompts"] is not packing
        eng.fit()
        return read_jsonl(tmp_path / f"{packing}/metrics.jsonl")

    padded, packed = run(False), run(True)
    assert [m["completions/mean_length"] for m in padded] == [m["completions/mean_length"] for m in packed]
    assert len({m["completions/mean_length"] for m in padded}) > 1 and min(m["kl"] for m in padded[1:]) > 0
    for a, b in zip(padded, packed):
        for key in ("loss", "grad_norm", "kl", "entropy", "clip_ratio/region_mean", "reward"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
