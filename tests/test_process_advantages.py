"""Process supervision's advantages (DeepSeekMath sec. 4.1.3), by hand: a group's step rewards normalised
together, a token's advantage the sum over the steps of its completion that end at or after it."""

import math

import pytest
import torch

from grpo_cli.algo.advantages import EPS, process_advantages, step_signal
from grpo_cli.algo.losses import compute_loss

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
    loss, _ = compute_loss("grpo", logps, logps.detach(), adv, mask, epsilon_low=0.2, epsilon_high=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-((1 - 2 + 0.5) / 3 + (0.25 + 0) / 2) / 2)
    assert logps.grad.view(-1).tolist() == pytest.approx([-1 / 6, 2 / 6, -0.5 / 6, -0.25 / 4, 0.0, 0.0])
    # a [N] advantage is the same as that value on every token
    flat, _ = compute_loss("grpo", logps, logps.detach(), torch.tensor([1.0, -1.0]), mask, epsilon_low=0.2, epsilon_high=0.2)
    per_token, _ = compute_loss("grpo", logps, logps.detach(), torch.tensor([[1.0] * 3, [-1.0] * 3]), mask,
                                epsilon_low=0.2, epsilon_high=0.2)
    assert flat.item() == pytest.approx(per_token.item())


def test_which_groups_have_step_signal():
    steps = [[(0, 1.0)], [(0, 0.0)], [(1, 1.0)], [(0, 1.0), (2, 1.0)], [(0, None)], [], [(3, 0.5)], []]
    # group 0: 1 vs 0; group 1: all 1; group 2: no reward; group 3: one reward
    assert step_signal(steps, 2) == [True, False, False, False]
