"""`rollout.dtype`: the hf backend samples with a lower-precision copy of the policy, filled before every
generate and freed after, and records the sampler's log-probs for importance sampling.

The shared prefill too: each distinct prompt runs through the model once per generate; and the cache made once at
its full length. And truncated sampling
(top-k / top-p / min-p): generate samples the policy grpo_cli/algo/sampling.py defines, which the trainer replays."""

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer

import grpo_cli.rollout.hf as hf
from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.algo.sampling import Truncation, kept_mask
from grpo_cli.recipe.schema import RolloutConfig
import grpo_cli.rollout.preallocated as preallocated_module
from grpo_cli.rollout.common import left_pad
from grpo_cli.rollout.hf import HFGenerator, SamplerLogprobs, SamplingCopy, native_bf16, sampler_dtype
from grpo_cli.rollout.preallocated import PreallocatedLayer, preallocated

from helpers import IdsTokenizer as Tok, chi_square_p, cli, read_jsonl, tiny_sampler as tiny

torch.set_num_threads(1)


PROMPTS = [[5, 6, 7, 8], [9, 10]]


def test_the_copy_holds_memory_only_while_sampling_and_follows_the_policy():
    model = tiny()
    copy = SamplingCopy(model, torch.bfloat16)
    assert {p.device.type for p in copy.module.parameters()} == {"meta"}
    for _ in range(2):  # the second fill sees the policy's new weights
        sampler = copy.fill(model)
        policy = dict(model.named_parameters(remove_duplicate=False))
        for name, p in sampler.named_parameters(remove_duplicate=False):  # tied LM head included
            assert p.dtype == torch.bfloat16 and torch.equal(p, policy[name].to(torch.bfloat16)), name
        for (name, b), (_, ref) in zip(sampler.named_buffers(), model.named_buffers()):
            assert b.dtype == ref.dtype and torch.equal(b, ref), name  # RoPE frequencies stay float32
        copy.free()
        assert {p.device.type for p in copy.module.parameters()} == {"meta"}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())  # untouched


def test_recorded_logprobs_are_the_samplers_at_the_sampling_temperature_before_top_p():
    model = tiny().eval()
    ids, mask = left_pad([p for p in PROMPTS for _ in range(3)], 0)
    recorder = SamplerLogprobs(0.7)
    torch.manual_seed(1)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_p=0.8, top_k=0,
                         max_new_tokens=6, eos_token_id=63, logits_processor=LogitsProcessorList([recorder]))
    completion = out[:, ids.shape[1]:]
    recorded = recorder.result(completion)
    with torch.no_grad():
        expected, _ = token_logprobs(model, ids, mask, completion, torch.ones_like(completion), temperature=0.7,
                                     shared_prompts=False)
    assert recorded.shape == completion.shape and completion.shape[1] > 3
    assert (recorded - expected).abs().max() < 1e-4


def test_the_generator_samples_with_the_copy_and_returns_its_logprobs():
    model = tiny()
    gen = HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8, dtype="bfloat16"))
    torch.manual_seed(0)
    r = gen.generate(PROMPTS, ["a", "b"], n=4)
    assert r.sampling_logps is not None and r.sampling_logps.shape == r.completion_ids.shape
    assert (r.sampling_logps[r.completion_mask == 0] == 0).all() and (r.sampling_logps[r.completion_mask == 1] < 0).all()
    with torch.no_grad():
        policy, _ = token_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        sampler, _ = token_logprobs(gen.copy.fill(model), r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    gen.copy.free()
    m = r.completion_mask.bool()
    # the recorded numbers are the bf16 copy's (to bf16 rounding), not the float32 policy's
    assert (r.sampling_logps - sampler)[m].abs().max() < 2e-2
    assert (policy - sampler)[m].abs().max() > 1e-4
    greedy = gen.generate(PROMPTS, ["a", "b"], greedy=True)
    assert greedy.sampling_logps is None
    assert HFGenerator(model, Tok(), RolloutConfig(dtype="policy")).copy is None


def test_auto_picks_bf16_only_for_a_full_float32_policy_on_native_bf16_hardware():
    model = tiny()
    native = native_bf16(torch.device("cpu"))
    assert sampler_dtype("auto", model, full_model=True) == (torch.bfloat16 if native else None)
    assert sampler_dtype("auto", model, full_model=False) is None  # LoRA, FSDP, ZeRO-3: the policy samples
    assert sampler_dtype("auto", tiny(torch.bfloat16), full_model=True) is None
    assert sampler_dtype("bfloat16", tiny(torch.bfloat16), full_model=True) is None  # already bf16
    assert sampler_dtype("policy", model, full_model=True) is None
    with pytest.raises(ValueError, match="rollout.dtype: bfloat16 needs a full model"):
        sampler_dtype("bfloat16", model, full_model=False)


@pytest.mark.slow
@pytest.mark.usefixtures("model_cache")
def test_training_with_a_bf16_sampler_logs_the_mismatch_and_corrects_it(tmp_path):
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "bf16"), "train.max_steps=2", "rollout.dtype=bfloat16")
    assert p.returncode == 0, p.stderr[-3000:]
    m = read_jsonl(tmp_path / "bf16/metrics.jsonl")[-1]
    assert 0 < m["sampling/sampling_logp_difference/mean"] < 0.1
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.1)
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "fp32"), "train.max_steps=2", "rollout.dtype=policy")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "sampling/sampling_logp_difference/mean" not in read_jsonl(tmp_path / "fp32/metrics.jsonl")[-1]


@pytest.mark.slow
def test_training_with_truncated_sampling_on_a_bf16_sampler_gives_an_importance_ratio_of_one(tmp_path):
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / "run"), "train.max_steps=2", "rollout.dtype=bfloat16",
            "rollout.top_p=0.8", "rollout.top_k=40")
    assert p.returncode == 0, p.stderr[-3000:]
    for m in read_jsonl(tmp_path / "run/metrics.jsonl"):
        assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.02), m


def test_sampling_runs_outside_the_training_autocast():
    """train.mixed_precision wraps the model's forward in autocast (accelerate); sampling uses the forward it had
    before, so it draws the same tokens as the unwrapped policy, and training forwards keep their autocast."""
    from accelerate import Accelerator

    reference = tiny()
    torch.manual_seed(2)
    expected = HFGenerator(reference, Tok(), RolloutConfig(max_completion_length=6)).generate(PROMPTS, ["a", "b"], n=3)

    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier test's Accelerator may have had no autocast
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        model = accelerator.prepare(tiny())
        seen = []
        model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        torch.manual_seed(2)
        got = HFGenerator(accelerator.unwrap_model(model), Tok(), RolloutConfig(max_completion_length=6)).generate(
            PROMPTS, ["a", "b"], n=3)
        assert seen and set(seen) == {torch.float32}  # no decode step ran under autocast
        assert torch.equal(got.completion_ids, expected.completion_ids)
        seen.clear()
        model(input_ids=torch.tensor(PROMPTS[:1]))
        assert seen == [torch.bfloat16]  # the training forward is still autocast
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # the next Accelerator in this process may differ


torch.set_num_threads(1)
SHARED_PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15]]


def _forwards(model, prompts, n, dtype="policy"):
    """generate's rollout, and the keyword arguments of each forward that sampled (a sampling copy, made after the
    hook, carries it)."""
    calls = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: calls.append(kw), with_kwargs=True)
    torch.manual_seed(3)
    try:
        out = hf.HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8, dtype=dtype)).generate(
            prompts, [str(i) for i in range(len(prompts))], n=n)
    finally:
        hook.remove()
    return out, calls


def _generate(model, prompts, n, share: bool, monkeypatch, dtype="policy"):
    monkeypatch.setattr(hf, "shared_prefill", hf.shared_prefill if share else (lambda *a, **k: None))
    out, calls = _forwards(model, prompts, n, dtype)
    return out, [tuple(kw["input_ids"].shape) for kw in calls]


@pytest.mark.parametrize("n", [1, 4])
def test_each_distinct_prompt_runs_once_and_the_samples_are_the_same(n, monkeypatch):
    model = tiny()
    prompts = SHARED_PROMPTS if n > 1 else [p for p in SHARED_PROMPTS for _ in range(4)]  # the engine's pre-repeated rows
    shared, batches = _generate(model, prompts, n, True, monkeypatch)
    plain, plain_batches = _generate(model, prompts, n, False, monkeypatch)
    # the prefill: 3 distinct prompts, all but the last of 5 (left-padded) positions; then one position per row
    assert batches[:2] == [(3, 4), (12, 1)] and plain_batches[0] == (12, 5)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)


def test_sampler_logprobs_of_a_bf16_copy_are_the_same_with_the_shared_prefill(monkeypatch):
    model = tiny()
    shared, _ = _generate(model, SHARED_PROMPTS, 4, True, monkeypatch, dtype="bfloat16")
    plain, _ = _generate(model, SHARED_PROMPTS, 4, False, monkeypatch, dtype="bfloat16")
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.allclose(shared.sampling_logps, plain.sampling_logps, atol=1e-2)


def test_nothing_is_shared_when_every_prompt_differs(monkeypatch):
    model = tiny()
    _, batches = _generate(model, SHARED_PROMPTS, 1, True, monkeypatch)
    assert batches[0] == (3, 5)  # generate's own prefill of every row


def test_truncated_sampling_draws_only_from_the_kept_set():
    """top_k 30, top_p 0.8, min_p 0.01 at temperature 0.9: every sampled token lies in the kept set of the policy's
    own logits at its position (the rule of grpo_cli/algo/sampling.py, not transformers' own warpers)."""
    model, t = tiny(), Truncation(30, 0.8, 0.01)
    torch.manual_seed(3)
    cfg = RolloutConfig(max_completion_length=10, temperature=0.9, top_k=30, top_p=0.8, min_p=0.01)
    out = HFGenerator(model, Tok(), cfg).generate(PROMPTS, ["a", "b"], n=8)
    ids = torch.cat([out.prompt_ids, out.completion_ids], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.cat([out.prompt_mask, out.completion_mask], 1)).logits
    P = out.prompt_ids.shape[1]
    kept = kept_mask(logits[:, P - 1 : -1] / 0.9, t)  # [N, T, V]
    drawn = kept.gather(-1, out.completion_ids.unsqueeze(-1)).squeeze(-1)[out.completion_mask.bool()]
    print(f"{int(out.completion_mask.sum())} tokens; kept set sizes {kept.sum(-1)[out.completion_mask.bool()].float().mean():.1f} of 64")
    assert drawn.all() and kept.sum(-1)[out.completion_mask.bool()].float().mean() < 30


def test_a_copys_log_probs_under_truncation_are_the_trainers_replayed_ones():
    """The bf16 copy records log pi_K (after TruncatedSampling); the float32 trainer's replayed log-probs equal them
    to bf16 noise, while its full-vocabulary ones are lower by log S (the kept mass: ~0.8 here)."""
    model = tiny()
    torch.manual_seed(0)
    cfg = RolloutConfig(max_completion_length=12, top_p=0.8, temperature=0.9, dtype="bfloat16")
    out = HFGenerator(model, Tok(), cfg).generate(PROMPTS, ["a", "b"], n=4)
    args = (model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    with torch.no_grad():
        replayed, _ = token_logprobs(*args, temperature=0.9, truncation=Truncation(top_p=0.8))
        full, _ = token_logprobs(*args, temperature=0.9)
    m = out.completion_mask.bool()
    gap, log_s = (replayed - out.sampling_logps)[m], (full - replayed)[m]
    print(f"replayed - sampler: mean |.| {gap.abs().mean():.4f}, ratio {gap.exp().mean():.4f}; "
          f"full - replayed (log S): mean {log_s.mean():.3f}")
    assert gap.abs().mean() < 0.02 and gap.exp().mean().item() == pytest.approx(1.0, abs=0.02)
    assert log_s.max() <= 1e-6 and log_s.mean() < -0.1


@pytest.mark.parametrize("inverse_cdf", [True, False])
def test_the_first_token_has_the_policys_distribution_with_either_draw(inverse_cdf):
    """6,000 first tokens of one prompt at temperature 0.8, drawn by `generate` with grpo's draw (one uniform a row)
    and with torch.multinomial: both pass a chi-square test against softmax(logits / 0.8) at the prompt's last
    position (tokens with fewer than 5 expected draws pooled), and the second token too, position by position."""
    model, n = tiny(), 6000
    torch.manual_seed(5)
    gen = HFGenerator(model, Tok(), RolloutConfig(max_completion_length=2, temperature=0.8))
    gen.inverse_cdf = inverse_cdf
    out = gen.generate([[5, 6, 7, 8]], ["a"], n=n)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([[5, 6, 7, 8]])).logits[0, -1].double() / 0.8, -1)
    counts = torch.bincount(out.completion_ids[:, 0], minlength=64).double()
    small = p * n < 5
    pooled = lambda v: torch.cat([v[~small], v[small].sum().view(1)])  # noqa: E731
    print(f"{'inverse cdf' if inverse_cdf else 'multinomial'}: p = {chi_square_p(pooled(counts), pooled(p)):.3f}")
    assert chi_square_p(pooled(counts), pooled(p)) > 0.01


# ---------------------------------------------------------------- the preallocated cache
# The hf backend decodes into a key/value cache made once at its full length (grpo_cli/rollout/preallocated.py): each
# layer holds what transformers' dynamic cache would, without a copy per decoding step, and `generate` samples the
# same tokens and log-probs with it.


def _steps(layer, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    for n in lengths:
        k, v = torch.randn(3, 2, n, 4, generator=g), torch.randn(3, 2, n, 4, generator=g)
        out = layer.update(k, v)
    return out


@pytest.mark.parametrize("capacity", [8, 5])  # 5: the prefill fills it, each decode step grows it
def test_a_layer_holds_what_the_dynamic_layer_holds(capacity):
    mine, theirs = PreallocatedLayer(capacity), DynamicLayer()
    for step, n in enumerate([5, 1, 1, 1]):
        k, v = _steps(mine, [n], seed=step)
        k2, v2 = _steps(theirs, [n], seed=step)
        assert torch.equal(k, k2) and torch.equal(v, v2) and mine.get_seq_length() == theirs.get_seq_length()
    assert mine.capacity == (8 if capacity == 8 else 10)  # grown once, to twice its size, then in place
    mine.crop(-2), theirs.crop(-2)
    mine.batch_select_indices(torch.tensor([2, 0, 0])), theirs.batch_select_indices(torch.tensor([2, 0, 0]))
    assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    assert torch.equal(_steps(mine, [1], seed=9)[0], _steps(theirs, [1], seed=9)[0])
    mine.reset()
    assert mine.get_seq_length() == 0 and mine.keys.shape[-2] == 0


def test_decoding_writes_in_place():
    layer = PreallocatedLayer(8)
    _steps(layer, [5])
    buffer = layer.key_buffer.data_ptr()
    for step in range(3):
        keys, _ = _steps(layer, [1], seed=step + 1)
        assert keys.data_ptr() == layer.key_buffer.data_ptr() == buffer and keys.shape[-2] == 6 + step


def _generate_into(model, prompts, n, *, dtype="policy"):
    out, calls = _forwards(model, prompts, n, dtype)
    return out, [kw.get("past_key_values") for kw in calls]


@pytest.mark.parametrize("prompts, n", [(SHARED_PROMPTS, 4), (SHARED_PROMPTS, 1)])  # shared prefill; none
@pytest.mark.parametrize("dtype", ["policy", "bfloat16"])
def test_generate_samples_the_same_tokens_and_logprobs_as_with_the_dynamic_cache(prompts, n, dtype, monkeypatch):
    model = tiny()
    mine, caches = _generate_into(model, prompts, n, dtype=dtype)
    layers = [c.layers for c in caches if c is not None]
    assert layers and all(type(layer) is PreallocatedLayer for ls in layers for layer in ls)
    assert all(layer.capacity == 5 + 8 for layer in layers[-1])  # widest prompt + the budget: never grown
    monkeypatch.setattr(preallocated_module, "preallocated", lambda cache, model, capacity: cache)
    theirs, caches = _generate_into(model, prompts, n, dtype=dtype)
    assert all(type(layer) is DynamicLayer for c in caches if c is not None for layer in c.layers)
    assert torch.equal(mine.completion_ids, theirs.completion_ids)
    assert torch.equal(mine.completion_mask, theirs.completion_mask)
    if dtype == "bfloat16":  # a sampling copy records its log-probs
        assert torch.equal(mine.sampling_logps, theirs.sampling_logps)


def test_a_cache_of_other_layers_is_left_to_transformers():
    model = tiny()
    assert all(type(layer) is PreallocatedLayer for layer in preallocated(None, model, 16).layers)
    cache = DynamicCache(config=model.config)

    class Sliding(DynamicLayer):
        pass

    cache.layers[1] = Sliding()
    out = preallocated(cache, model, 16)
    assert type(out.layers[0]) is PreallocatedLayer and type(out.layers[1]) is Sliding
    other = object()  # a prompt cache of another class goes to generate as it is
    assert preallocated(other, model, 16) is other
    model.generation_config.cache_implementation = "static"  # the model's own choice: generate makes that cache
    assert preallocated(None, model, 16) is None
