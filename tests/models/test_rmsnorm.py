"""The lean RMS norm (grpo_cli/models/rmsnorm.py): the module's own outputs and gradients bit for bit, its input and
one float32 value a token kept for the backward instead of two float32 copies, and the module's own forward wherever
the lean one does not apply or computes something else."""

import copy

import pytest
import torch

from grpo_cli.algo.logprobs import token_logprobs
from grpo_cli.models.rmsnorm import LeanRMSNorm, runs_lean, use_lean_norms

from helpers import saved_for_backward

H = 32  # the tiny model's hidden size


def model(seed: int = 0, layers: int = 2):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=H, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg).float()


def norms(dtype: torch.dtype, cls_name: str = "Qwen2RMSNorm"):
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    cls = {"Qwen2RMSNorm": qwen2.Qwen2RMSNorm, "LlamaRMSNorm": llama.LlamaRMSNorm}[cls_name]
    torch.manual_seed(0)
    own = cls(H, eps=1e-6).to(dtype)
    own.weight.data = (torch.randn(H) * 0.5 + 1).to(dtype)
    lean = copy.deepcopy(own)
    assert use_lean_norms(lean) == 1 and runs_lean(lean) and not runs_lean(own)
    return own, lean


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls_name", ["Qwen2RMSNorm", "LlamaRMSNorm"])
@pytest.mark.parametrize("weight_trained", [True, False])
def test_outputs_and_gradients_are_the_modules_own_bit_for_bit(dtype, cls_name, weight_trained):
    torch.set_num_threads(1)
    own, lean = norms(dtype, cls_name)
    for m in (own, lean):
        m.weight.requires_grad_(weight_trained)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 7, H, generator=g) * 3).to(dtype)
    grad = torch.randn(3, 7, H, generator=g).to(dtype)
    out = []
    for m in (own, lean):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.backward(grad)
        out.append((y, xi.grad, m.weight.grad))
    assert out[1][0].grad_fn.name() == "LeanRMSNormBackward"
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert out[0][1].abs().max() > 0.1  # a real gradient
    if weight_trained:
        assert torch.equal(out[0][2], out[1][2])
    else:
        assert out[0][2] is None and out[1][2] is None


def test_gradients_are_the_derivatives():
    # against autograd through the norm written in float64 (LeanRMSNorm computes in float32, as the models do)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    g = torch.randn(2, 3, 5)
    LeanRMSNorm.apply(x, w, 1e-6).backward(g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(g.double())
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-5) and torch.allclose(w.grad.double(), w64.grad, atol=1e-5)
    assert x64.grad.abs().max() > 0.1 and w64.grad.abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_keeps_its_input_and_a_value_a_token_instead_of_two_float32_copies(dtype):
    own, lean = norms(dtype)
    x = torch.randn(4, 16, H).to(dtype).requires_grad_()
    kept = {}
    for name, m in (("own", own), ("lean", lean)):
        with saved_for_backward(m) as saved:
            m(x)
        kept[name] = sum({address: nbytes for address, _, nbytes, _ in saved}.values())
    tokens = 4 * 16
    # the model's own: x in float32 (x itself when it is float32), the reciprocal root, the normalized tensor before
    # the scale; the lean one: x as it is and the reciprocal root
    assert kept["own"] == tokens * H * 4 + tokens * 4 + tokens * H * x.element_size()
    assert kept["lean"] == tokens * H * x.element_size() + tokens * 4


def test_a_norm_that_computes_something_else_keeps_its_own_forward():
    class OffsetRMSNorm(torch.nn.Module):  # Gemma's: the weight is an offset from 1
        def __init__(self, hidden):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(hidden))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
                    * (1.0 + self.weight.float())).to(x.dtype)

    class EpsRMSNorm(torch.nn.Module):  # a norm that names its epsilon otherwise
        def __init__(self, hidden):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden))
            self.eps = 1e-6

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    class UnscaledRMSNorm(torch.nn.Module):  # a weight it never reads: at its initial ones it would look the same
        def __init__(self, hidden):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden))
            self.variance_epsilon = 1e-6

        def forward(self, x):  # in the weight's dtype, as a scaled norm's output is
            x32 = x.float()
            n = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)
            return n.to(self.weight.dtype)

    block = torch.nn.Sequential(OffsetRMSNorm(H), EpsRMSNorm(H), UnscaledRMSNorm(H))
    assert use_lean_norms(block) == 0 and not any(runs_lean(m) for m in block)


def test_the_modules_own_forward_where_the_lean_one_does_not_apply():
    torch.set_num_threads(1)
    m = model()
    assert use_lean_norms(m) == 2 * 2 + 1  # two a layer and the final one
    assert use_lean_norms(m) == 0  # installed once
    norm = m.model.layers[0].input_layernorm
    x = torch.randn(2, 5, H)
    with torch.no_grad():  # generation, the reference's and the old policy's forwards
        assert norm(x).grad_fn is None
    assert norm(x).grad_fn.name() == "LeanRMSNormBackward"  # the weight's gradient
    norm.weight.requires_grad_(False)
    assert norm(x).grad_fn is None  # neither the input nor the weight needs a gradient
    assert norm(x.requires_grad_()).grad_fn.name() == "LeanRMSNormBackward"  # LoRA: the input's gradient
    norm.weight.ds_id = 3  # a DeepSpeed ZeRO-3 partition: the module's own forward (its hooks gather the weight)
    assert norm(x).grad_fn.name() == "MulBackward0"


def test_log_probs_and_gradients_equal_the_models_own_and_a_copy_keeps_its_own(tmp_path):
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    torch.set_num_threads(1)
    plain = model()
    plain.save_pretrained(tmp_path / "m")
    loaded = load_model(ModelConfig(name_or_path=str(tmp_path / "m")))
    assert sum(runs_lean(m) for m in loaded.modules()) == 5
    g = torch.Generator().manual_seed(1)
    p = torch.randint(3, 97, (4, 6), generator=g)
    pm = torch.ones_like(p)
    pm[:2, :2] = 0
    c = torch.randint(3, 97, (4, 5), generator=g)
    out = []
    for m in (plain, loaded):
        lp, _ = token_logprobs(m, p, pm, c, torch.ones_like(c), shared_prompts=False)
        lp.sum().backward()
        out.append((lp.detach(), {n: q.grad for n, q in m.named_parameters()}))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-6, rtol=0)
    for name, grad in out[0][1].items():
        assert (grad - out[1][1][name]).norm() <= 1e-5 * grad.norm() + 1e-9, name
    assert out[0][1]["model.layers.0.input_layernorm.weight"].norm() > 1e-4
    twin = copy.deepcopy(loaded)  # the sampling copy is a deep copy: its norms must run on its own weights
    assert all(m.forward.__self__ is m for m in twin.modules() if runs_lean(m))
    with torch.no_grad():
        twin.model.norm.weight.mul_(2)
        x = torch.randn(1, 2, H)
        assert not torch.equal(twin.model.norm(x), loaded.model.norm(x))
