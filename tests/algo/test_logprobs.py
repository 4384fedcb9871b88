"""Completion log-probs: a group's shared prompt runs once, with the same values and gradients as G times."""

import pytest
import torch

from grpo_cli.algo import logprobs as logprobs_module
from grpo_cli.algo.logprobs import token_logprobs

from helpers import saved_for_backward, tiny_lm

torch.set_num_threads(1)

B, G, P, T = 3, 4, 7, 9


tiny = tiny_lm


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


# ----- the LM head inside the log-prob chunks (logprobs.HeadLogps): no [b, T, V] logits, the same values

HEAD_CHUNKED = frozenset(logprobs_module.HEAD_CHUNKED)  # as shipped, before a test switches it off


def run_head(model, shared: bool, args, chunked: bool, monkeypatch, **kw):
    monkeypatch.setattr(logprobs_module, "HEAD_CHUNKED", set(HEAD_CHUNKED) if chunked else set())
    assert (logprobs_module._head_of(model) is not None) == chunked
    model.zero_grad()
    vocab = model.config.vocab_size
    with saved_for_backward(model) as saved:
        logps, entropy = token_logprobs(model, *args, temperature=0.7, shared_prompts=shared, **kw)
    # saved tensors as wide as the vocabulary: their storage's size in rows x positions
    storages = {address: nbytes // (vocab * size) for address, shape, nbytes, size in saved
                if shape and shape[-1] == vocab}
    loss = (logps * args[3]).sum() + (entropy.sum() if kw.get("entropy_grad") else 0)
    loss.backward()
    assert "forward" not in model.get_output_embeddings().__dict__  # the head is the model's own again
    return (logps.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()},
            list(storages.values()))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("kw", [dict(with_entropy=True), dict(entropy_grad=True, chunk_rows=5),
                                dict(with_entropy=True, truncation="top_k")])
def test_the_head_inside_the_chunks_gives_the_same_logprobs_entropy_and_gradients(shared, kw, monkeypatch):
    from grpo_cli.algo.sampling import Truncation

    if kw.get("truncation"):
        kw = {**kw, "truncation": Truncation(top_k=20)}
    model, args = tiny("qwen2"), batch()
    plain = run_head(model, shared, args, False, monkeypatch, **kw)
    chunked = run_head(model, shared, args, True, monkeypatch, **kw)
    kept = run_head(model, shared, args, True, monkeypatch, chunked_head=logprobs_module.KEEP_LOGITS, **kw)
    assert (plain[0] - chunked[0]).abs().max() < 1e-5 and (plain[1] - chunked[1]).abs().max() < 1e-4
    for name, g in plain[2].items():
        torch.testing.assert_close(chunked[2][name], g, atol=2e-5, rtol=1e-4, msg=name)
    assert max(g.abs().max() for g in plain[2].values()) > 1e-1
    # the chunks' logits kept for the backward instead of recomputed there (train.chunked_lm_head: keep_logits, a
    # CPU's default): the same products, the same numbers bit for bit
    assert torch.equal(kept[0], chunked[0]) and torch.equal(kept[1], chunked[1])
    for name, g in chunked[2].items():
        assert torch.equal(kept[2][name], g), name
    rows = B * G
    # the plain head keeps the micro-batch's logits for the backward; the chunked one none (a shared prompt's last
    # position goes through it too), kept or not (keep_logits holds them itself, not autograd)
    assert max(plain[3]) >= rows * (T - (1 if shared else 0))
    assert chunked[3] == [] and kept[3] == []


@pytest.mark.parametrize("kw", [dict(entropy_grad=True), dict(with_entropy=True, truncation="top_k")])
def test_chunks_of_positions_across_rows_give_the_same_logprobs_entropy_and_gradients(kw, monkeypatch):
    """A chunk holds at most head_gradient.CHUNK_LOGITS logits: here 4 positions of the 9 a row has, so chunks cut
    rows and straddle two."""
    from grpo_cli.algo import head_gradient
    from grpo_cli.algo.sampling import Truncation

    if kw.get("truncation"):
        kw = {**kw, "truncation": Truncation(top_k=20)}
    model, args = tiny("llama"), batch()
    plain = run_head(model, False, args, False, monkeypatch, **kw)
    calls = []
    real = head_gradient.ChunkedHead.forward
    monkeypatch.setattr(head_gradient.ChunkedHead, "forward",
                        staticmethod(lambda ctx, h, *a: calls.append((h.shape, a[4])) or real(ctx, h, *a)))
    monkeypatch.setattr(head_gradient, "CHUNK_LOGITS", 4 * model.config.vocab_size + 7)
    chunked = run_head(model, False, args, True, monkeypatch, chunk_rows=2, **kw)
    assert calls == [((B * G * (T + 1), 1, 64), 4)]  # every kept position, 4 at a time
    assert (plain[0] - chunked[0]).abs().max() < 1e-5 and (plain[1] - chunked[1]).abs().max() < 1e-4
    for name, g in plain[2].items():
        torch.testing.assert_close(chunked[2][name], g, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("autocast,shared", [(False, False), (False, True), (True, True)])
def test_a_head_tied_to_the_embedding_gets_the_plain_heads_gradients(autocast, shared, monkeypatch):
    """A head tied to the embedding (Qwen2.5's), its padding row (id 0, the prompts' left padding) left out of the
    embedding's gradient as F.embedding does: the head's gradient and the looked-up rows' summed in one tensor
    (EmbeddingLookup), the plain head's to float rounding; under bf16 autocast over float32 weights
    (train.mixed_precision=bf16), each chunk's bf16 product summed in float32, to bf16 rounding."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_cli.algo import head_gradient

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                         pad_token_id=0))
    model = model.float().train()
    assert model.get_input_embeddings().padding_idx == 0
    lookups = []
    real = head_gradient.EmbeddingLookup.backward
    monkeypatch.setattr(head_gradient.EmbeddingLookup, "backward",
                        staticmethod(lambda ctx, g: lookups.append(len(g)) or real(ctx, g)))
    args = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        plain = run_head(model, shared, args, False, monkeypatch, with_entropy=True)
        assert lookups == []
        chunked = run_head(model, shared, args, True, monkeypatch, with_entropy=True, chunk_rows=5)
        # the completions' lookup, then (a group's prompt run once) the distinct prompts', which go through it too
        assert lookups == ([B * G, B] if shared else [B * G])
    assert plain[0].dtype == torch.float32 and (plain[0] - chunked[0]).abs().max() < 1e-5
    assert "lm_head.weight" not in plain[2]  # tied: one parameter, the head's and the embedding's gradients summed
    for name, g in plain[2].items():
        if autocast:
            assert (chunked[2][name] - g).abs().max() <= 0.02 * g.abs().max(), name
        else:
            torch.testing.assert_close(chunked[2][name], g, atol=2e-5, rtol=1e-4, msg=name)
    assert plain[2]["model.embed_tokens.weight"].abs().max() > 1e-2


@pytest.mark.parametrize("tied", [False, True])
def test_the_chunked_heads_weight_gradient_is_built_in_one_tensor_then_added_where_it_is_kept(tied, monkeypatch):
    """Each chunk's share of the head's weight gradient is added into one [V, H] tensor. Autograd summed the chunks'
    own gradients out of place, so three tensors of the head's size were alive at once in the backward, on top of the
    gradient kept between micro-batches: 0.76 GiB at the H200 peak of issue 40 (Qwen2.5-0.5B's 151,936 x 896 head).
    Tied to the embedding, the embedding's gradient was a dense [V, H] tensor more at the backward's end. From the
    second micro-batch on, that one tensor is the gradient the first left (`weight.grad`, added to in place, as
    autograd's accumulation would): no tensor of the head's size is new in the backward (one was, 1.24 head sizes at
    the peak with one of the head's size). Two micro-batches leave the plain head's gradients."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tensor_peak import TensorPeak

    torch.manual_seed(0)
    vocab, hidden = 20000, 128
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=tied)).float().train()
    g = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(2):  # the second micro-batch adds to the gradients the first left
        prompt_ids = torch.randint(1, vocab, (6, 5), generator=g)
        completion_ids = torch.randint(1, vocab, (6, 4), generator=g)
        batches.append((prompt_ids, torch.ones_like(prompt_ids), completion_ids, torch.ones_like(completion_ids)))
    head = model.get_output_embeddings().weight

    def two_micro_batches(chunked: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
        monkeypatch.setattr(logprobs_module, "HEAD_CHUNKED", set(HEAD_CHUNKED) if chunked else set())
        model.zero_grad(set_to_none=True)
        peaks = []
        for args in batches:
            logps, _ = token_logprobs(model, *args, temperature=0.7, shared_prompts=False, chunk_rows=1)
            with TensorPeak() as p:
                (logps * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
            peaks.append(p.new_peak / (head.numel() * head.element_size()))
        return peaks, {n: p.grad.clone() for n, p in model.named_parameters()}

    _, plain = two_micro_batches(False)
    peaks, chunked = two_micro_batches(True)
    # new at the first's peak: the gradients being built (the head's, then kept as the weight's, and untied the
    # embedding's: 1 or 2 head sizes), a chunk's logits and their gradients (4 x 20000: 1/32 each); at the second's,
    # only the chunk's
    assert peaks[0] < (1.5 if tied else 2.5) and peaks[1] < 0.5, peaks
    for name, grad in plain.items():
        torch.testing.assert_close(chunked[name], grad, atol=2e-5, rtol=1e-4, msg=name)
    assert head.grad.abs().max() > 1e-3

    def returned(chunked: bool) -> torch.Tensor:  # torch.autograd.grad: the gradient returned, none accumulated
        monkeypatch.setattr(logprobs_module, "HEAD_CHUNKED", set(HEAD_CHUNKED) if chunked else set())
        logps, _ = token_logprobs(model, *batches[1], temperature=0.7, shared_prompts=False, chunk_rows=1)
        return torch.autograd.grad((logps * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum(), [head])[0]

    kept = head.grad.clone()
    torch.testing.assert_close(returned(True), returned(False), atol=2e-5, rtol=1e-4)
    assert torch.equal(head.grad, kept)  # the kept gradient as the two micro-batches left it


@pytest.mark.parametrize("dtype,temperature", [(torch.float32, 0.7), (torch.float32, 1.0), (torch.bfloat16, 0.7)])
def test_the_plain_log_probs_gradient_in_closed_form_is_autograds(dtype, temperature, monkeypatch):
    """Without truncation or an entropy gradient the chunked head's chunks run head_gradient.plain_logps (_after_head's
    log-probs and entropy) and, in the backward, plain_logps_grad: autograd's gradient through _after_head, the
    entropy beside the log-probs taking none; the chunked head then runs it, not autograd, in every chunk."""
    from grpo_cli.algo import head_gradient
    from grpo_cli.algo.logprobs import _after_head

    g = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(6, 1, 50, generator=g)).to(dtype)
    ids = torch.randint(0, 50, (6, 1), generator=g)
    grad = torch.randn(6, 1, 2, generator=g)
    x = logits.clone().requires_grad_(True)
    values = _after_head(temperature, None, True, False, x, ids)
    (want,) = torch.autograd.grad(values, x, grad)
    torch.testing.assert_close(head_gradient.plain_logps(temperature, True, logits, ids), values.detach(),
                               atol=2e-6, rtol=1e-5)
    assert (head_gradient.plain_logps(temperature, False, logits, ids)[..., 1] == 0).all()
    got = head_gradient.plain_logps_grad(temperature, logits.clone(), ids, grad)
    assert got.dtype == dtype
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got, want, **tolerance)
    assert want.abs().max() > 0.1

    model, args = tiny("qwen2"), batch()
    calls = []
    real = head_gradient.plain_logps_grad
    monkeypatch.setattr(head_gradient, "plain_logps_grad", lambda *a: calls.append(a[1].shape) or real(*a))
    monkeypatch.setattr(logprobs_module, "plain_logps_grad", head_gradient.plain_logps_grad)
    run_head(model, False, args, True, monkeypatch, with_entropy=True)
    assert sum(s[0] for s in calls) == B * G * (T + 1)  # every kept position's logits, in chunks
    calls.clear()
    run_head(model, False, args, True, monkeypatch, entropy_grad=True)  # the entropy's gradient: autograd's
    assert calls == []


@pytest.mark.parametrize("tied", [False, True])
def test_under_autocast_the_kept_gradient_adds_each_chunks_product_in_the_weights_dtype(tied, monkeypatch):
    """bf16 autocast over float32 weights (train.mixed_precision=bf16), two micro-batches: from the second on, each
    chunk's bfloat16 product is added into the float32 kept gradient (and the embedding's rows), as autograd casts
    and accumulates them: the plain head's gradients to bf16 rounding."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                                         pad_token_id=0)).float().train()
    data = [batch(), tuple(t.flip(0) for t in batch())]

    def two(chunked: bool) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(logprobs_module, "HEAD_CHUNKED", set(HEAD_CHUNKED) if chunked else set())
        model.zero_grad(set_to_none=True)
        for args in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logps, _ = token_logprobs(model, *args, temperature=0.7, with_entropy=True, chunk_rows=5)
            (logps * args[3]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    from grpo_cli.algo import head_gradient

    kept = []
    real = head_gradient.kept_gradient
    monkeypatch.setattr(head_gradient, "kept_gradient", lambda w: kept.append(real(w) is not None) or real(w))
    plain, chunked = two(False), two(True)
    # 2 micro-batches x (the completions' head and embedding, then the prompts' head and embedding: a group's prompt
    # runs once): each adds into the weight's gradient in place, made of zeros by the first of the step
    assert kept == [True] * 8
    assert all(g.dtype == torch.float32 for g in chunked.values())
    for name, g in plain.items():
        assert (chunked[name] - g).abs().max() <= 0.02 * g.abs().max(), name
    assert plain["model.embed_tokens.weight"].abs().max() > 1e-2


def test_models_whose_head_output_is_changed_after_it_keep_their_logits():
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_cli.algo.logprobs import _head_of

    assert _head_of(tiny("qwen2")) is not None and _head_of(tiny("llama")) is not None
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2))
    assert _head_of(gpt2) is None  # not in HEAD_CHUNKED: e.g. Gemma 2 soft-caps the head's output
    args = batch()
    logps, _ = token_logprobs(gpt2, *args, shared_prompts=False)
    assert logps.shape == (B * G, T) and logps.max() < 0


def test_a_lora_model_chunks_its_base_models_head():
    from peft import LoraConfig, get_peft_model

    from grpo_cli.algo.logprobs import _head_of

    base = tiny("llama")
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert _head_of(peft) is base.lm_head


def test_train_chunked_lm_head_decides_where_the_head_runs_and_changes_no_number(tmp_path, monkeypatch):
    """train.chunked_lm_head: false runs the model's own head; auto keeps the chunks' logits on a CPU (a second head
    product costs it more time than the logits' memory), true recomputes them: both run the training and reference
    forwards through the chunks, with the same numbers as each other and the model's own head's to float rounding."""
    import json

    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine

    from helpers import ROOT

    calls = []
    real = logprobs_module.head_logps
    monkeypatch.setattr(logprobs_module, "head_logps", lambda *a, **k: calls.append(a[1].requires_grad) or real(*a, **k))
    runs = {}
    for setting in ("false", "auto", "true"):
        calls.clear()
        r = load_recipe(ROOT / "recipes/ci-tiny.yaml", [
            "train.max_steps=2", "algorithm.beta=0.04", "logging.rollouts=false", "checkpoint.every_steps=0",
            f"train.chunked_lm_head={setting}"])
        Engine(r, tmp_path / setting).fit()
        runs[setting] = ([json.loads(line) for line in (tmp_path / setting / "metrics.jsonl").read_text().splitlines()],
                         list(calls))
    assert runs["false"][1] == []
    for setting in ("auto", "true"):  # the training forward (grad), the reference's (not)
        assert True in runs[setting][1] and False in runs[setting][1]
    for plain, kept, chunked in zip(runs["false"][0], runs["auto"][0], runs["true"][0]):
        for key in ("loss", "entropy", "grad_norm", "kl"):
            assert kept[key] == chunked[key], key
            assert abs(plain[key] - chunked[key]) <= 1e-5 * max(1.0, abs(plain[key])), key
    assert runs["auto"][0][0]["grad_norm"] > 0


def test_a_groups_shared_prompt_gets_the_same_gradient_on_every_run():
    """A micro-batch of one group (its 8 rows share one prompt) on 2 threads: the prompt's keys, values and last
    logits are repeated to the rows, and the backward sums the rows' gradients. By indexing, that sum was made of
    atomic adds split over threads, rounded differently on every run; now it is the same on every run, and equal
    to the sum of the rows' own gradients (the plain forward)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).float().train()
    g = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(1, 8192, (1, 80), generator=g).expand(8, -1)  # 8 x [1, 2, 80, 32] keys: threads split
    completion_ids = torch.randint(1, 8192, (8, 6), generator=g)
    args = (prompt_ids, torch.ones_like(prompt_ids), completion_ids, torch.ones_like(completion_ids))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [run(model, True, args)[2] for _ in range(8)]
    finally:
        torch.set_num_threads(threads)
    for name, grad in runs[0].items():
        assert all(torch.equal(r[name], grad) for r in runs[1:]), name
    plain = run(model, False, args)[2]
    for name, grad in plain.items():
        torch.testing.assert_close(runs[0][name], grad, atol=2e-5, rtol=1e-4, msg=name)


def test_rows_of_repeats_rows_as_indexing_does():
    t = torch.randn(3, 5, requires_grad=True)
    for inverse in (torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([2, 0, 1, 0, 2, 2]), torch.tensor([1, 1, 1])):
        out = logprobs_module.rows_of(t, inverse)
        assert torch.equal(out, t[inverse])
        weights = torch.randn(out.shape)
        mine = torch.autograd.grad((out * weights).sum(), t)[0]
        theirs = torch.autograd.grad((t[inverse] * weights).sum(), t)[0]
        torch.testing.assert_close(mine, theirs)


def test_the_embeddings_gradient_on_a_cpu_is_the_same_on_every_run():
    """EmbeddingLookup's backward adds each looked-up row into the weight's gradient: a token repeated (a group's
    prompt, a common word) sums several rows into one. torch's `index_put_(accumulate=True)` does it on a CPU with
    atomic adds across threads above 32,768 elements (the order, and so the rounding, changed from run to run: two
    quickstart runs' embeddings differed after step 1); `index_add_` sums them in the ids' order, as F.embedding's own
    backward does, bit for bit."""
    from grpo_cli.algo.head_gradient import EmbeddingLookup

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 150), generator=g)  # 600 ids over 50 rows: every row repeated
    upstream = torch.randn(4, 150, 64, generator=g)
    weight = torch.randn(97, 64, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = set()
        for _ in range(20):
            w = weight.clone().requires_grad_()
            EmbeddingLookup.apply(ids, w, None, None).backward(upstream)
            grads.add(w.grad.numpy().tobytes())
        plain = weight.clone().requires_grad_()
        torch.nn.functional.embedding(ids, plain).backward(upstream)
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == 1
    assert grads.pop() == plain.grad.numpy().tobytes()
