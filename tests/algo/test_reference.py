"""The reference refresh (grpo_cli/algo/reference.py): pi_ref <- alpha pi_theta + (1 - alpha) pi_ref, by hand."""

import torch

from grpo_cli.algo.reference import mix_into


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
