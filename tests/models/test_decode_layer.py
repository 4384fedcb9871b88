"""The fused decode step of a Llama-style layer (grpo_cli/models/decode_layer.py): the layer's own output and cache
to float rounding, with and without padding, biases, tails of every product; the same result whatever the threads;
the layer's own forward wherever it does not apply; a new plan when a parameter is replaced; and a `generate` through
it that samples the policy's distribution."""

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_cli.models import decode_layer, few_rows
from grpo_cli.models.linear import use_accumulating_linears
from grpo_cli.models.rmsnorm import use_lean_norms
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.preallocated import preallocated

from helpers import KERNEL_WIDTHS, IdsTokenizer as Tok, two_tokens_p_values

torch.set_num_threads(1)

needs_kernel = pytest.mark.skipif(few_rows.library() is None, reason="no C compiler, AVX2 or AVX-512 on this machine")


def decoder(kind: str, vocab: int = 64) -> torch.nn.Module:
    """A random 2-layer Llama or Qwen2 (biased q/k/v) with heads of 16 on a grouped key/value head, and an MLP of 102
    (every product has a tail of rows and of K), as load_model installs it."""
    torch.manual_seed(0)
    dims = dict(vocab_size=vocab, hidden_size=64, intermediate_size=102, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-5)
    model = (Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **dims)) if kind == "qwen2"
             else LlamaForCausalLM(LlamaConfig(**dims))).eval()
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0)
    use_lean_norms(model)
    use_accumulating_linears(model)
    assert decode_layer.use_fused_decode(model) == 2
    return model


def counted(monkeypatch) -> list:
    lib, calls = few_rows.library(), []
    real = lib.decode_layer
    monkeypatch.setattr(lib, "decode_layer", lambda spec: calls.append(1) or real(spec))
    return calls


def decode(model, rows: int, padded: bool, steps: int, fused: bool, cache_of=preallocated):
    """A prefill of 7 positions (the first rows left-padded by 1-3 when `padded`) and `steps` one-token steps ->
    (each step's logits, the first layer's keys and values)."""
    g = torch.Generator().manual_seed(rows)
    ids = torch.randint(2, 64, (rows, 7), generator=g)
    mask = torch.ones(rows, 7, dtype=torch.long)
    if padded:
        for r in range(min(rows, 3)):
            mask[r, : r + 1] = 0
    new = torch.randint(2, 64, (rows, steps), generator=g)
    out = []
    with torch.no_grad(), few_rows.sampling():
        cache = cache_of(None, model, 16)
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
              past_key_values=cache, use_cache=True)
        for s in range(steps):
            position = mask.sum(1, keepdim=True)
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], 1)
            if not fused:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(decode_layer, "LAYERS", set())
                    logits = model(input_ids=new[:, s:s + 1], attention_mask=mask, position_ids=position,
                                   past_key_values=cache, use_cache=True).logits
            else:
                logits = model(input_ids=new[:, s:s + 1], attention_mask=mask, position_ids=position,
                               past_key_values=cache, use_cache=True).logits
            out.append(logits)
    return torch.cat(out, 1), cache.layers[0].keys, cache.layers[0].values


@needs_kernel
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("rows, padded", [(4, True), (5, False), (16, True), (24, True)])
def test_a_decode_step_is_the_layers_own_to_float_rounding(monkeypatch, kind, rows, padded):
    model = decoder(kind)
    calls = counted(monkeypatch)
    got = decode(model, rows, padded, 3, fused=True)
    assert len(calls) == 3 * 2  # every layer of every one-token step; not the prefill
    want = decode(model, rows, padded, 3, fused=False)
    assert len(calls) == 6
    assert not torch.equal(got[0], want[0])  # its own sums, in another order
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", list(KERNEL_WIDTHS))
def test_each_vector_width_is_the_layers_own_step(monkeypatch, kernels, width):
    """The AVX2 build (8 lanes: masked tails of the softmax and SiLU by comparison, exponentials scaled in two steps)
    and the AVX-512 one, each where the CPU runs it, whatever this machine's own build is."""
    monkeypatch.setattr(few_rows, "library", lambda: kernels(width))
    model = decoder("qwen2")
    calls = counted(monkeypatch)
    for rows, padded in ((5, True), (16, True)):
        got = decode(model, rows, padded, 3, fused=True)
        want = decode(model, rows, padded, 3, fused=False)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 * 3 * 2


@needs_kernel
def test_the_threads_do_not_change_it():
    model = decoder("qwen2")
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(decode(model, 16, True, 2, fused=True))
    finally:
        torch.set_num_threads(1)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@needs_kernel
def test_where_it_does_not_apply_the_layer_runs_its_own(monkeypatch):
    model = decoder("llama")
    calls = counted(monkeypatch)
    decode(model, 3, True, 2, fused=True)  # 3 rows: outside FEW_ROWS
    decode(model, 16, True, 2, fused=True, cache_of=lambda c, m, n: DynamicCache(config=m.config))  # a growing cache
    ids = torch.randint(2, 64, (8, 1))
    with torch.no_grad():  # not sampling: an old policy's or a reference's forward
        model(input_ids=ids, past_key_values=preallocated(None, model, 8), use_cache=True)
    with few_rows.sampling():  # under autograd
        model(input_ids=ids, past_key_values=preallocated(None, model, 8), use_cache=True).logits.sum().backward()
    assert calls == []
    model.model.layers[0].mlp.act_fn = torch.nn.GELU()  # not what the C code computes: that layer only
    decode(model, 8, False, 1, fused=True)
    assert len(calls) == 1
    bf16 = decoder("llama").to(torch.bfloat16)
    ids = torch.randint(2, 64, (8, 4))
    with torch.no_grad(), few_rows.sampling():
        cache = preallocated(None, bf16, 8)
        bf16(input_ids=ids, past_key_values=cache, use_cache=True)
        bf16(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
    assert len(calls) == 1


@needs_kernel
def test_a_replaced_parameter_makes_a_new_plan():
    """The plan keeps the parameters' addresses: a weight written in place is read as it is now, and one replaced
    (`.data =`, as a cast or a move does) makes a new plan, never a read of the old memory."""
    model = decoder("qwen2")
    down = model.model.layers[1].mlp.down_proj
    with torch.no_grad():
        down.weight.mul_(2)
    torch.testing.assert_close(decode(model, 8, True, 2, fused=True), decode(model, 8, True, 2, fused=False),
                               rtol=1e-5, atol=1e-5)
    plan = decode_layer.PLANS[model.model.layers[1]]
    down.weight.data = down.weight.data * -1  # new memory
    torch.testing.assert_close(decode(model, 8, True, 2, fused=True), decode(model, 8, True, 2, fused=False),
                               rtol=1e-5, atol=1e-5)
    copy = __import__("copy").deepcopy(model)  # as the sampling copy is made: no plan travels with it
    assert copy.model.layers[1] not in decode_layer.PLANS
    torch.testing.assert_close(decode(copy, 8, True, 2, fused=True), decode(model, 8, True, 2, fused=True))
    assert decode_layer.PLANS[model.model.layers[1]] is not plan


@needs_kernel
def test_a_plan_is_checked_once_a_sampling_context(monkeypatch):
    """Within one `few_rows.sampling()` (a generate) the weights do not move: each layer's parts are looked up once
    there, not at every step; the next context looks again (so a parameter replaced between two is seen)."""
    model = decoder("qwen2")
    looked = []
    real = decode_layer._parts
    monkeypatch.setattr(decode_layer, "_parts", lambda layer: looked.append(layer) or real(layer))
    calls = counted(monkeypatch)
    decode(model, 8, True, 5, fused=True)
    assert len(calls) == 2 * 5  # both layers fused at each of the 5 steps
    assert looked == list(model.model.layers)  # ... and each looked up once
    decode(model, 8, True, 5, fused=True)
    assert len(looked) == 4
    assert few_rows.sampling_context() == 0
    with few_rows.sampling():
        outer = few_rows.sampling_context()
        with few_rows.sampling():
            assert few_rows.sampling_context() not in (0, outer)
        assert few_rows.sampling_context() == outer


@needs_kernel
def test_generate_through_it_samples_the_policys_distribution(monkeypatch):
    """4,800 first and second tokens of one prompt at temperature 0.8, drawn by `generate` 16 rows at a time, each
    token after a fused step of both layers: a chi-square test at each position against the model's own
    distribution (as tests/models/test_few_rows.py's)."""
    model = decoder("qwen2")
    calls = counted(monkeypatch)
    torch.manual_seed(5)
    gen = HFGenerator(model, Tok(), RolloutConfig(max_completion_length=2, temperature=0.8))
    drawn = torch.cat([gen.generate([[5, 6, 7, 8]], ["a"], n=16).completion_ids for _ in range(300)])
    assert len(calls) == 300 * 2 * 2  # both layers, at the prompt's last position and at the first token
    first, second = two_tokens_p_values(model, drawn, [5, 6, 7, 8], 0.8)  # its own forward: not sampling
    assert first > 0.01 and second > 0.01, (first, second)
