"""The hf backend runs each distinct prompt through the model once per generate (a group's G rows share
it) and samples the same tokens as running every row's prompt."""

import pytest
import torch

import grpo_cli.rollout.hf as hf
from grpo_cli.recipe.schema import RolloutConfig

from test_rollout_dtype import Tok, tiny

torch.set_num_threads(1)

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15]]


def _generate(model, prompts, n, share: bool, monkeypatch, dtype="policy"):
    monkeypatch.setattr(hf, "shared_prefill", hf.shared_prefill if share else (lambda *a, **k: None))
    batches = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: batches.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    torch.manual_seed(3)
    try:
        out = hf.HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8, dtype=dtype)).generate(
            prompts, [str(i) for i in range(len(prompts))], n=n)
    finally:
        hook.remove()
    return out, batches


@pytest.mark.parametrize("n", [1, 4])
def test_each_distinct_prompt_runs_once_and_the_samples_are_the_same(n, monkeypatch):
    model = tiny()
    prompts = PROMPTS if n > 1 else [p for p in PROMPTS for _ in range(4)]  # the engine's pre-repeated rows
    shared, batches = _generate(model, prompts, n, True, monkeypatch)
    plain, plain_batches = _generate(model, prompts, n, False, monkeypatch)
    # the prefill: 3 distinct prompts, all but the last of 5 (left-padded) positions; then one position per row
    assert batches[:2] == [(3, 4), (12, 1)] and plain_batches[0] == (12, 5)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)


def test_sampler_logprobs_of_a_bf16_copy_are_the_same_with_the_shared_prefill(monkeypatch):
    model = tiny()
    shared, _ = _generate(model, PROMPTS, 4, True, monkeypatch, dtype="bfloat16")
    plain, _ = _generate(model, PROMPTS, 4, False, monkeypatch, dtype="bfloat16")
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.allclose(shared.sampling_logps, plain.sampling_logps, atol=1e-2)


def test_nothing_is_shared_when_every_prompt_differs(monkeypatch):
    model = tiny()
    _, batches = _generate(model, PROMPTS, 1, True, monkeypatch)
    assert batches[0] == (3, 5)  # generate's own prefill of every row
