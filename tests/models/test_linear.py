"""Linear layers that add their weight gradients into the kept ones in place (grpo_cli/models/linear.py): autograd's
gradients (bit for bit where a backward uses each weight once; to float rounding where a group's prompt adds its use
after the completions'), no tensor of a weight's shape made in a backward once the gradient is kept, and the class's
own forward wherever it does not apply."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_cli.algo.logprobs import KEEP_LOGITS, token_logprobs
from grpo_cli.models import linear
from grpo_cli.models.linear import AccumulatingLinear, accumulates, use_accumulating_linears
from grpo_cli.models.swiglu import use_lean_mlp

from helpers import counted_applies


def model(tied: bool = False, seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=tied)
    return AutoModelForCausalLM.from_config(cfg).float()


def batch(rows: int = 4, P: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(1)
    p = torch.randint(3, 97, (rows // 2, P), generator=g).repeat_interleave(2, 0)  # two groups of two rows
    pm = torch.ones(rows, P, dtype=torch.long)
    pm[:2, :2] = 0
    c = torch.randint(3, 97, (rows, T), generator=g)
    return p, pm, c, torch.ones(rows, T, dtype=torch.long)


def two_micro_batches(m, **kw) -> dict[str, torch.Tensor]:
    """The gradients of a step of two micro-batches (the second adds into what the first left)."""
    data = batch()
    for rows in (slice(0, 2), slice(2, 4)):
        lp, _ = token_logprobs(m, *(t[rows] for t in data), **kw)
        lp.sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}


def test_gradients_are_autograds_bit_for_bit_where_each_weight_is_used_once():
    torch.set_num_threads(1)
    plain = model()
    acc = copy.deepcopy(plain)
    assert use_accumulating_linears(acc) == 2 * 7 + 1  # q, k, v, o, gate, up, down a layer, and the LM head
    for lean in (False, True):  # the model's own MLP, and the lean one's down projection (models/swiglu.py)
        a, b = copy.deepcopy(plain), copy.deepcopy(acc)
        if lean:
            use_lean_mlp(a)
            use_lean_mlp(b)
        want = two_micro_batches(a, shared_prompts=False, chunked_head=False)
        got = two_micro_batches(b, shared_prompts=False, chunked_head=False)
        for name, grad in want.items():
            assert torch.equal(grad, got[name]), name
        assert want["model.layers.0.self_attn.q_proj.weight"].norm() > 1e-3


@pytest.mark.parametrize("chunked_head", [True, KEEP_LOGITS])
def test_a_groups_prompt_run_once_adds_its_use_after_the_completions_to_float_rounding(chunked_head):
    torch.set_num_threads(1)
    plain = model(tied=True)
    acc = copy.deepcopy(plain)
    use_accumulating_linears(acc)
    want = two_micro_batches(plain, chunked_head=chunked_head)
    got = two_micro_batches(acc, chunked_head=chunked_head)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)


class NewTensors(TorchDispatchMode):
    """The shapes of the tensors the operators make (views and in-place operators make none)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):  # not a view, an in-place or out= op
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.shapes.append(tuple(t.shape))
        return out


def weight_shaped_in_backward(m) -> int:
    """How many tensors of a linear weight's shape the backward of a step's second micro-batch makes."""
    data = batch()
    lp, _ = token_logprobs(m, *(t[:2] for t in data))
    lp.sum().backward()  # the first micro-batch: the gradients exist from here on
    lp, _ = token_logprobs(m, *(t[2:] for t in data))
    shapes = {tuple(mod.weight.shape) for mod in m.modules() if type(mod) is torch.nn.Linear}
    with NewTensors() as made:
        lp.sum().backward()
    return sum(s in shapes for s in made.shapes)


def test_no_tensor_of_a_weights_shape_is_made_in_the_backward_once_the_gradient_is_kept():
    torch.set_num_threads(1)
    plain = model(tied=True)
    acc = copy.deepcopy(plain)
    use_accumulating_linears(acc)
    use_lean_mlp(acc)
    # autograd: each weight's gradient of the completions, the prompt's, their sum (the head's: the chunked head's own)
    assert weight_shaped_in_backward(plain) >= 2 * 7 * 2
    assert weight_shaped_in_backward(acc) == 0


@pytest.mark.parametrize("bias", [False, True])
def test_accumulating_linear_gives_the_derivatives_and_adds_into_a_kept_gradient(bias):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    assert torch.autograd.gradcheck(AccumulatingLinear.apply, (x, w, b))  # autograd.grad: a new tensor
    kept = torch.randn(4, 5, dtype=torch.float64)
    w.grad = kept
    before = kept.clone()
    g = torch.randn(2, 3, 4, dtype=torch.float64)
    AccumulatingLinear.apply(x, w, b).backward(g)
    assert w.grad is kept  # added in place
    torch.testing.assert_close(kept, before + g.reshape(-1, 4).t() @ x.detach().reshape(-1, 5))
    if bias:
        torch.testing.assert_close(b.grad, g.reshape(-1, 4).sum(0))


def test_the_classs_own_forward_where_it_does_not_apply(monkeypatch):
    torch.set_num_threads(1)
    m = model()
    use_accumulating_linears(m)
    calls = counted_applies(monkeypatch, linear.AccumulatingLinear)
    data = batch()
    with torch.no_grad():  # generation, the reference's and the old policy's forwards
        token_logprobs(m, *data)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision: the class's own, autocast-aware
        token_logprobs(m, *data)
    frozen = copy.deepcopy(m).requires_grad_(False)  # a LoRA's base, a reference
    token_logprobs(frozen, *data)
    assert calls == []
    token_logprobs(m, *data, shared_prompts=False, chunked_head=False)
    assert len(calls) == 2 * 7 + 1


def test_loras_adapters_accumulate_and_the_frozen_base_does_not():
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(1)
    config = LoraConfig(r=4, target_modules=["q_proj", "down_proj"], init_lora_weights=False)
    plain = model()
    acc = copy.deepcopy(plain)
    use_accumulating_linears(acc)
    torch.manual_seed(1)
    plain = get_peft_model(plain, config)
    torch.manual_seed(1)
    acc = get_peft_model(acc, config)
    layer = acc.base_model.model.model.layers[0]
    adapters = [layer.self_attn.q_proj.lora_A["default"], layer.mlp.down_proj.lora_B["default"]]
    assert use_accumulating_linears(acc) == 2 * 2 * 2  # the adapters, made after the first call
    assert all(accumulates(a) for a in adapters) and accumulates(layer.self_attn.q_proj.base_layer)
    want, got = two_micro_batches(plain), two_micro_batches(acc)
    assert want.keys() == got.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert all(a.weight.grad.norm() > 0 for a in adapters)
    assert layer.self_attn.q_proj.base_layer.weight.grad is None


def test_load_model_installs_it_and_a_copy_keeps_its_own(tmp_path):
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    model().save_pretrained(tmp_path / "m")
    loaded = load_model(ModelConfig(name_or_path=str(tmp_path / "m")))
    linears = [m for m in loaded.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 15 and all(accumulates(m) for m in linears)
    twin = copy.deepcopy(loaded)  # the sampling copy is a deep copy: its layers must run on its own weights
    assert all(m.forward.__self__ is m for m in twin.modules() if type(m) is torch.nn.Linear)


@pytest.mark.parametrize("reentrant", [False, True])
def test_under_activation_checkpointing_the_gradient_is_the_parameters_own(reentrant):
    # the recomputed forward's saved tensors come back detached from the parameters: a gradient added into theirs
    # would be lost
    torch.set_num_threads(1)
    plain = model()
    use_lean_mlp(plain)
    acc = copy.deepcopy(plain)
    use_accumulating_linears(acc)
    acc.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    acc.config.use_cache = False
    want = two_micro_batches(plain, shared_prompts=False)
    got = two_micro_batches(acc, shared_prompts=False)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("up", [False, True], ids=["kept", "up recomputed"])
def test_a_layer_fed_by_a_lean_norm_keeps_the_norms_input_not_its_output_for_the_same_gradients(monkeypatch, up):
    from grpo_cli.models import swiglu
    from grpo_cli.models.rmsnorm import use_lean_norms
    from grpo_cli.models.swiglu import recompute_up_projection

    from helpers import saved_for_backward

    torch.set_num_threads(1)
    m = model()
    use_lean_norms(m)
    use_lean_mlp(m)
    use_accumulating_linears(m)
    recompute_up_projection(m, up)  # the MLP's input kept by GatedUpDown itself
    own = copy.deepcopy(m)  # the same layers keeping the norm's output itself
    data = batch()

    def kept_and_grads(net, norms):
        monkeypatch.setattr(linear, "NORMALIZED", norms)
        monkeypatch.setattr(swiglu, "NORMALIZED", norms)
        with saved_for_backward(net) as saved:
            lp, _ = token_logprobs(net, *data, shared_prompts=False, chunked_head=False)
        lp.sum().backward()
        hidden = {address for address, shape, _, _ in saved if shape[-1:] == (32,) and shape[:-1] != (1,)}
        return len(hidden), {n: p.grad for n, p in net.named_parameters()}

    from grpo_cli.models.rmsnorm import NORMALIZED
    lean_kept, lean = kept_and_grads(m, NORMALIZED)
    own_kept, grads = kept_and_grads(own, {})
    assert own_kept - lean_kept == 2 * 2  # each layer's two norm outputs (attention's input, the MLP's)
    for name, grad in grads.items():
        assert torch.equal(grad, lean[name]), name
