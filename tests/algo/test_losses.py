"""Loss values computed by hand (arithmetic in comments) for every loss type.

TRL's parity options too: use_bias_correction_kl (DeepSeek-V3.2's importance-weighted k3) and off_policy_mask_threshold (its off-policy sequence masking)."""

import math

import pytest
import torch

from grpo_cli.algo.losses import AGGREGATIONS, OBJECTIVES, POLICY_LOSSES, off_policy_sequence_mask
from grpo_cli.recipe.specs import LOSSES
from grpo_cli.errors import RecipeError
from grpo_cli.recipe.algorithm import AlgorithmConfig
from grpo_cli.recipe.files import load_recipe

from helpers import loss_of

# Two completions, two positions; old_logps = 0 so the ratio w equals exp(logps).
W = torch.tensor([[1.5, 0.5], [1.0, 1.1]])
MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0])
EPS = dict(epsilon_low=0.2, epsilon_high=0.2)


def run(loss_type, w=W, mask=MASK, adv=ADV, **kw):
    logps = torch.log(w).clone().requires_grad_(True)
    kw = {**EPS, **kw}
    loss, m = loss_of(loss_type, logps, torch.zeros_like(logps), adv, mask, **kw)
    return loss, m, logps


def test_every_loss_of_the_table_is_a_schema_choice_made_of_registered_parts():
    choices = set(AlgorithmConfig.model_fields["loss_type"].annotation.__args__)
    assert choices == set(LOSSES) == set(POLICY_LOSSES.names()) and len(choices) == 8
    for spec in LOSSES.values():
        assert spec.objective in OBJECTIVES and spec.aggregation in AGGREGATIONS, spec
        assert spec.name in AlgorithmConfig.model_fields["loss_type"].description


# Clipped per-token losses: row 0 (A=+1): min(1.5, 1.2) = 1.2 -> -1.2; min(0.5, 0.8) = 0.5 -> -0.5
# row 1 (A=-1): min(-1.0, -1.0) -> +1.0; position 1 is masked. Masked sum = -1.2 - 0.5 + 1.0 = -0.7
@pytest.mark.parametrize(
    "loss_type,kw,expected",
    [
        ("grpo", {}, ((-1.2 - 0.5) / 2 + 1.0 / 1) / 2),  # mean of per-sequence means = 0.075
        ("bnpo", {}, -0.7 / 3),  # 3 active tokens
        ("dr_grpo", {"max_completion_length": 4}, -0.7 / (2 * 4)),  # N * L_max = 8
        ("dapo", {}, -0.7 / 3),  # default: active tokens of this batch
        ("dapo", {"num_active_tokens": 7}, -0.7 / 7),  # global count from the engine
    ],
)
def test_clipped_family(loss_type, kw, expected):
    loss, m, _ = run(loss_type, **kw)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # only row 0 position 0 (w = 1.5 > 1.2 with A > 0) is clipped: 1 of 3 active tokens
    assert m["clip_ratio/high_mean"].item() == pytest.approx(1 / 3)
    assert m["clip_ratio/low_mean"].item() == 0.0
    assert m["clip_ratio/region_mean"].item() == pytest.approx(1 / 3)
    assert "kl" not in m


def test_clipped_gradient_is_zero_where_clipped():
    loss, _, logps = run("bnpo")
    loss.backward()
    # d/dlogp of -w*A/3 = -w*A/3: row 0 pos 0 is clipped (0); row 0 pos 1: -0.5/3; row 1 pos 0: +1/3; masked: 0
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -0.5 / 3], [1 / 3, 0.0]]))


def test_delta_bounds_the_ratio_for_negative_advantages():
    w, mask, adv = torch.tensor([[3.0]]), torch.tensor([[1]]), torch.tensor([-1.0])
    loss, m, _ = run("grpo", w, mask, adv)
    assert loss.item() == pytest.approx(3.0)  # -min(-3, -1.2) = 3: unbounded without delta
    loss, _, _ = run("grpo", w, mask, adv, delta=1.4)
    assert loss.item() == pytest.approx(1.4)  # -min(min(3, 1.4) * -1, 1.2 * -1) = 1.4
    assert m["clip_ratio/low_mean"].item() == 0.0  # w > 1: not a low clip


def test_cispo_values_and_gradient():
    loss, m, logps = run("cispo", epsilon_low=0.0, epsilon_high=1.2)
    # -min(w, 1.2) * A * log w: row 0: -1.2*log 1.5 = -0.486558; -0.5*log 0.5 = +0.346574; row 1: 0 (log 1 = 0)
    expected = (-1.2 * math.log(1.5) - 0.5 * math.log(0.5) + 0.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # gradient flows through log pi only: -sg(min(w, 1.2)) * A / 3, also on the clipped token
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.2 / 3, -0.5 / 3], [1.0 / 3, 0.0]]))
    assert m["clip_ratio/high_mean"].item() == pytest.approx(1 / 3)  # w = 1.5 > cap 1.2


def test_sapo_values():
    loss, _, _ = run("sapo")
    # row 0 (tau 1): -4*sigmoid(0.5) = -2.489837, -4*sigmoid(-0.5) = -1.510163 -> mean -2.0
    # row 1 (tau 1.05, A = -1): +sigmoid(0) * 4 / 1.05 = 1.904762
    expected = (-2.0 + 2 / 1.05) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_k3_kl_term():
    logps = torch.log(W)
    loss, m = loss_of("grpo", logps, logps, ADV, MASK, **EPS, beta=0.1, ref_logps=torch.zeros_like(logps))
    # with old = logps, w = 1: per-token -A; k3 = 1/w + log w - 1: 0.072132, 0.306853, 0 (masked 4th)
    k = [1 / 1.5 + math.log(1.5) - 1, 2 + math.log(0.5) - 1, 0.0]
    assert m["kl"].item() == pytest.approx(sum(k) / 3, abs=1e-6)
    expected = ((-1 + 0.1 * k[0] - 1 + 0.1 * k[1]) / 2 + (1 + 0.1 * k[2])) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        loss_of("grpo", logps, logps, ADV, MASK, **EPS, beta=0.1)


def test_gspo_sequence_level_ratio():
    loss, _, _ = run("grpo", importance_sampling_level="sequence")
    # row 0: exp((log 1.5 + log 0.5) / 2) = sqrt(0.75) = 0.866025 in [0.8, 1.2] -> -0.866025 per token
    # row 1: exp(log 1 / 1) = 1 -> +1
    assert loss.item() == pytest.approx((-math.sqrt(0.75) + 1.0) / 2, abs=1e-6)


def test_dapo_accumulated_gradient_equals_full_batch():
    g = torch.Generator().manual_seed(0)
    N, T = 8, 6
    logps = (-torch.rand(N, T, generator=g)).requires_grad_(True)
    old = logps.detach() + 0.1 * torch.randn(N, T, generator=g)
    adv = torch.randn(N, generator=g)
    mask = (torch.rand(N, T, generator=g) > 0.3).long()
    full, _ = loss_of("dapo", logps, old, adv, mask, **EPS)
    (g_full,) = torch.autograd.grad(full, logps)
    total = mask.sum()
    acc = torch.zeros_like(logps)
    for rows in (slice(0, 3), slice(3, 8)):  # unequal micro-batches
        part, _ = loss_of("dapo", logps[rows], old[rows], adv[rows], mask[rows], **EPS, num_active_tokens=total)
        (gp,) = torch.autograd.grad(part, logps)
        acc += gp
    assert (acc - g_full).abs().max().item() <= 1e-7


def test_grpo_matches_reference_loop():
    g = torch.Generator().manual_seed(1)
    N, T = 4, 5
    logps, old = -torch.rand(N, T, generator=g), -torch.rand(N, T, generator=g)
    adv, mask = torch.randn(N, generator=g), (torch.rand(N, T, generator=g) > 0.2).long()
    loss, _ = loss_of("grpo", logps, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28)
    seq = []
    for i in range(N):
        terms = []
        for t in range(T):
            if mask[i, t]:
                w = math.exp(logps[i, t] - old[i, t])
                terms.append(-min(w * adv[i].item(), min(max(w, 0.8), 1.28) * adv[i].item()))
        seq.append(sum(terms) / max(len(terms), 1))
    assert loss.item() == pytest.approx(sum(seq) / N, abs=1e-6)


def test_unknown_loss_type_lists_valid_names():
    with pytest.raises(KeyError, match="valid: bnpo, cispo, dapo, dr_grpo, grpo, luspo, sapo, vespo"):
        loss_of("ppo", W, W, ADV, MASK, **EPS)


def test_sampler_correction_modes_hand_computed():
    from grpo_cli.algo.losses import sampler_correction

    # trainer - sampler log-probs: row 0: log 2, log 0.5 (rho 2, 0.5); row 1: log 4 (rho 4), then padding
    old = torch.log(torch.tensor([[2.0, 0.5], [4.0, 1.0]]))
    samp = torch.zeros(2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    w, rho = sampler_correction(old, samp, mask, "token_truncate", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [3.0, 1.0]]))  # 4 -> cap 3; padding: exp(0) = 1
    w, _ = sampler_correction(old, samp, mask, "token_mask", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [0.0, 1.0]]))  # 4 > 3 -> 0
    # sequence: row 0 rho = 2 * 0.5 = 1; row 1 rho = 4 (the padded position does not count)
    w, rho = sampler_correction(old, samp, mask, "sequence_truncate", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    w, _ = sampler_correction(old, samp, mask, "sequence_mask", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="token|sequence"):
        sampler_correction(old, samp, mask, "tok_clip", cap=3.0)
    # a lower bound (issue 38; IcePop's band, TRL's vllm_importance_sampling_clip_min): 0.5 kept at 0.5 (TRL keeps a
    # ratio equal to the bound), 0.25 raised to 0.6 by truncate, dropped by mask
    old = torch.log(torch.tensor([[2.0, 0.5], [0.25, 1.0]]))
    w, _ = sampler_correction(old, samp, mask, "token_truncate", cap=3.0, floor=0.6)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6], [0.6, 1.0]]))
    w, _ = sampler_correction(old, samp, mask, "token_mask", cap=3.0, floor=0.5)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [0.0, 1.0]]))
    w, _ = sampler_correction(old, samp, mask, "sequence_mask", cap=3.0, floor=0.5)  # row 0: 1; row 1: 0.25
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    w, _ = sampler_correction(old, samp, mask, "sequence_truncate", cap=3.0, floor=0.5)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.5, 0.5]]))


def test_token_weights_scale_the_policy_term_only():
    # bnpo: masked sum / 3 active tokens; weights 2, 0.5, 3 on the three active tokens
    weights = torch.tensor([[2.0, 0.5], [3.0, 1.0]])
    loss, _, _ = run("bnpo", token_weights=weights)
    assert loss.item() == pytest.approx((-1.2 * 2 - 0.5 * 0.5 + 1.0 * 3) / 3, abs=1e-6)
    logps = torch.log(W)
    plain, m = loss_of("bnpo", logps, logps, ADV, MASK, **EPS, beta=0.1, ref_logps=torch.zeros_like(logps))
    weighted, _ = loss_of("bnpo", logps, logps, ADV, MASK, **EPS, beta=0.1, ref_logps=torch.zeros_like(logps),
                               token_weights=torch.full((2, 2), 2.0))
    # per token -A (w = 1) doubles, the k3 term does not: difference = sum(-A over active) / 3
    assert (weighted - plain).item() == pytest.approx((-1 - 1 + 1) / 3, abs=1e-6)


def _kl_loss(use_bias_correction_kl: bool, level: str = "token"):
    # one sequence, advantage 0: the policy term is 0 and only beta * KL is left
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, ref = torch.tensor([[-1.2, -2.0]]), torch.tensor([[-0.9, -2.3]])
    loss, metrics = loss_of("grpo", logps, old, torch.tensor([0.0]), torch.ones(1, 2), epsilon_low=0.2,
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
    loss, metrics = loss_of("dapo", logps, old, adv, mask, off_policy_mask_threshold=0.5, sampling_logps=sampling, **kw)
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
    _, metrics = loss_of("dapo", logps, old, adv, mask, off_policy_mask_threshold=0.5, **kw)
    assert metrics["off_policy_mask/masked_token_fraction"].item() == 0.0


# ----- luspo and vespo (TRL 1.16's loss types), by hand ------------------------------------------------------
def test_luspo_is_gspo_with_each_sequence_loss_times_its_length():
    loss, m, logps = run("luspo", importance_sampling_level="sequence")
    # as test_gspo_sequence_level_ratio, but summed over each sequence's tokens, then the mean over sequences:
    # row 0: 2 tokens of -0.866025 = -1.732051; row 1: 1 token of +1 -> (-1.732051 + 1) / 2 = -0.366025
    assert loss.item() == pytest.approx((-2 * math.sqrt(0.75) + 1.0) / 2, abs=1e-6)
    loss.backward()
    # d/dlogp_t of -w_seq A len / N, w_seq = exp(mean_t logp_t): -w A / N per token (len x 1/len)
    torch.testing.assert_close(logps.grad, torch.tensor([[-math.sqrt(0.75) / 2] * 2, [1 / 2, 0.0]]))
    assert m["clip_ratio/region_mean"].item() == 0.0  # 0.866 and 1 lie inside [0.8, 1.2]


def test_vespo_gamma_weight_scales_the_log_prob_gradient():
    loss, m, logps = run("vespo")
    # sequence ratios W = prod_t w_t: row 0: 1.5 * 0.5 = 0.75 (A = +1: k 2, lambda 3); row 1: 1 (masked token left out,
    # A = -1: k 3, lambda 2). phi = e^lambda W^k e^(-lambda W): row 0: e^3 0.5625 e^-2.25 = 1.190813; row 1: 1.
    phi0 = math.exp(3) * 0.75**2 * math.exp(-2.25)
    # -phi A log pi summed over active tokens / 3 active tokens: row 0: -phi0 (log 1.5 + log 0.5); row 1: log 1 = 0
    assert loss.item() == pytest.approx(-phi0 * math.log(0.75) / 3, abs=1e-6)
    assert m["vespo/phi_seq_mean"].item() == pytest.approx((phi0 + 1) / 2, abs=1e-6)
    assert "clip_ratio/region_mean" not in m  # nothing is clipped
    loss.backward()
    # phi is a constant: the gradient is -phi A / 3 on every active token
    torch.testing.assert_close(logps.grad, torch.tensor([[-phi0 / 3, -phi0 / 3], [1 / 3, 0.0]]))


def test_vespo_takes_the_sampler_weights_into_its_sequence_ratio():
    logps = torch.log(W)
    rho = torch.tensor([[2.0, 1.0], [0.5, 1.0]])  # pi_old / pi_sampler per token (1 where no correction)
    loss, m = loss_of("vespo", logps, torch.zeros_like(logps), ADV, MASK, **EPS, token_weights=rho)
    # row 0: W = 0.75 * 2 = 1.5: phi = e^3 2.25 e^-4.5 = 0.502043; row 1: W = 1 * 0.5 = 0.5 (A < 0: k 3, lambda 2):
    # phi = e^2 0.125 e^-1 = 0.339785. The weights enter phi only: the loss is not multiplied by them.
    phi0, phi1 = math.exp(3) * 2.25 * math.exp(-4.5), math.exp(2) * 0.125 * math.exp(-1)
    assert loss.item() == pytest.approx(-phi0 * math.log(0.75) / 3, abs=1e-6)
    assert m["vespo/phi_seq_mean"].item() == pytest.approx((phi0 + phi1) / 2, abs=1e-6)


def test_vespo_clamps_as_trl():
    # a huge ratio: log W clamped to 20, phi = e^lambda e^(20 k) e^(-lambda e^20) underflows to 0 (not NaN)
    w, mask, adv = torch.tensor([[1e6, 1e6]]), torch.tensor([[1, 1]]), torch.tensor([1.0])
    loss, m, _ = run("vespo", w, mask, adv)
    assert m["vespo/phi_seq_mean"].item() == 0.0 and loss.item() == 0.0
    # a vanishing one: log W clamped to log 1e-8: phi = e^3 (1e-8)^2 e^(-3e-8) ~ 2.0e-15
    loss, m, _ = run("vespo", torch.tensor([[1e-6, 1e-6]]), mask, adv)
    assert m["vespo/phi_seq_mean"].item() == pytest.approx(math.exp(3) * 1e-16, rel=1e-4)
    # lambda 0 counts as 1e-4: phi = e^1e-4 W^k e^(-1e-4 W)
    loss, m, _ = run("vespo", torch.tensor([[0.5]]), torch.tensor([[1]]), adv, vespo=(2.0, 0.0, 3.0, 2.0))
    assert m["vespo/phi_seq_mean"].item() == pytest.approx(math.exp(1e-4) * 0.25 * math.exp(-0.5e-4), rel=1e-6)


def test_vespo_and_luspo_recipes_and_their_requirements():
    r = load_recipe("recipes/ci-tiny.yaml", ["algorithm.loss_type=luspo", "algorithm.importance_sampling_level=sequence"])
    assert r.algorithm.loss_type == "luspo"
    with pytest.raises(RecipeError, match="importance_sampling_level: sequence"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.loss_type=luspo"])
    with pytest.raises(RecipeError, match="set algorithm.importance_sampling_level: token"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.loss_type=vespo", "algorithm.importance_sampling_level=sequence"])
    r = load_recipe("recipes/ci-tiny.yaml", ["algorithm.loss_type=vespo", "algorithm.vespo_k_pos=1.5"])
    assert (r.algorithm.vespo_k_pos, r.algorithm.vespo_lambda_pos, r.algorithm.vespo_k_neg,
            r.algorithm.vespo_lambda_neg) == (1.5, 3.0, 3.0, 2.0)  # TRL's defaults otherwise
    with pytest.raises(RecipeError, match="vespo folds the sampler's per-token ratios"):
        load_recipe("recipes/ci-tiny.yaml", ["algorithm.loss_type=vespo", "rollout.dtype=bfloat16",
                                             "rollout.importance_sampling=sequence_truncate"])
