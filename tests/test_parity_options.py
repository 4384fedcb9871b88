"""TRL's parity options, checked against hand-computed values: use_bias_correction_kl (DeepSeek-V3.2's
importance-weighted k3), off_policy_mask_threshold (DeepSeek-V3.2 off-policy sequence masking) and
multi_objective_aggregation normalize_then_sum (GDPO)."""

import math

import pytest
import torch

from grpo_cli.algo.advantages import normalize_then_sum
from grpo_cli.train.engine import Engine
from grpo_cli.algo.losses import compute_loss, off_policy_sequence_mask
from grpo_cli.recipe.schema import RecipeError, load_recipe

from helpers import read_jsonl

torch.set_num_threads(1)

EPS = 1e-4


def _kl_loss(use_bias_correction_kl: bool, level: str = "token"):
    # one sequence, advantage 0: the policy term is 0 and only beta * KL is left
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, ref = torch.tensor([[-1.2, -2.0]]), torch.tensor([[-0.9, -2.3]])
    loss, metrics = compute_loss("grpo", logps, old, torch.tensor([0.0]), torch.ones(1, 2), epsilon_low=0.2,
                                 epsilon_high=0.2, beta=0.5, ref_logps=ref, importance_sampling_level=level,
                                 use_bias_correction_kl=use_bias_correction_kl)
    loss.backward()
    return loss.item(), logps.grad[0].tolist(), metrics["kl"].item()


def test_bias_corrected_kl_is_k3_times_the_ratio_with_its_gradient():
    # token 1: d = ref - logp = 0.1, w = e^0.2; token 2: d = -0.3, w = 1
    k3 = [math.exp(0.1) - 0.1 - 1, math.exp(-0.3) + 0.3 - 1]
    w = [math.exp(0.2), 1.0]
    loss, grad, kl = _kl_loss(True)
    assert loss == pytest.approx(0.5 * (k3[0] * w[0] + k3[1] * w[1]) / 2, rel=1e-5)
    assert kl == pytest.approx((k3[0] * w[0] + k3[1] * w[1]) / 2, rel=1e-5)
    # d/dlogp (w k3) = w k3 + w (1 - e^d) = -w d: the unbiased reverse-KL gradient (per token, / 2 tokens)
    assert grad == pytest.approx([0.5 * -w[0] * 0.1 / 2, 0.5 * -w[1] * -0.3 / 2], rel=1e-5)
    # plain k3 (the default, DeepSeekMath): gradient 1 - e^d, no ratio
    loss, grad, kl = _kl_loss(False)
    assert loss == pytest.approx(0.5 * (k3[0] + k3[1]) / 2, rel=1e-5)
    assert grad == pytest.approx([0.5 * (1 - math.exp(0.1)) / 2, 0.5 * (1 - math.exp(-0.3)) / 2], rel=1e-5)


def test_bias_corrected_kl_with_sequence_ratios_uses_the_broadcast_sequence_weight():
    # GSPO: w = exp(mean log-ratio) = e^0.1 on both tokens, and its gradient spreads over both tokens
    k3 = [math.exp(0.1) - 0.1 - 1, math.exp(-0.3) + 0.3 - 1]
    w = math.exp(0.1)
    loss, grad, _ = _kl_loss(True, "sequence")
    assert loss == pytest.approx(0.5 * w * (k3[0] + k3[1]) / 2, rel=1e-5)
    # d/dlogp_j [w (k3_0 + k3_1)] / 2 = [w / 2 (k3_0 + k3_1) + w (1 - e^d_j)] / 2
    expected = [0.5 * (w / 2 * (k3[0] + k3[1]) + w * (1 - math.exp(d))) / 2 for d in (0.1, -0.3)]
    assert grad == pytest.approx(expected, rel=1e-5)


def test_off_policy_mask_drops_negative_advantage_sequences_that_drifted():
    adv = torch.tensor([[1.0], [-1.0], [-1.0], [-1.0]])
    logps = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampling = torch.tensor([
        [0.0, 0.0],             # drift 1.0, but a positive advantage: kept
        [-0.4, -0.2],           # drift (0.6 + 0.8) / 2 = 0.7 > 0.5: dropped
        [-0.8, -0.8],           # drift 0.2: kept
        [-0.4, float("nan")],   # NaN counts 0, one active token: 0.6 / 1 > 0.5: dropped
    ])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    keep = off_policy_sequence_mask(adv, logps, sampling, mask, 0.5)
    assert keep.view(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert off_policy_sequence_mask(adv, logps, sampling, mask, 0.75).view(-1).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_the_off_policy_mask_zeroes_the_policy_term_of_dropped_sequences_only():
    logps = torch.tensor([[-1.0, -1.5], [-2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.4], [-2.2, -0.4]])
    sampling = torch.tensor([[-1.1, -1.4], [-0.2, -0.4]])  # row 2 drifted: mean (1.8 + 0.1) / 2 = 0.95
    ref = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    adv, mask = torch.tensor([-1.0, -1.0]), torch.ones(2, 2)
    kw = dict(epsilon_low=0.2, epsilon_high=0.2, beta=0.1, ref_logps=ref)
    loss, metrics = compute_loss("dapo", logps, old, adv, mask, off_policy_mask_threshold=0.5, sampling_logps=sampling, **kw)
    loss.backward()
    # by hand: row 1 keeps its clipped term, row 2 keeps only its KL; dapo divides by the 4 tokens
    w = [math.exp(0.1), math.exp(-0.1)]
    policy = sum(-min(wi * -1, min(max(wi, 0.8), 1.2) * -1) for wi in w)
    kl = sum(math.exp(r - lp) - (r - lp) - 1 for r, lp in zip([-1.0] * 4, [-1.0, -1.5, -2.0, -0.5]))
    assert loss.item() == pytest.approx((policy + 0.1 * kl) / 4, rel=1e-5)
    assert metrics["off_policy_mask/masked_token_fraction"].item() == pytest.approx(0.5)
    assert logps.grad[1].tolist() == pytest.approx([0.1 * (1 - math.exp(1.0)) / 4, 0.1 * (1 - math.exp(-0.5)) / 4],
                                                   rel=1e-5)  # the KL's gradient only
    # without sampler log-probs the drift is from the old policy: (0.2 - 0.1) / 2 = 0.05, nothing is dropped
    _, metrics = compute_loss("dapo", logps, old, adv, mask, off_policy_mask_threshold=0.5, **kw)
    assert metrics["off_policy_mask/masked_token_fraction"].item() == 0.0


def _normalized(values: list[float]) -> list[float]:
    n, mean = len(values), sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + EPS) for v in values]


def test_normalize_then_sum_by_hand():
    # B=2 groups of G=2, K=2 reward functions with weights 1 and 0.5
    per_function = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    # within each group: f1 -> [+a, -a], [0, 0]; f2 -> [0, 0] (std 0), [+a, -a], a = 0.5 / (std + eps)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    sums = [a, -a, 0.5 * a, -0.5 * a]
    expected = _normalized(sums)
    got = normalize_then_sum(per_function, [1.0, 0.5], 2)
    assert got.tolist() == pytest.approx(expected, rel=1e-5)
    # not the same as sum_then_normalize's group advantages: group 2's sums [1.5, 1] would give [+0.707, -0.707]
    assert got[2].item() == pytest.approx(expected[2]) and abs(got[2].item() - 0.7070) > 0.1


def test_normalize_then_sum_missing_rewards():
    nan = math.nan
    per_function = torch.tensor([[1.0, nan], [0.0, 2.0], [nan, nan], [3.0, 1.0]])
    got = normalize_then_sum(per_function, [1.0, 1.0], 2)
    # group 1: f1 [1, 0] -> [+a, -a]; f2 has one value -> std 0 -> 0; group 2: f1 one value -> 0; f2 one value -> 0
    a = 0.5 / (math.sqrt(0.5) + EPS)
    # row 3 (no reward at all) is left out of the batch statistics and gets 0
    expected = _normalized([a, -a, 0.0])
    assert got.tolist() == pytest.approx([expected[0], expected[1], 0.0, expected[2]], rel=1e-5, abs=1e-6)


def test_normalize_then_sum_refuses_a_scale_it_would_ignore():
    with pytest.raises(RecipeError, match="scale_rewards.*normalize_then_sum"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.multi_objective_aggregation=normalize_then_sum",
                                             "algorithm.scale_rewards=none"])


@pytest.mark.usefixtures("model_cache")
def test_the_options_train_and_log(tmp_path):
    r = load_recipe("recipes/ci-tiny.yaml", [
        "train.max_steps=2", "checkpoint.every_steps=0", "algorithm.beta=0.04", "algorithm.num_iterations=2",
        "algorithm.use_bias_correction_kl=true", "algorithm.off_policy_mask_threshold=0.0",
        "algorithm.multi_objective_aggregation=normalize_then_sum",
    ])
    Engine(r, tmp_path / "run").fit()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0 <= m["off_policy_mask/masked_token_fraction"] <= 1 and m["kl"] >= 0 for m in metrics)
    rollouts = [x for x in read_jsonl(tmp_path / "run/rollouts.jsonl") if x["step"] == 1]
    per_function = torch.tensor([[x["rewards"][k] for k in sorted(x["rewards"])] for x in rollouts])
    weights = [w.weight for w in sorted(r.rewards, key=lambda s: s.name)]
    # the logged advantages are GDPO's of the logged per-function rewards
    expected = normalize_then_sum(per_function, weights, r.algorithm.num_generations)
    assert torch.allclose(torch.tensor([x["advantage"] for x in rollouts]), expected, atol=1e-5)
