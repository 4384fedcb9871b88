"""Sequence packing (train.packing): the rows end to end with position restarts give the padded layout's log-probs,
entropy and gradients, for every loss, without computing the padding."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpo_cli.algo import logprobs as logprobs_module
from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.algo.losses import POLICY_LOSSES, LossConfig, compute_loss
from grpo_cli.algo.packing import PACKED_MODELS, first_fit, pack
from grpo_cli.algo.sampling import Truncation
from grpo_cli.models.attention import use_grouped_sdpa

from helpers import tiny_lm as tiny

HEAD_CHUNKED = frozenset(logprobs_module.HEAD_CHUNKED)  # as shipped, before a test switches it off

torch.set_num_threads(1)

B, G, P, T, V = 3, 4, 8, 12, 300


def mixed(pad_id: int = 0, empty_row: bool = True) -> tuple[torch.Tensor, ...]:
    """B left-padded prompts of different lengths x G right-padded completions of 0 (one row) to T tokens."""
    g = torch.Generator().manual_seed(3)
    prompt_ids = torch.randint(1, V, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    for i, pad in enumerate([0, 5, 2]):
        prompt_ids[i, :pad], prompt_mask[i, :pad] = pad_id, 0
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
    completion_ids = torch.randint(1, V, (B * G, T), generator=g)
    lengths = torch.tensor([T, 1, 4, 2, 7, 3, T - 1, 5, 1, 2, 9, 0 if empty_row else 6])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    completion_ids[completion_mask == 0] = pad_id
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def test_first_fit_puts_the_longest_rows_first_and_fills_the_gaps():
    # 5 -> bin 0; 4 -> bin 1; 3 -> bin 2 (bin 1 has 1 free); 2 -> bin 2 after the 3; 1 -> bin 1 after the 4
    assert first_fit([5, 3, 2, 4, 1], 5) == [(0, 0), (2, 0), (2, 3), (1, 0), (1, 4)]
    assert first_fit([2, 2, 2], 6) == [(0, 0), (0, 2), (0, 4)]  # one bin


def test_the_packed_layout_holds_every_real_token_once_at_its_position():
    prompt_ids, prompt_mask, completion_ids, completion_mask = args = mixed()
    p = pack(*args)
    lengths = (prompt_mask.sum(1) + completion_mask.sum(1)).tolist()
    assert p.input_ids.shape[1] == max(lengths)  # bins as long as the longest row
    # 12 rows of 6-20 tokens, 125 in all, in 7 bins of 20 (no fewer can hold them): 140 tokens for the padded 240
    assert sum(lengths) == 125 and p.input_ids.shape == (7, 20) and B * G * (P + T) == 240
    # positions restart at each row; each row's tokens are its prompt then its completion, in order
    starts = (p.position_ids == 0).nonzero().tolist()
    rows = []
    for b, s in starts:
        e = s + 1
        while e < p.position_ids.shape[1] and p.position_ids[b, e] == p.position_ids[b, e - 1] + 1:
            e += 1
        rows.append(p.input_ids[b, s:e].tolist())
    real = [torch.cat([pi[pm.bool()], ci[cm.bool()]]).tolist() for pi, pm, ci, cm in zip(*args)]
    padding = [r for r in rows if r == [0]]  # a bin's tail: one-token sequences of the pad id
    assert sorted(r for r in rows if r != [0]) == sorted(real)
    assert len(padding) == p.input_ids.numel() - sum(lengths)
    # each kept position is the token before its completion token
    following = p.input_ids[p.at[0], p.at[1] + 1]
    assert torch.equal(following, p.targets) and torch.equal(p.targets, completion_ids[completion_mask.bool()])
    assert len(p.targets) == int(completion_mask.sum())


def test_nothing_to_pack_or_an_empty_prompt_keeps_the_padded_layout():
    prompt_ids, prompt_mask, completion_ids, completion_mask = mixed()
    assert pack(prompt_ids, prompt_mask, completion_ids, torch.zeros_like(completion_mask)) is None
    prompt_mask[0] = 0
    assert pack(prompt_ids, prompt_mask, completion_ids, completion_mask) is None


def run(model, args, packing, shared: bool = False, **kw):
    tokens = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: tokens.append(i[0].numel()))
    model.zero_grad()
    logps, entropy = token_logprobs(model, *args, temperature=0.7, shared_prompts=shared, packing=packing, **kw)
    hook.remove()
    mask = args[3].bool()
    ((logps * args[3]).sum() + ((entropy * args[3]).sum() if kw.get("entropy_grad") else 0)).backward()
    return (logps.detach()[mask], entropy.detach()[mask] if entropy is not None else None,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, sum(tokens), logps.detach())


def assert_same(padded, packed):
    assert (padded[0] - packed[0]).abs().max() < 1e-5
    if padded[1] is not None:
        assert (padded[1] - packed[1]).abs().max() < 1e-5
    assert max(g.abs().max() for g in padded[2].values()) > 1e-1  # a real gradient
    assert padded[2].keys() == packed[2].keys()
    for name, g in padded[2].items():
        torch.testing.assert_close(packed[2][name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen2 grouped", "qwen2 tied"])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("kw", [dict(with_entropy=True), dict(entropy_grad=True, chunk_rows=5),
                                dict(with_entropy=True, truncation="top_k")])
def test_packed_rows_give_the_padded_logprobs_entropy_and_gradients(kind, chunked, kw, monkeypatch):
    monkeypatch.setattr(logprobs_module, "HEAD_CHUNKED", set(HEAD_CHUNKED) if chunked else set())
    if kw.get("truncation"):
        kw = {**kw, "truncation": Truncation(top_k=20)}
    model, args = tiny(kind.split()[0]), mixed()
    if kind.endswith("grouped"):  # as the trainer loads it: grpo_cli/models/attention.py
        assert use_grouped_sdpa(model)
    if kind.endswith("tied"):  # the head is the input embedding (Qwen2.5's): head_gradient.EmbeddingLookup's lookup
        model.lm_head.weight = model.model.embed_tokens.weight
    padded, packed = run(model, args, False, **kw), run(model, args, True, **kw)
    assert_same(padded, packed)
    assert padded[3] == B * G * (P + T) and packed[3] == 7 * 20  # the tokens the model ran
    outside = ~args[3].bool()
    assert (packed[4][outside] == 0).all()  # 0 where the completion has no token
    assert "forward" not in model.get_output_embeddings().__dict__  # the head is the model's own again
    assert "forward" not in model.get_input_embeddings().__dict__  # and the embedding


def test_one_bin_for_variable_length_kernels_gives_the_same(monkeypatch):
    """Flash and flex attention take every row in one bin; sdpa reads the restarts in one row as well."""
    model, args = tiny("qwen2"), mixed()
    padded = run(model, args, False, with_entropy=True)
    monkeypatch.setattr(logprobs_module, "one_bin_for", lambda model: True)
    packed = run(model, args, True, with_entropy=True)
    assert_same(padded, packed)
    assert packed[3] == int(args[1].sum() + args[3].sum())  # no padding at all


def test_a_model_whose_head_is_not_chunked_and_positions_are_learned_packs_too():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).float()
    args = mixed()
    assert_same(run(gpt2, args, False, with_entropy=True), run(gpt2, args, True, with_entropy=True))


def test_a_lora_model_packs_through_its_base_models_head():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    args = mixed()
    assert_same(run(model, args, False, with_entropy=True), run(model, args, True, with_entropy=True))


@pytest.mark.parametrize("loss_type", POLICY_LOSSES.names())
def test_every_loss_with_the_reference_and_the_old_policy_is_the_same_packed(loss_type):
    """The policy's log-probs with a gradient; the old policy's and the reference's (other weights) without; the
    loss and its gradient of both layouts agree for each loss type, with a KL term and a non-trivial ratio."""
    args = mixed()
    model, old_model, ref_model = tiny("qwen2"), tiny("qwen2"), tiny("llama")
    with torch.no_grad():
        for p in old_model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    adv = torch.linspace(-1.5, 1.5, B * G)
    level = "sequence" if loss_type in ("luspo", "vespo") else "token"
    cfg = LossConfig(loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=0.04, max_completion_length=T,
                     importance_sampling_level=level)
    out = []
    for packing in (False, True):
        with torch.no_grad():
            old, _ = token_logprobs(old_model, *args, shared_prompts=False, packing=packing)
            ref, _ = token_logprobs(ref_model, *args, shared_prompts=False, packing=packing)
        model.zero_grad()
        logps, _ = token_logprobs(model, *args, shared_prompts=False, packing=packing)
        loss, metrics = compute_loss(cfg, logps, old, adv, args[3], ref_logps=ref, num_active_tokens=args[3].sum())
        loss.backward()
        out.append((loss.item(), {k: v.item() for k, v in metrics.items()},
                    {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = out
    assert loss_a != 0 and abs(loss_a - loss_b) < 1e-5 * max(1.0, abs(loss_a))
    assert metrics_a.keys() == metrics_b.keys() and metrics_a["kl"] > 0
    for k in metrics_a:
        assert abs(metrics_a[k] - metrics_b[k]) < 1e-5, k
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, atol=1e-5, rtol=1e-4, msg=name)


def _tiny_of(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, pad_token_id=0)
    if model_type == "gpt2":
        kw = dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4)
    config = AutoConfig.for_model(model_type, **kw)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


@pytest.mark.parametrize("model_type", sorted(PACKED_MODELS))
def test_every_model_type_packing_is_on_for_keeps_its_rows_apart(model_type):
    model, args = _tiny_of(model_type), mixed()
    assert_same(run(model, args, False, with_entropy=True), run(model, args, True, with_entropy=True))


def test_alibi_models_are_not_packed_and_asking_for_it_is_refused():
    """BLOOM biases attention by the distance between positions in the sequence, not by position ids: packed, a row
    would see another's tokens through the bias. auto leaves it padded; true names the model type."""
    from transformers import BloomConfig, Qwen2Config

    from grpo_cli.errors import SetupError
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.setup import forward_choices

    model, args = _tiny_of("bloom"), mixed()
    assert (run(model, args, False)[0] - run(model, args, True)[0]).abs().max() > 1e-3  # what packing would do
    bloom = BloomConfig(vocab_size=V, hidden_size=64, n_layer=2, n_head=4)
    auto = load_recipe("recipes/ci-tiny.yaml", [])
    assert auto.train.packing == "auto"
    assert forward_choices(auto, "cpu", bloom).packing is False and forward_choices(auto, "cpu", bloom).shared_prompts
    qwen = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert forward_choices(auto, "cpu", qwen).packing == "auto" and forward_choices(auto, "cpu", qwen).shared_prompts
    always = load_recipe("recipes/ci-tiny.yaml", ["train.packing=true"])
    assert forward_choices(always, "cuda", qwen).packing is True
    assert not forward_choices(always, "cpu", qwen).shared_prompts  # true: every micro-batch packed
    with pytest.raises(SetupError, match="train.packing: true.*'bloom'"):
        forward_choices(always, "cpu", bloom)


def test_auto_packs_where_that_runs_fewer_tokens():
    """A group's long prompt and short answers: the prompt once and the answers padded run fewer tokens than G packed
    rows each with the prompt; mixed lengths pack into fewer than the padded rows."""
    model = tiny("qwen2")
    g = torch.Generator().manual_seed(5)
    rows = 8
    one_group = (torch.randint(1, V, (1, 40), generator=g).repeat(rows, 1), torch.ones(rows, 40, dtype=torch.long),
                 torch.randint(1, V, (rows, 6), generator=g), torch.ones(rows, 6, dtype=torch.long))
    one_group[3][::2, 3:] = 0
    # rows of 46 and 43 tokens: one a bin, as many tokens as padded, which stays
    for args, shared, expected in ((one_group, True, 40 + rows * 6), (one_group, False, rows * 46),
                                   (mixed(), True, 7 * 20), (mixed(), False, 7 * 20)):
        auto, fixed = run(model, args, "auto", shared=shared), run(model, args, False, shared=shared)
        assert auto[3] == expected, (shared, auto[3])
        assert (auto[0] - fixed[0]).abs().max() < 1e-5
