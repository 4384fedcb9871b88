"""A Llama-style decoder layer's decode step in one call on the CPU, while sampling.

With the weights read at the memory's speed (models/few_rows.py), a decode step of SmolLM2-135M on 2 CPU cores
spent as long again around its products: ~40 small operators a layer (two RMS norms, the rotary embedding, the
cache's write, attention, SiLU, the residual adds), each a dispatch, an allocation and a parallel region of a few
microseconds for a few thousand numbers, and transformers' modules in Python around them (0.66 s of operators and
~0.3 s of Python in a 1.97 s generate, bench/RESULTS.md). `decode_layer.c` runs the whole layer for the one new
token of each row in one parallel region: norm, the q/k/v products (few_rows.c's tiles), the rotary embedding of
the query and the new key, the key and value written into the cache, attention over the positions the mask shows,
the output product added into the residual, norm, the gate and up products with SiLU and their product, and the
down product added into the residual; the threads meet at seven barriers. In the bench's generate (SmolLM2-135M,
16 rows, 32 new tokens) that is 1.46 s against 1.93 s with the products alone (`python bench/few_rows.py`).

The sums are the model's operations in another order, and softmax and SiLU take their exponentials from a
polynomial of their own (to about an ulp), so the layer's output equals the model's to float rounding, not bit for
bit (tested against the model's own forward, and the sampled tokens' distribution by a chi-square test); each
output is one thread's sum, so the result does not depend on the number of threads. It runs where every part is what the C code computes and nothing else is asked of the
layer: a decoder layer of a class in `LAYERS` with plain `nn.Linear` projections (not LoRA, quantized or sharded),
a SiLU gated MLP and RMS norms that compute what models/rmsnorm.py's lean norm computes, no sliding window; inside
`few_rows.sampling()`, outside autograd, float32 on a CPU, `few_rows.FEW_ROWS` rows of one new token each, a
rollout/preallocated.py cache layer with room for it, a boolean mask or none. Elsewhere the layer's own forward.
"""

from __future__ import annotations

import ctypes
import types
import weakref
from typing import Any

import torch

from grpo_cli.models import few_rows
from grpo_cli.models.rmsnorm import runs_lean
from grpo_cli.models.swiglu import is_silu

# decoder layers whose forward is norm, attention with Llama's rotary embedding, residual, norm, gated MLP, residual
LAYERS = {"LlamaDecoderLayer", "Qwen2DecoderLayer"}  # (SmolLM2 is a Llama; Qwen2.5 a Qwen2)
MAX_HEAD_DIM = 256  # decode_layer.c keeps a head's output in 256 / (simd.h's LANES) vectors
# layer -> (its parts, their addresses, the hidden size, its Layer or None, the sampling context it was checked in):
# `_plan`'s, beside the module (a deep copy of the model, as the sampling copy makes, has none; the parts hold no
# reference to the layer)
PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Layer(ctypes.Structure):
    """decode_layer.c's `Layer`, field for field."""

    _fields_ = ([(name, ctypes.c_long) for name in ("rows", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                                    "capacity", "position", "mask_stride", "threads")]
                + [(name, ctypes.c_double) for name in ("eps1", "eps2", "scale")]
                + [(name, ctypes.c_void_p) for name in ("norm1", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
                                                        "norm2", "wg", "bg", "wu", "bu", "wd", "bd", "cos", "sin",
                                                        "keys", "values", "mask", "hidden_states", "work")])


# where each part of a layer is, from the layer: the modules and parameters a plan was made from (`_parts`)
PARTS = tuple(tuple(path.split(".")) for path in (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
    "self_attn.o_proj.bias", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.gate_proj.bias",
    "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"))


def _parts(layer: Any) -> tuple:
    """Every module on the way to each of `PARTS` and the parameter itself (None where there is none), by the
    modules' own dictionaries (a step makes this check once a layer), and the MLP's activation."""
    out = []
    for path in PARTS:
        m = layer
        for name in path[:-1]:
            m = m._modules.get(name) if m is not None else None
            out.append(m)
        out.append(m._parameters.get(path[-1]) if m is not None else None)
    out.append(getattr(layer._modules.get("mlp"), "act_fn", None))
    return tuple(out)


def _linear(module: Any, rows: int, cols: int) -> tuple[int, int] | None:
    """(weight, bias) addresses of a plain float32 `nn.Linear` [rows, cols] (bias 0 where none), else None."""
    if type(module) is not torch.nn.Linear:
        return None
    w, b = module.weight, module.bias
    if w.dtype != torch.float32 or not w.is_cpu or tuple(w.shape) != (rows, cols) or not w.is_contiguous():
        return None
    if b is not None and (b.dtype != torch.float32 or b.shape != (rows,) or not b.is_contiguous()):
        return None
    return w.data_ptr(), b.data_ptr() if b is not None else 0


def _norm(module: Any, hidden: int) -> tuple[int, float] | None:
    if not runs_lean(module):  # a norm that computes what LeanRMSNorm does (checked once per class)
        return None
    w = module.weight
    if w.dtype != torch.float32 or not w.is_cpu or w.shape != (hidden,) or not w.is_contiguous():
        return None
    return w.data_ptr(), float(module.variance_epsilon)


def _spec(layer: Any, hidden: int) -> Layer | None:
    """A `Layer` with the layer's parameters' addresses and shapes filled in, or None where a part is not what
    decode_layer.c computes."""
    attn, mlp = layer.self_attn, layer.mlp
    d = attn.head_dim
    heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
    inner = mlp.gate_proj.out_features if type(mlp.gate_proj) is torch.nn.Linear else 0
    if d % 16 or d > MAX_HEAD_DIM or heads % kv_heads or getattr(attn, "sliding_window", None) is not None \
            or not is_silu(getattr(mlp, "act_fn", None)):
        return None
    parts = [_linear(attn.q_proj, heads * d, hidden), _linear(attn.k_proj, kv_heads * d, hidden),
             _linear(attn.v_proj, kv_heads * d, hidden), _linear(attn.o_proj, hidden, heads * d),
             _linear(mlp.gate_proj, inner, hidden), _linear(mlp.up_proj, inner, hidden),
             _linear(mlp.down_proj, hidden, inner)]
    norms = [_norm(layer.input_layernorm, hidden), _norm(layer.post_attention_layernorm, hidden)]
    if any(p is None for p in (*parts, *norms)):
        return None
    (wq, bq), (wk, bk), (wv, bv), (wo, bo), (wg, bg), (wu, bu), (wd, bd) = parts
    (norm1, eps1), (norm2, eps2) = norms
    return Layer(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=d, intermediate=inner, eps1=eps1, eps2=eps2,
                 scale=float(attn.scaling), norm1=norm1, norm2=norm2, wq=wq, bq=bq, wk=wk, bk=bk, wv=wv, bv=bv, wo=wo,
                 bo=bo, wg=wg, bg=bg, wu=wu, bu=bu, wd=wd, bd=bd)


def _plan(layer: Any, hidden: int) -> Layer | None:
    """`_spec` of the layer, made once and kept while its modules and parameters are the same objects at the same
    addresses (a LoRA wrapping a projection, a model moved or cast, makes a new one); checked once in each
    `few_rows.sampling()` context, within which the weights do not move (a generate's 30 layers x 32 steps: 30
    checks, not 960)."""
    context = few_rows.sampling_context()
    kept = PLANS.get(layer)
    if kept is not None and context and kept[4] == context and kept[2] == hidden:
        return kept[3]
    parts = _parts(layer)
    addresses = tuple(p.data_ptr() if isinstance(p, torch.Tensor) else 0 for p in parts)
    if kept is None or kept[2] != hidden or kept[1] != addresses or any(a is not b for a, b in zip(kept[0], parts)):
        kept = (parts, addresses, hidden, _spec(layer, hidden), context)
    PLANS[layer] = kept[:4] + (context,)
    return kept[3]


def _cache_layer(cache: Any, index: int, rows: int, kv_heads: int, d: int) -> Any:
    """The cache's layer `index` if it is a rollout/preallocated.py layer with room for one more position, else None."""
    layers = getattr(cache, "layers", None)
    if layers is None or not 0 <= index < len(layers) or type(layers[index]).__name__ != "PreallocatedLayer":
        return None
    c = layers[index]
    if not c.is_initialized or c.length >= c.capacity:
        return None
    for buffer in (c.key_buffer, c.value_buffer):
        if (buffer.dtype != torch.float32 or not buffer.is_cpu or not buffer.is_contiguous()
                or tuple(buffer.shape) != (rows, kv_heads, c.capacity, d)):
            return None
    return c


def _mask(mask: Any, rows: int, length: int) -> tuple[torch.Tensor | None, int] | None:
    """A boolean [rows, 1, 1, >= length] mask -> (a tensor whose rows start with the `length` positions' bytes, the
    rows' stride); None -> (None, 0) (every position seen); any other mask -> None."""
    if mask is None:
        return None, 0
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 \
            or tuple(mask.shape[:3]) != (rows, 1, 1) or mask.shape[3] < length or not mask.is_cpu:
        return None
    if mask.stride(3) != 1:
        mask = mask[:, 0, 0, :length].contiguous()
    return mask, mask.stride(0)


def step(layer: Any, hidden_states: torch.Tensor, attention_mask: Any = None, past_key_values: Any = None,
         position_embeddings: Any = None, **kwargs: Any) -> torch.Tensor | None:
    """The layer's output for a decode step by decode_layer.c (its new key and value written into the cache), or
    None where it does not apply (module docstring): the caller runs the layer's own forward."""
    if not few_rows.is_sampling() or torch.is_grad_enabled() or type(layer).__name__ not in LAYERS \
            or layer.training and layer.self_attn.attention_dropout:
        return None
    if (hidden_states.dim() != 3 or hidden_states.shape[1] != 1 or hidden_states.dtype != torch.float32
            or not hidden_states.is_cpu or hidden_states.shape[0] not in few_rows.FEW_ROWS
            or position_embeddings is None
            or any(kwargs.get(k) for k in ("output_attentions", "position_bias", "cache"))):
        return None
    rows, _, hidden = hidden_states.shape
    lib = few_rows.library()
    plan = _plan(layer, hidden) if lib is not None else None
    if plan is None:
        return None
    d = plan.head_dim
    cache = _cache_layer(past_key_values, layer.self_attn.layer_idx, rows, plan.kv_heads, d)
    cos, sin = position_embeddings
    if cache is None or cos.shape != (rows, 1, d) or sin.shape != (rows, 1, d) or cos.dtype != torch.float32 \
            or sin.dtype != torch.float32:
        return None
    seen = _mask(attention_mask, rows, cache.length + 1)
    if seen is None:
        return None
    cos, sin = cos.contiguous(), sin.contiguous()
    out = hidden_states.contiguous().clone()
    threads = torch.get_num_threads()
    width = hidden + 2 * (plan.heads + plan.kv_heads) * d + 2 * plan.intermediate
    work = torch.empty(rows * width + threads * (cache.length + 1), dtype=torch.float32)
    mask, stride = seen
    spec = Layer.from_buffer_copy(plan)
    spec.rows, spec.capacity, spec.position, spec.mask_stride, spec.threads = (
        rows, cache.capacity, cache.length, stride, threads)
    spec.cos, spec.sin, spec.keys, spec.values = (
        cos.data_ptr(), sin.data_ptr(), cache.key_buffer.data_ptr(), cache.value_buffer.data_ptr())
    spec.mask, spec.hidden_states, spec.work = (
        mask.data_ptr() if mask is not None else None, out.data_ptr(), work.data_ptr())
    lib.decode_layer(ctypes.byref(spec))
    cache.written(1)
    return out


def fused_forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if not args:
        out = step(self, hidden_states, **kwargs)
        if out is not None:
            return out
    return type(self).forward(self, hidden_states, *args, **kwargs)  # the class's own


def use_fused_decode(model: torch.nn.Module) -> int:
    """Give every decoder layer of `model` of a class in `LAYERS` the fused decode step; -> how many."""
    n = 0
    for module in model.modules():
        if type(module).__name__ in LAYERS and not fuses(module):
            module.forward = types.MethodType(fused_forward, module)
            n += 1
    return n


def fuses(module: torch.nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is fused_forward
