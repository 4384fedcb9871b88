import math

import pytest
import torch

from grpo_cli.algo.advantages import compute_advantages, group_std

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
