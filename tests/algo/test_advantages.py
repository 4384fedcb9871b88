"""Process supervision's per-token advantages (sec. 4.1.3) and GDPO's normalize_then_sum (TRL's multi_objective_aggregation), hand-computed too."""

import math

import pytest
import torch

from grpo_cli.algo.advantages import (
    EPS, compute_advantages, group_std, normalize_then_sum, process_advantages, step_signal,
)
from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe

from helpers import loss_of

NAN = float("nan")


def test_group_scale_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    adv = compute_advantages(r, 4, "group")
    # group 1: mean 0.5, centered +-0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.577350
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # 0.865875
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0, 0, 0, 0]), rtol=0, atol=1e-6)


def test_batch_scale_uses_std_of_whole_batch():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    adv = compute_advantages(r, 4, "batch")
    # batch mean 0.5, squared deviations sum to 4 * 0.25 = 1, unbiased std = sqrt(1 / 7) = 0.377964
    a = 0.5 / (math.sqrt(1 / 7) + 1e-4)  # 1.322183
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0, 0, 0, 0]), rtol=0, atol=1e-6)


def test_none_scale_is_centered_reward():
    r = torch.tensor([3.0, 1.0, 2.0, 2.0])
    torch.testing.assert_close(compute_advantages(r, 2, "none"), torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_nan_rewards_are_left_out_and_get_zero():
    r = torch.tensor([1.0, NAN, 0.0, 0.0, NAN, NAN, NAN, NAN])
    adv = compute_advantages(r, 4, "group")
    # valid {1, 0, 0}: mean 1/3; centered 2/3, -1/3, -1/3; std = sqrt((4/9 + 1/9 + 1/9) / 2) = 0.577350
    s = math.sqrt(1 / 3) + 1e-4
    expected = torch.tensor([(2 / 3) / s, 0.0, (-1 / 3) / s, (-1 / 3) / s, 0, 0, 0, 0])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert not torch.isnan(adv).any()


def test_matches_reference_loop_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(6 * 5, generator=g)
    r[torch.rand(30, generator=g) < 0.2] = NAN
    for scale in ("group", "batch", "none"):
        adv = compute_advantages(r, 5, scale)
        valid_all = r[~torch.isnan(r)]
        for i in range(30):
            grp = r[(i // 5) * 5 : (i // 5) * 5 + 5]
            vals = grp[~torch.isnan(grp)]
            if torch.isnan(r[i]):
                assert adv[i] == 0
                continue
            std = {"group": vals.std() if len(vals) > 1 else torch.tensor(0.0), "batch": valid_all.std(), "none": None}[scale]
            ref = r[i] - vals.mean()
            if std is not None:
                ref = ref / (std + 1e-4)
            assert abs(adv[i].item() - ref.item()) < 1e-5, (scale, i)


def test_group_std_and_shape_errors():
    torch.testing.assert_close(group_std(torch.tensor([1.0, 1.0, 0.0, 2.0]), 2), torch.tensor([0.0, math.sqrt(2)]))
    with pytest.raises(ValueError, match="G=3"):
        compute_advantages(torch.zeros(4), 3, "group")
    with pytest.raises(KeyError, match="valid: batch, group, none"):
        compute_advantages(torch.zeros(4), 2, "grp")


torch.set_num_threads(1)


def test_two_completions_normalised_together_and_summed_from_the_end():
    # completion 0: steps ending at tokens 1 (reward 1) and 3 (reward 0); completion 1: one step at token 2 (reward 1)
    adv = process_advantages([[(1, 1.0), (3, 0.0)], [(2, 1.0)]], group_size=2, length=5)
    # R = [1, 0, 1]: mean 2/3, unbiased std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3) + EPS
    up, down = (1 - 2 / 3) / std, (0 - 2 / 3) / std  # +0.5773, -1.1545
    assert adv[0].tolist() == pytest.approx([up + down, up + down, down, down, 0.0], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([up, up, up, 0.0, 0.0], abs=1e-5)


def test_none_steps_are_left_out():
    with_none = process_advantages([[(0, 1.0), (2, None)], [(1, 0.0)]], group_size=2, length=4)
    # only R = [1, 0] counts: mean 1/2, std sqrt(1/2)
    r = 0.5 / (math.sqrt(0.5) + EPS)
    assert with_none[0].tolist() == pytest.approx([r, 0, 0, 0], abs=1e-5)
    assert with_none[1].tolist() == pytest.approx([-r, -r, 0, 0], abs=1e-5)


def test_steps_beyond_the_width_count_in_the_group_but_are_not_placed():
    # a process with 2 columns holding row 0 of a group whose row 1 (another process's) has a step at token 5
    adv = process_advantages([[(1, 1.0)], [(5, 0.0)]], group_size=2, length=2)
    r = 0.5 / (math.sqrt(0.5) + EPS)
    assert adv[0].tolist() == pytest.approx([r, r], abs=1e-5) and adv[1].tolist() == [0.0, 0.0]


def test_a_group_with_one_step_reward_has_no_signal():
    adv = process_advantages([[(2, 1.0)], [], [(0, None)], []], group_size=2, length=3)
    assert torch.equal(adv, torch.zeros(4, 3))  # group 0: one reward (std 0: r - mean = 0); group 1: none


def test_groups_are_normalised_apart():
    adv = process_advantages([[(0, 1.0)], [(0, 0.0)], [(0, 10.0)], [(0, 20.0)]], group_size=2, length=1)
    r = 0.5 / (math.sqrt(0.5) + EPS)
    r2 = 5.0 / (math.sqrt(50.0) + EPS)
    assert adv.view(-1).tolist() == pytest.approx([r, -r, -r2, r2], abs=1e-5)


def test_the_loss_takes_per_token_advantages():
    # on-policy (w = 1): grpo's loss is -mean over sequences of the token mean of A_t; its gradient -A_t / (T_i N)
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5], [0.25, 0.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, _ = loss_of("grpo", logps, logps.detach(), adv, mask, epsilon_low=0.2, epsilon_high=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-((1 - 2 + 0.5) / 3 + (0.25 + 0) / 2) / 2)
    assert logps.grad.view(-1).tolist() == pytest.approx([-1 / 6, 2 / 6, -0.5 / 6, -0.25 / 4, 0.0, 0.0])
    # a [N] advantage is the same as that value on every token
    flat, _ = loss_of("grpo", logps, logps.detach(), torch.tensor([1.0, -1.0]), mask, epsilon_low=0.2, epsilon_high=0.2)
    per_token, _ = loss_of("grpo", logps, logps.detach(), torch.tensor([[1.0] * 3, [-1.0] * 3]), mask,
                                epsilon_low=0.2, epsilon_high=0.2)
    assert flat.item() == pytest.approx(per_token.item())


def test_which_groups_have_step_signal():
    steps = [[(0, 1.0)], [(0, 0.0)], [(1, 1.0)], [(0, 1.0), (2, 1.0)], [(0, None)], [], [(3, 0.5)], []]
    # group 0: 1 vs 0; group 1: all 1; group 2: no reward; group 3: one reward
    assert step_signal(steps, 2) == [True, False, False, False]


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


# ----- a group without signal gets exactly 0 (issue 21, defect 2) -----------------------------------------------
# "No signal": fewer than two rewards, or their std at most ZERO_STD (1e-6), the std taken in float64 so that equal
# rewards give exactly 0. Before, float32 rounding of the group mean leaked through the 1e-4 denominator.
EQUAL_VALUES = [0.9, 5.7, 0.1, 1 / 3, 2.2, 123.456, -7.77, 1e6 + 0.1, 3e-5, 0.7]


def test_equal_step_rewards_give_exactly_zero():
    # the cases: three steps rewarded 0.9 gave 1.8e-3, 1.2e-3, 6e-4; twenty steps at 5.7 gave 0.095
    assert torch.equal(process_advantages([[(0, 0.9), (1, 0.9), (2, 0.9)], []], 2, 3), torch.zeros(2, 3))
    assert torch.equal(process_advantages([[(i, 5.7) for i in range(20)], []], 2, 20), torch.zeros(2, 20))
    for v in EQUAL_VALUES:
        for n_steps in (2, 3, 7, 20):
            steps = [[(t, v) for t in range(n_steps)], [(0, v), (4, None)], [], [(1, v)]]
            assert step_signal(steps, 4) == [False]
            assert torch.equal(process_advantages(steps, 4, n_steps), torch.zeros(4, n_steps)), (v, n_steps)


def test_step_advantages_are_zero_exactly_where_step_signal_says_none():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        G, T = 3, 6
        pool = [0.9, 5.7, 1 / 3] if torch.rand(1, generator=g) < 0.5 else [0.9]
        steps = [[(int(t), pool[int(torch.randint(len(pool), (1,), generator=g))])
                  for t in torch.randint(T, (int(torch.randint(3, (1,), generator=g)),), generator=g)]
                 for _ in range(2 * G)]
        adv = process_advantages(steps, G, T).view(2, -1)
        for grp, signal in enumerate(step_signal(steps, G)):
            assert signal == bool(adv[grp].abs().sum() > 0), (steps, adv)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_outcome_rewards_give_exactly_zero(scale):
    # the float32 mean of 8 rewards of 5.7 is not 5.7: TRL 1.16 gives each -0.0047 (group scale); grpo gives 0
    for v in EQUAL_VALUES:
        for G in (2, 3, 7, 8, 16):
            r = torch.cat([torch.full((G,), v), torch.arange(G, dtype=torch.float32)])  # one flat group, one not
            r[G] = NAN  # a missing reward in the second group changes nothing
            adv = compute_advantages(r, G, scale)
            assert torch.equal(adv[:G], torch.zeros(G)), (v, G, adv[:G])
            assert G == 2 or adv[G + 1 :].abs().max() > 0  # (with G = 2 one reward is left: no signal)
            constant_with_nan = torch.full((G,), v)
            constant_with_nan[0] = NAN
            assert torch.equal(compute_advantages(constant_with_nan, G, scale), torch.zeros(G))


def test_groups_with_signal_keep_their_float32_advantages():
    # only flat groups change: the others are TRL's float32 formula, bit for bit as before
    r = torch.tensor([0.9, 0.9, 0.9, 1.0, 5.7, 5.6, 5.8, 5.7])
    adv = compute_advantages(r, 4, "group")
    x = r.view(2, 4)
    centered = x - x.mean(1, keepdim=True)
    expected = (centered / (x.std(1, keepdim=True) + EPS)).view(-1)
    assert torch.equal(adv, expected)


def test_normalize_then_sum_ignores_a_function_without_signal_in_a_group():
    # function 2 is flat in both groups: its float32 residue must not reach the batch normalisation
    for v in EQUAL_VALUES:
        for G in (3, 7, 8):
            flat = torch.full((2 * G,), v)
            per_function = torch.stack([torch.arange(2 * G, dtype=torch.float32) % 2, flat], dim=1)
            alone = normalize_then_sum(per_function[:, :1], [1.0], G)
            assert torch.equal(normalize_then_sum(per_function, [1.0, 1.0], G), alone), (v, G)
            assert torch.equal(normalize_then_sum(flat[:, None], [1.0], G), torch.zeros(2 * G))


# --------------------------------------------------------------------------- the estimator axis (issue 36)

def test_rloo_compares_each_reward_with_the_mean_of_the_others():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, math.nan, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0])
    adv = compute_advantages(r, 4, "none", "rloo")
    # group 1: 1 - (0 + 0 + 1) / 3 = 2/3, 0 - (1 + 0 + 1) / 3 = -2/3; group 2 (3 rewards): 1 - 0 = 1,
    # 0 - (1 + 0) / 2 = -0.5, the missing one 0; group 3: no signal
    want = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.0, 0.0, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(want))
    std = math.sqrt(4 * 0.25 / 3)  # group 1's unbiased std: scale_rewards group divides by it (+ EPS)
    torch.testing.assert_close(compute_advantages(r, 4, "group", "rloo")[:4], torch.tensor(want[:4]) / (std + EPS))


def test_reinforce_plus_plus_baseline_whitens_the_group_centered_rewards_over_the_batch():
    r = torch.tensor([0.0, 1.0, 3.0, 5.0, 2.0, 2.0])
    adv = compute_advantages(r, 2, "batch", "reinforce_plus_plus_baseline")
    # centered: [-0.5, 0.5, -1, 1, 0, 0]; batch mean 0; unbiased std sqrt((0.25 + 0.25 + 1 + 1 + 0 + 0) / 5)
    std = math.sqrt(2.5 / 5)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5, -1.0, 1.0, 0.0, 0.0]) / (std + EPS))
    # with a missing reward: the group's mean and the batch's statistics leave it out, and it gets 0
    with_nan = compute_advantages(torch.tensor([0.0, 1.0, 4.0, math.nan]), 2, "batch", "reinforce_plus_plus_baseline")
    assert with_nan[2] == 0 and with_nan[3] == 0 and torch.isfinite(with_nan).all()
    std = math.sqrt((0.25 + 0.25 + 0.0) / 2)  # centered [-0.5, 0.5, 0]: the lone reward centres to 0
    torch.testing.assert_close(with_nan[:2], torch.tensor([-0.5, 0.5]) / (std + EPS))


def test_grpo_is_the_default_estimator_and_every_estimator_has_its_spec():
    from grpo_cli.algo.advantages import ESTIMATORS
    from grpo_cli.recipe.specs import ESTIMATORS as SPECS

    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 1.0])
    torch.testing.assert_close(compute_advantages(r, 4, "group"), compute_advantages(r, 4, "group", "grpo"))
    assert set(ESTIMATORS.names()) == set(SPECS)
