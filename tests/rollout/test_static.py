"""`rollout.compile`: the hf backend's static key/value cache, made once per run and reset in place, and the compiled
decode step (grpo_cli/rollout/static.py). On the CPU the static cache must sample exactly what the dynamic cache
samples; the compiled path is checked against eager here on the CPU (inductor) and on a GPU by bench/gpu_checks.sh."""

import pytest
import torch

from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.static import StaticDecoding, compile_wanted

from helpers import IdsTokenizer as Tok, tiny_sampler as tiny

torch.set_num_threads(1)


STEP1 = [[5, 6, 7, 8], [9, 10]]  # two prompts x G=3, left-padded to 4
STEP2 = [[11, 12, 13, 14, 15, 16], [17, 18, 19]]  # wider: another padding


def rows(prompts, G=3):
    return [p for p in prompts for _ in range(G)]


def sample(gen: HFGenerator, prompts, seed: int):
    torch.manual_seed(seed)
    r = gen.generate(rows(prompts), ["p"] * 6)
    return r.completion_ids.tolist(), r.completion_mask.tolist(), r.sampling_logps


@pytest.mark.parametrize("dtype", ["policy", "bfloat16"])
def test_the_static_cache_samples_what_the_dynamic_cache_samples(dtype):
    model = tiny()
    cfg = RolloutConfig(max_completion_length=12, temperature=1.0, dtype=dtype)
    dynamic, static = HFGenerator(model, Tok(), cfg), HFGenerator(model, Tok(), cfg)
    static.static = StaticDecoding(model, rows=6, max_new_tokens=12, prompt_width=4, compile=False)
    assert static.static.capacity == 12 + 64
    for step, prompts in enumerate([STEP1, STEP2, STEP1]):  # reset in place between steps, other prompt widths
        a, b = sample(dynamic, prompts, seed=step), sample(static, prompts, seed=step)
        assert a[0] == b[0] and a[1] == b[1], step  # the same sampled tokens
        if dtype == "bfloat16":  # the sampler's log-probs (a bf16 copy): equal to bf16's rounding (8-bit mantissa;
            # the static cache sums attention over its zeroed positions too, in another order)
            assert (a[2] - b[2]).abs().max() < 4e-3 and (a[2] != 0).sum() > 30
        else:
            assert a[2] is None and b[2] is None
    cache = static.static.cache
    assert cache is not None and static.static.capacity == 76  # one cache for the run
    wide = [[2 + i % 60 for i in range(70)], [3, 4]]  # 70 + 12 > 76 positions: the cache grows once
    a, b = sample(dynamic, wide, seed=7), sample(static, wide, seed=7)
    assert a[0] == b[0] and static.static.capacity == 12 + 128 and static.static.cache is not cache
    # another number of rows (an eval batch) samples with the dynamic cache
    assert static.static.cache_for(5, 4, 12) is None and static.static.cache_for(6, 4, 13) is None


def test_compile_settings():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [compile_wanted(s, cpu) for s in (False, True, "auto")] == [False, True, False]
    assert [compile_wanted(s, cuda) for s in (False, True, "auto")] == [False, True, True]
    assert [compile_wanted(s, cuda, "static") for s in (False, True, "auto")] == [False, True, False]  # a chosen cache
    # off (the default): nothing is prepared, generate uses the dynamic cache
    gen = HFGenerator(tiny(), Tok(), RolloutConfig(max_completion_length=4))
    assert gen.prepare(6, None) is None and gen.static is None


def test_a_compiler_failure_falls_back_to_eager_with_one_line(monkeypatch):
    model = tiny()
    cfg = RolloutConfig(max_completion_length=8, compile=True)
    gen = HFGenerator(model, Tok(), cfg)

    def broken(*a, **kw):
        raise RuntimeError("no C++ compiler found\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.delattr(model, "_compiled_call", raising=False)
    before = torch.get_rng_state()
    note = gen.prepare(6, 4)
    assert note == "compiled decoding failed (RuntimeError: no C++ compiler found); sampling eagerly with the static cache"
    assert torch.equal(torch.get_rng_state(), before)  # the warm-up drew nothing from the run's stream
    eager = HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8))
    assert sample(gen, STEP1, 3)[0] == sample(eager, STEP1, 3)[0]


@pytest.mark.slow
def test_compiled_decoding_matches_eager_and_sees_the_optimizers_updates():
    """A real torch.compile (inductor, on the CPU): greedy tokens equal eager ones, before and after an in-place
    AdamW step (the compiled step reads the parameters, it did not bake them in)."""
    torch._dynamo.reset()
    model = tiny()
    cfg = RolloutConfig(max_completion_length=8, compile=True)
    gen, eager = HFGenerator(model, Tok(), cfg), HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8))
    note = gen.prepare(6, 4)
    assert note.startswith("compiled decoding (6 rows x 72 positions), ready in "), note
    assert hasattr(model, "_compiled_call")  # transformers compiled the decode step (it is not eager under the name)

    def greedy(g):
        return g.generate(rows(STEP1), ["p"] * 6, greedy=True).completion_ids.tolist()

    assert greedy(gen) == greedy(eager)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    before = greedy(eager)
    model.train()
    logits = model(torch.tensor([[5, 6, 7, 8, 9]])).logits
    logits[0, -1, 3].backward()  # push token 3 up
    opt.step()
    after = greedy(eager)
    assert after != before  # the update changed what greedy decoding picks
    assert greedy(gen) == after


@pytest.mark.slow
def test_a_compiled_run_samples_what_an_eager_run_samples(tmp_path):
    """`grpo train rollout.compile=true` end to end on the CPU: compiled once before step 1 (the start line says so
    and for how long), then the same completions, step by step, as the eager run with the dynamic cache."""
    from helpers import cli, read_jsonl

    runs = {}
    for name, extra in (("compiled", ["rollout.compile=true"]), ("eager", [])):
        p = cli("train", "recipes/ci-tiny.yaml", "-o", str(tmp_path / name), "train.max_steps=3",
                "checkpoint.every_steps=0", *extra)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[name] = (p.stdout + p.stderr, read_jsonl(tmp_path / name / "rollouts.jsonl"))
    assert "sampling: compiled decoding (8 rows x 80 positions), ready in " in runs["compiled"][0]
    assert "sampling:" not in runs["eager"][0]
    compiled, eager = runs["compiled"][1], runs["eager"][1]
    assert len(compiled) == len(eager) == 24
    assert [r["completion"] for r in compiled] == [r["completion"] for r in eager]


@pytest.mark.parametrize("overrides, message", [
    (["rollout.compile=true", "rollout.backend=vllm"], "rollout.compile: compiled decoding is the hf backend's"),
    (["rollout.compile=true", "rollout.cache_implementation=static"],
     "rollout.cache_implementation: 'static' with rollout.compile"),
    (["rollout.compile=sometimes"], "rollout.compile"),
])
def test_compile_settings_a_recipe_cannot_have(overrides, message):
    from grpo_cli.errors import RecipeError
    from grpo_cli.recipe.files import load_recipe

    from helpers import ROOT

    with pytest.raises(RecipeError, match=message):
        load_recipe(ROOT / "recipes/ci-tiny.yaml", overrides)
    load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.compile=auto", "rollout.backend=vllm"])  # auto: hf on CUDA only
    # auto is the default, and it leaves a cache the recipe chose alone: no error, and nothing compiles
    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.cache_implementation=static"])
    assert recipe.rollout.compile == "auto"


def test_auto_leaves_a_chosen_cache_alone_even_on_cuda(monkeypatch):
    """rollout.compile auto with rollout.cache_implementation set: prepare() compiles nothing, whatever the device."""
    from grpo_cli.rollout import hf

    real = hf.compile_wanted  # the real rule, on a CUDA device
    monkeypatch.setattr(hf, "compile_wanted", lambda setting, device, cache=None: real(setting, torch.device("cuda"),
                                                                                       cache))
    model = tiny()
    chosen = hf.HFGenerator(model, Tok(), RolloutConfig(max_completion_length=8, cache_implementation="static"))
    assert chosen.prepare(rows=4, prompt_width=4) is None and chosen.static is None
