"""Completion log-probs: a group's shared prompt runs once, with the same values and gradients as G times."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_cli.algo.logprobs import token_logprobs

torch.set_num_threads(1)

B, G, P, T = 3, 4, 7, 9


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**common))
    return model.float().train()


def batch(pad_id: int = 0) -> tuple[torch.Tensor, ...]:
    """B left-padded prompts (different lengths) x G right-padded completions, rows shuffled."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(1, 300, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    for i, pad in enumerate([0, 3, 1]):
        prompt_ids[i, :pad], prompt_mask[i, :pad] = pad_id, 0
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
    completion_ids = torch.randint(1, 300, (B * G, T), generator=g)
    completion_mask = torch.ones(B * G, T, dtype=torch.long)
    completion_mask[3, 5:], completion_mask[7, 1:] = 0, 0
    perm = torch.randperm(B * G, generator=g)
    return prompt_ids[perm], prompt_mask[perm], completion_ids[perm], completion_mask[perm]


def run(model, shared: bool, args) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], int]:
    tokens = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: tokens.append(i[0].numel()))
    model.zero_grad()
    logps, entropy = token_logprobs(model, *args, temperature=0.7, with_entropy=True, shared_prompts=shared)
    hook.remove()
    (logps * args[3]).sum().backward()
    return logps.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}, sum(tokens)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_shared_prompts_give_the_same_logprobs_and_gradients_at_a_fraction_of_the_tokens(kind):
    model, args = tiny(kind), batch()
    plain, shared = run(model, False, args), run(model, True, args)
    assert plain[3] == B * G * (P + T)  # every row runs its own copy of the prompt
    assert shared[3] == B * P + B * G * T  # each distinct prompt runs once
    assert (plain[0] - shared[0]).abs().max() < 1e-5
    assert (plain[1] - shared[1]).abs().max() < 1e-4
    grads_plain, grads_shared = plain[2], shared[2]
    assert max(g.abs().max() for g in grads_plain.values()) > 1e-1  # a real gradient
    for name, g in grads_plain.items():
        torch.testing.assert_close(grads_shared[name], g, atol=2e-5, rtol=1e-4, msg=name)


def test_distinct_prompts_take_the_plain_forward_and_checkpointing_falls_back_to_it():
    model = tiny("qwen2")
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch()
    distinct = prompt_ids.clone()
    distinct[:, -1] = torch.arange(B * G)  # every row's prompt differs in its last token
    assert run(model, True, (distinct, prompt_mask, completion_ids, completion_mask))[3] == B * G * (P + T)
    reference = run(model, False, batch())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = run(model, True, batch())  # HF returns no cache under checkpointing: the plain forward runs
    assert (reference[0] - checkpointed[0]).abs().max() < 1e-5
    for name, g in reference[2].items():
        torch.testing.assert_close(checkpointed[2][name], g, atol=2e-5, rtol=1e-4, msg=name)
