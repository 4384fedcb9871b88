"""sdpa_grouped (grpo_cli/models/attention.py): transformers' sdpa attention without repeated keys/values. The same
log-probs, gradients and sampled tokens as sdpa on a grouped-query model with left padding; no [b, heads, k, d] copy
of the keys and values saved for the backward; chosen by load_model where transformers picks sdpa."""

import gc
import json

import pytest
import torch

from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.models import attention
from grpo_cli.models.attention import NAME, fold_mask, use_grouped_sdpa

from helpers import saved_for_backward


def gqa_model(heads: int = 6, kv: int = 2, seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()


def twin(model):
    """A second model with the same weights, switched to sdpa_grouped."""
    import copy

    other = copy.deepcopy(model)
    assert use_grouped_sdpa(other) and other.config._attn_implementation == NAME
    return other


def batch(rows: int = 6, group: int = 3, P: int = 7, T: int = 5, seed: int = 1):
    """Left-padded prompts, each repeated `group` times (a GRPO step's rows), and completions with some padding."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 97, (rows // group, P), generator=g).repeat_interleave(group, 0)
    pmask = torch.ones(rows, P, dtype=torch.long)
    pmask[:group, :3] = 0  # the first prompt is shorter: left padding
    completions = torch.randint(3, 97, (rows, T), generator=g)
    cmask = torch.ones(rows, T, dtype=torch.long)
    cmask[1, 3:] = 0
    return prompts, pmask, completions, cmask


def test_fold_mask_repeats_the_rows_for_each_query_head_copy():
    mask = torch.arange(2 * 3 * 4).reshape(2, 1, 3, 4)
    folded = fold_mask(mask, 2)
    assert folded.shape == (2, 1, 6, 4)
    assert torch.equal(folded[:, :, :3], mask) and torch.equal(folded[:, :, 3:], mask)


@pytest.fixture(params=["native", "fold"])
def kernel(request, monkeypatch):
    """Both ways, on the CPU: its kernel's own grouped heads (enable_gqa), and the fold that CUDA runs."""
    if request.param == "fold":
        monkeypatch.setattr(attention, "NATIVE_GQA", set())
    return request.param


@pytest.mark.parametrize("shared_prompts", [True, False])
def test_log_probs_and_gradients_equal_sdpa(shared_prompts, kernel):
    torch.set_num_threads(1)
    plain = gqa_model()
    grouped = twin(plain)
    p, pm, c, cm = batch()
    grads = []
    for model in (plain, grouped):
        lp, _ = token_logprobs(model, p, pm, c, cm, shared_prompts=shared_prompts)
        (lp * cm).sum().backward()
        grads.append((lp.detach(), {n: q.grad for n, q in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0)
    for name, g in g0.items():
        assert torch.allclose(g, g1[name], atol=1e-5, rtol=1e-4), name
    assert lp0.abs().min() > 0.5  # real log-probs over 97 tokens, not zeros


def saved_bytes(model, p, pm, c, cm) -> tuple[int, set]:
    """The bytes of the storages a forward keeps for the backward, and their shapes (as first saved)."""
    with saved_for_backward(model) as saved:
        token_logprobs(model, p, pm, c, cm, shared_prompts=False)
    kept: dict[int, tuple] = {}
    for address, shape, nbytes, _ in saved:
        kept.setdefault(address, (nbytes, shape))
    return sum(n for n, _ in kept.values()), {s for _, s in kept.values()}


def test_no_repeated_keys_and_values_are_saved_for_the_backward(kernel):
    torch.set_num_threads(1)
    plain = gqa_model(heads=6, kv=2)
    grouped = twin(plain)
    p, pm, c, cm = batch()
    rows, L, d = p.shape[0], p.shape[1] + c.shape[1], 48 // 6
    plain_bytes, plain_shapes = saved_bytes(plain, p, pm, c, cm)
    grouped_bytes, grouped_shapes = saved_bytes(grouped, p, pm, c, cm)
    assert (rows, 6, L, d) in plain_shapes and (rows, 2, L, d) not in plain_shapes  # sdpa saves the repeated ones
    assert (rows, 2, L, d) in grouped_shapes  # the 2 key/value heads themselves
    unit = rows * L * d * 4  # one head's [rows, L, d] in fp32
    # sdpa keeps keys and values of 6 heads per layer; the kernel's own grouping 2 (the fold also a copy of the
    # 6 query heads, whose memory order [rows, L, heads, d] does not fold as a view)
    saved = 2 * (2 * 6 - 2 * 2 - (6 if kernel == "fold" else 0)) * unit
    assert plain_bytes - grouped_bytes >= saved - 2 * rows * 12 * 12 * 4  # less sdpa's per-layer boolean-mask copies


@pytest.mark.parametrize("do_sample", [True, False])
def test_generate_samples_the_same_tokens(do_sample, kernel):
    torch.set_num_threads(1)
    plain = gqa_model(heads=4, kv=1).eval()
    grouped = twin(plain)
    p, pm, _, _ = batch()
    outs = []
    for model in (plain, grouped):
        torch.manual_seed(3)
        outs.append(model.generate(input_ids=p, attention_mask=pm, max_new_tokens=12, min_new_tokens=12,
                                   do_sample=do_sample, top_k=0, top_p=1.0, pad_token_id=0))
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == (6, 7 + 12)


@pytest.mark.parametrize("fold", [False, True])
def test_a_mask_is_made_once_per_forward_and_forgotten_with_it(fold, monkeypatch):
    torch.set_num_threads(1)
    if fold:
        monkeypatch.setattr(attention, "NATIVE_GQA", set())
    model = twin(gqa_model())
    p, pm, c, cm = batch()
    made = []
    real = attention._additive
    monkeypatch.setattr(attention, "_additive", lambda m, dtype: made.append(m.shape) or real(m, dtype))
    with torch.no_grad():
        token_logprobs(model, p, pm, c, cm, shared_prompts=False)
    assert made == [(6, 1, 12 * (3 if fold else 1), 12)]  # 2 layers, one mask
    gc.collect()
    assert attention._last_mask is None  # the model's mask is gone: so is sdpa's


def test_load_model_picks_it_where_transformers_picks_sdpa(tmp_path):
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    gqa_model().save_pretrained(tmp_path / "gqa")
    gqa_model(heads=2, kv=2).save_pretrained(tmp_path / "mha")
    assert load_model(ModelConfig(name_or_path=str(tmp_path / "gqa"))).config._attn_implementation == NAME
    assert load_model(ModelConfig(name_or_path=str(tmp_path / "mha"))).config._attn_implementation == "sdpa"
    chosen = {impl: load_model(ModelConfig(name_or_path=str(tmp_path / "gqa"), attn_implementation=impl))
              for impl in ("sdpa", "eager", NAME)}
    assert {k: m.config._attn_implementation for k, m in chosen.items()} == {"sdpa": "sdpa", "eager": "eager", NAME: NAME}
    # what a run saves loads anywhere: the name is not written into config.json
    load_model(ModelConfig(name_or_path=str(tmp_path / "gqa"))).save_pretrained(tmp_path / "saved")
    assert NAME not in (tmp_path / "saved/config.json").read_text()
    assert "attn" not in "".join(json.loads((tmp_path / "saved/config.json").read_text()))


@pytest.mark.parametrize("bool_mask", [True, False])
def test_a_folded_mask_has_rows_a_multiple_of_16_apart(bool_mask, monkeypatch):
    """CUDA's memory-efficient kernel copies a mask whose rows are not 16-element aligned, in every layer, and keeps
    each copy for the backward (an H200 trace: 4 layers x 31.6 MiB at 508 positions): the mask is made aligned."""
    monkeypatch.setattr(attention, "NATIVE_GQA", set())
    keep = torch.ones(2, 1, 5, 12, dtype=torch.bool).tril(7)
    mask = keep if bool_mask else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out = attention.sdpa_mask_for(mask, 3, torch.float32)
    assert out.shape == (2, 1, 15, 12) and [s % 16 for s in out.stride()[:-1]] == [0, 0, 0] and out.stride(-1) == 1
    want = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    assert torch.equal(out, fold_mask(want, 3))


def test_a_batch_without_padding_folds_a_causal_mask_in_float32(monkeypatch):
    """No padding: transformers gives no mask and asks sdpa for is_causal with enable_gqa, which CUDA runs in float32
    only in its math kernel (every layer's [b, heads, q, k] weights kept: 7 x 81 MiB at 8 rows x 576 positions on an
    H200). The fold path runs instead with a causal mask made once per forward: the same log-probs and gradients."""
    torch.set_num_threads(1)
    monkeypatch.setattr(attention, "NATIVE_GQA", set())  # as on CUDA
    plain = gqa_model()
    grouped = twin(plain)
    p, pm, c, cm = batch()
    pm[:], cm[:] = 1, 1  # no padding anywhere
    calls, made = [], []
    real_sdpa, real_additive = torch.nn.functional.scaled_dot_product_attention, attention._additive

    def sdpa(*args, **kw):
        calls.append((kw.get("attn_mask") is not None, kw.get("enable_gqa", False)))
        return real_sdpa(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(attention, "_additive", lambda m, dtype: made.append(m.shape) or real_additive(m, dtype))
    grads = []
    for model in (plain, grouped):
        calls.clear()
        lp, _ = token_logprobs(model, p, pm, c, cm, shared_prompts=False)
        (lp * cm).sum().backward()
        grads.append((lp.detach(), {n: q.grad for n, q in model.named_parameters()}, list(calls)))
    (lp0, g0, plain_calls), (lp1, g1, grouped_calls) = grads
    assert plain_calls == [(False, True)] * 2  # transformers: no mask, enable_gqa (CUDA's math kernel in float32)
    assert grouped_calls == [(True, False)] * 2 and made == [(1, 1, 3 * 12, 12)]  # one folded mask for both layers
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0)
    for name, g in g0.items():
        assert torch.allclose(g, g1[name], atol=1e-5, rtol=1e-4), name
    gc.collect()
    assert attention._last_causal is None  # gone with the forward's position ids
