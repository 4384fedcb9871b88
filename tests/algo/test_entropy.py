"""The entropy bonus: the differentiable entropy (analytic gradient and finite differences) and Skywork-OR1's
adaptive coefficient (TRL 1.16's rule, step by step, and its state)."""

import math

import pytest
import torch

from grpo_cli.algo.entropy import EntropyControl
from grpo_cli.algo.logprobs import entropy_from_logits

torch.set_num_threads(1)


def test_entropy_value_and_gradient_by_hand():
    # logits (0, log 2, log 3) at T = 1: p = (1, 2, 3) / 6; H = -sum p log p
    z = torch.tensor([[[0.0, math.log(2), math.log(3)]]], requires_grad=True)
    p = [1 / 6, 2 / 6, 3 / 6]
    h = -sum(q * math.log(q) for q in p)  # 1.011404
    out = entropy_from_logits(z, 1.0, grad=True)
    assert out.item() == pytest.approx(h, abs=1e-6)
    out.sum().backward()
    # dH/dz_j = -p_j (log p_j + H)
    assert z.grad.view(-1).tolist() == pytest.approx([-q * (math.log(q) + h) for q in p], abs=1e-6)
    # at temperature T: H(softmax(z / T)), dH/dz_j = -p_j (log p_j + H) / T
    z.grad = None
    entropy_from_logits(z, 2.0, grad=True).sum().backward()
    p2 = torch.softmax(z.detach().view(-1) / 2, -1).tolist()
    h2 = -sum(q * math.log(q) for q in p2)
    assert z.grad.view(-1).tolist() == pytest.approx([-q * (math.log(q) + h2) / 2 for q in p2], abs=1e-6)


def test_entropy_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    z = (3 * torch.randn(2, 3, 11, generator=g, dtype=torch.float64))
    weights = torch.rand(2, 3, generator=g, dtype=torch.float64)
    zz = z.float().requires_grad_(True)
    (entropy_from_logits(zz, 0.7, grad=True).double() * weights).sum().backward()

    def f(x):
        x = x / 0.7
        logp = x - torch.logsumexp(x, -1, keepdim=True)
        return (-(logp.exp() * logp).sum(-1) * weights).sum()

    eps = 1e-5
    for idx in [(0, 0, 0), (0, 2, 5), (1, 1, 10), (1, 2, 3)]:
        up, down = z.clone(), z.clone()
        up[idx] += eps
        down[idx] -= eps
        fd = (f(up) - f(down)).item() / (2 * eps)
        assert zz.grad[idx].item() == pytest.approx(fd, abs=2e-5), idx


def test_without_grad_the_entropy_is_the_same_numbers():
    z = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(entropy_from_logits(z, 1.3), entropy_from_logits(z, 1.3, grad=True).detach())
    assert not entropy_from_logits(z.requires_grad_(True), 1.3).requires_grad


def test_static_coefficient_never_moves():
    c = EntropyControl(0.01)
    for h in (0.0, 5.0, 0.1):
        assert c.applied() == 0.01
        c.step(h)
    assert c.coef == 0.01


def test_adaptive_control_step_by_step():
    # TRL 1.16: nothing is applied until a step's entropy is known; then c moves by delta towards keeping H at the
    # target, clamped to [min, max], and applies only while the last H was at or below the target
    c = EntropyControl(0.0, adaptive=True, target=0.2, delta=0.005, coef_min=0.0, coef_max=0.012)
    seen = []
    for h in (0.5, 0.1, 0.2, 0.15, 0.05, 0.3, 0.3, 0.3, 0.1):
        seen.append(c.applied())
        c.step(h)
        seen.append(round(c.coef, 6))
    assert seen == [
        0.0, 0.0,  # H unknown: applies 0; 0.5 > 0.2: 0 - 0.005 -> clamped to 0
        0.0, 0.005,  # last H 0.5 > target: applies 0; 0.1 <= 0.2: up
        0.005, 0.01,  # last H 0.1: applies c; 0.2 <= 0.2 (at the target counts): up
        0.01, 0.012,  # up, clamped to the max
        0.012, 0.012,
        0.012, 0.007,  # 0.3 > 0.2: down
        0.0, 0.002, 0.0, 0.0,  # last H above the target: nothing applied; down to the min
        0.0, 0.005,
    ]


def test_the_state_round_trips_through_json():
    import json

    c = EntropyControl(0.02, adaptive=True)
    fresh = EntropyControl(0.02, adaptive=True)
    fresh.load_state_dict(json.loads(json.dumps(c.state_dict())))  # inf (no step yet) survives as null
    assert fresh.last_entropy == math.inf and fresh.applied() == 0.0
    c.step(0.1)
    fresh.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert (fresh.coef, fresh.last_entropy, fresh.applied()) == (c.coef, 0.1, c.coef)
