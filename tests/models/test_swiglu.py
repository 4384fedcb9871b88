"""The lean gated MLP (grpo_cli/models/swiglu.py): the module's own outputs and gradients, two [tokens, intermediate]
tensors kept for the backward instead of four (one with the up projection recomputed), and the module's own forward
wherever the lean one does not apply."""

import copy

import pytest
import torch

from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.models import swiglu
from grpo_cli.models.swiglu import GatedDown, GatedUpDown, lean_forward, recompute_up_projection, use_lean_mlp

from helpers import counted_applies, saved_for_backward

I = 64  # the tiny model's intermediate size


def model(seed: int = 0, layers: int = 2):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=I, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg).float()


def batch(rows: int = 4, P: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(1)
    p = torch.randint(3, 97, (rows // 2, P), generator=g).repeat_interleave(2, 0)
    pm = torch.ones(rows, P, dtype=torch.long)
    pm[:2, :2] = 0
    c = torch.randint(3, 97, (rows, T), generator=g)
    return p, pm, c, torch.ones(rows, T, dtype=torch.long)


@pytest.mark.parametrize("bias", [False, True])
def test_gated_down_gradients_are_the_derivatives(bias):
    torch.manual_seed(0)
    g = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    assert torch.autograd.gradcheck(GatedDown.apply, (g, u, w, b))
    plain = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, w, b)
    assert torch.allclose(GatedDown.apply(g, u, w, b), plain, atol=1e-12)


def test_log_probs_and_gradients_equal_the_modules_own():
    torch.set_num_threads(1)
    plain = model()
    lean = copy.deepcopy(plain)
    assert use_lean_mlp(lean) == 2
    out = []
    for m in (plain, lean):
        lp, _ = token_logprobs(m, *batch())
        lp.sum().backward()
        out.append((lp.detach(), {n: q.grad for n, q in m.named_parameters()}))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-6, rtol=0)
    for name, grad in out[0][1].items():
        assert (grad - out[1][1][name]).norm() <= 1e-5 * grad.norm() + 1e-9, name
    assert out[0][1]["model.layers.0.mlp.down_proj.weight"].norm() > 1e-3  # a real gradient through the MLP


def intermediates_saved(m) -> int:
    """How many [.., intermediate]-wide tensors autograd keeps for the backward."""
    with saved_for_backward(m) as saved:
        token_logprobs(m, *batch(), shared_prompts=False)
    return len({address for address, shape, _, _ in saved if shape and shape[-1] == I})


def test_two_intermediates_are_kept_per_layer_instead_of_four():
    plain = model()
    lean = copy.deepcopy(plain)
    use_lean_mlp(lean)
    assert intermediates_saved(plain) == 4 * 2 and intermediates_saved(lean) == 2 * 2


def test_the_modules_own_forward_where_the_lean_one_does_not_apply(monkeypatch):
    torch.set_num_threads(1)
    lean = model()
    use_lean_mlp(lean)
    calls = counted_applies(monkeypatch, swiglu.GatedDown)
    p, pm, c, cm = batch()
    with torch.no_grad():  # generation, the reference's and the old policy's forwards
        token_logprobs(lean, p, pm, c, cm)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision: the module's own, autocast-aware
        token_logprobs(lean, p, pm, c, cm)
    assert calls == []
    token_logprobs(lean, p, pm, c, cm, shared_prompts=False)
    assert len(calls) == 2  # one per layer


def test_a_lora_down_projection_keeps_the_modules_own_forward():
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(1)
    base = model()
    use_lean_mlp(base)
    reference = copy.deepcopy(base)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["gate_proj", "down_proj"], init_lora_weights=False))
    mlp = peft.base_model.model.model.layers[0].mlp
    assert mlp.forward.__func__ is lean_forward and not swiglu._plain_linear(mlp.down_proj)
    lp, _ = token_logprobs(peft, *batch())
    lp.sum().backward()
    assert mlp.down_proj.lora_A["default"].weight.grad.norm() > 0
    with torch.no_grad():  # the adapters change the output: they ran
        assert not torch.allclose(lp, token_logprobs(reference, *batch())[0], atol=1e-4)


def test_load_model_installs_it_and_a_copy_keeps_its_own(tmp_path):
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    model().save_pretrained(tmp_path / "m")
    loaded = load_model(ModelConfig(name_or_path=str(tmp_path / "m")))
    mlps = [m for m in loaded.modules() if hasattr(m, "down_proj")]
    assert len(mlps) == 2 and all(m.forward.__func__ is lean_forward for m in mlps)
    twin = copy.deepcopy(loaded)  # the sampling copy is a deep copy: its MLPs must run on its own weights
    assert all(m.forward.__self__ is m for m in twin.modules() if hasattr(m, "down_proj"))


def test_a_zero3_partitioned_down_projection_keeps_the_modules_own_forward():
    # DeepSpeed ZeRO-3 keeps a parameter as a plain tensor holding its partition (ds_id marks it) and gathers the whole
    # weight only in the pre-forward hook of the module that owns it; the lean path reads down_proj.weight without
    # calling down_proj, so it must not run then (the chunked LM head already refused such a weight: one rule now)
    torch.set_num_threads(1)
    base = model()
    use_lean_mlp(base)
    mlp = base.model.layers[0].mlp
    assert swiglu._plain_linear(mlp.down_proj)
    mlp.down_proj.weight.ds_id = 7
    assert not swiglu._plain_linear(mlp.down_proj)
    calls = []
    mlp.down_proj.register_forward_hook(lambda *a: calls.append(1))
    lp, _ = token_logprobs(base, *batch(), shared_prompts=False)
    lp.sum().backward()
    assert calls == [1]  # down_proj ran as a module (one forward), its hooks with it


@pytest.mark.parametrize("bias", [False, True])
def test_gated_up_down_gradients_are_the_derivatives(bias):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    wu = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    bu = torch.randn(5, dtype=torch.float64, requires_grad=True) if bias else None
    wd = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    bd = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    assert torch.autograd.gradcheck(GatedUpDown.apply, (x, g, wu, bu, wd, bd))
    F = torch.nn.functional
    plain = F.linear(F.silu(g) * F.linear(x, wu, bu), wd, bd)
    assert torch.allclose(GatedUpDown.apply(x, g, wu, bu, wd, bd), plain, atol=1e-12)


def test_the_up_projection_recomputed_keeps_one_intermediate_a_layer_for_the_same_numbers_bit_for_bit():
    torch.set_num_threads(1)
    lean = model()
    use_lean_mlp(lean)
    up = copy.deepcopy(lean)
    assert recompute_up_projection(up, True) == 2
    assert intermediates_saved(lean) == 2 * 2 and intermediates_saved(up) == 1 * 2
    out = []
    for m in (lean, up):
        lp, _ = token_logprobs(m, *batch(), shared_prompts=False)
        lp.sum().backward()
        out.append((lp.detach(), {n: q.grad for n, q in m.named_parameters()}))
    assert torch.equal(out[0][0], out[1][0])
    for name, grad in out[0][1].items():
        assert torch.equal(grad, out[1][1][name]), name
    assert out[1][1]["model.layers.0.mlp.up_proj.weight"].norm() > 1e-3  # a real gradient through the up projection
    assert recompute_up_projection(up, False) == 2 and intermediates_saved(up) == 2 * 2


def test_a_lora_up_projection_keeps_its_output():
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(1)
    base = model()
    use_lean_mlp(base)
    recompute_up_projection(base, True)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["up_proj"], init_lora_weights=False))
    assert intermediates_saved(peft) == 2 * 2  # GatedDown: the adapted up projection runs as a module
    lp, _ = token_logprobs(peft, *batch())
    lp.sum().backward()
    assert peft.base_model.model.model.layers[0].mlp.up_proj.lora_A["default"].weight.grad.norm() > 0


def test_train_recompute_up_projection_is_on_where_auto_says_and_off_for_an_adapted_up_projection():
    from transformers import Qwen2Config

    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.setup import forward_choices

    from helpers import ROOT

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)
    auto = load_recipe(ROOT / "recipes/ci-tiny.yaml")
    assert forward_choices(auto, "cuda", config).recompute_up and not forward_choices(auto, "cpu", config).recompute_up
    on = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["train.recompute_up_projection=true"])
    assert forward_choices(on, "cpu", config).recompute_up
    lora = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.lora.r=8", "model.lora.target_modules=[q_proj,up_proj]"])
    assert forward_choices(lora, "cuda", config).lean_mlp and not forward_choices(lora, "cuda", config).recompute_up
    mixed = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["train.mixed_precision=bf16"])  # autocast: the module's own
    assert not forward_choices(mixed, "cuda", config).recompute_up
