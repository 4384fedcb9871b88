"""Weight files `grpo serve-vllm` will load, checked before they touch the engine.

vLLM's loaders index their parameters by name and copy tensors in place: an unknown name, a wrong
shape or an unreadable file raises inside the worker, and with the multiprocess engine that kills it
(EngineDeadError from then on). So a file is read only from the server's weights directory, and
its safetensors header (names, dtypes, shapes, offsets; not the data) is checked first against the
model's own Hugging Face state_dict:
  - every name is one of the model's (a tied copy such as lm_head.weight with tied embeddings may be
    absent: vLLM ignores it and reads the embedding);
  - shapes match exactly; dtypes are F32, BF16 or F16 (what trainers send; vLLM casts to its dtype);
  - the file holds every tensor, or the request says `partial`, and then it holds every tensor of
    each vLLM layer it touches: vLLM fuses q/k/v and gate/up into one layer, and a layer it gets only
    part of is rebuilt from uninitialised memory (vllm/model_executor/model_loader/reload/layerwise.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grpo_cli.errors import RequestError

ACCEPTED_DTYPES = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class WeightSpec:
    """The model's tensors by HF name, and which of them vLLM loads as one layer."""

    shapes: dict[str, tuple[int, ...]]  # state_dict order
    optional: frozenset[str]  # tied copies: may be absent from a complete file
    packed: dict[str, list[str]]  # vLLM's packed_modules_mapping, e.g. qkv_proj -> [q_proj, k_proj, v_proj]

    @property
    def numel(self) -> int:
        total = 0
        for shape in self.shapes.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def layer_of(self, name: str) -> list[str]:
        """The names vLLM loads together with `name`: every tensor of its (possibly fused) module."""
        module = name.rpartition(".")[0]
        parent, _, leaf = module.rpartition(".")
        fused = [members for members in self.packed.values() if leaf in members]
        modules = {f"{parent}.{m}" if parent else m for m in fused[0]} if fused else {module}
        return [n for n in self.shapes if n.rpartition(".")[0] in modules]


def weight_spec(model: str, packed: dict[str, list[str]], trust_remote_code: bool = False) -> WeightSpec:
    """HF state_dict names and shapes of `model`, from its config on the meta device (no memory, ~0.2 s)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    shapes = {name: tuple(t.shape) for name, t in hf.state_dict().items()}  # persistent buffers included
    optional, seen = set(), set()
    for name, p in hf.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            optional.add(name)
        seen.add(id(p))
    return WeightSpec(shapes, frozenset(optional), {k: list(v) for k, v in (packed or {}).items()})


def authorize_path(path: str, weights_dir: Path) -> Path:
    """A client-named file -> its real path, if it lies in `weights_dir`; 403 otherwise, existing or not,
    so that the answer tells nothing about files elsewhere on the server."""
    real = Path(os.path.realpath(path))  # symlinks and '..' resolved before the check
    if not Path(path).is_absolute() or not real.is_relative_to(weights_dir):
        raise RequestError(403, f"the server reads weight files only from its weights directory {weights_dir} "
                                f"(GET /info); {path!r} is not in it. Write the file there, or upload its bytes "
                                "(Content-Type: application/octet-stream, X-Weight-Version)", "path")
    if not real.is_file():
        raise RequestError(400, f"no such file in the weights directory: {path!r}", "path")
    return real


def check_weights_file(path: Path, spec: WeightSpec, partial: bool) -> int:
    """Refuse (422, naming the first bad tensor) a file the engine must not load; -> its tensor count."""
    header, _ = read_header(path)
    if not header:
        raise RequestError(422, "the file holds no tensors", "weights")
    for name, (dtype, shape) in header.items():
        if name not in spec.shapes:
            example = next(iter(spec.shapes))
            raise RequestError(422, f"tensor {name!r} is not a weight of this model (names are the model's "
                                    f"Hugging Face state_dict names, e.g. {example!r})", "weights")
        if dtype not in ACCEPTED_DTYPES:
            raise RequestError(422, f"tensor {name!r} has dtype {dtype}; accepted: {', '.join(ACCEPTED_DTYPES)} "
                                    "(vLLM casts them to its own dtype)", "weights")
        if shape != spec.shapes[name]:
            raise RequestError(422, f"tensor {name!r} has shape {shape}; the model's is {spec.shapes[name]}", "weights")
    if not partial:
        missing = [n for n in spec.shapes if n not in header and n not in spec.optional]
        if missing:
            raise RequestError(422, f"the file holds {len(header)} of the model's {len(spec.shapes)} tensors; missing: "
                                    f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}. Send them all, or "
                                    "mark the update partial (\"partial\": true, or the header X-Weight-Partial: true)",
                               "weights")
        return len(header)
    for name in header:
        absent = [n for n in spec.layer_of(name) if n not in header and n not in spec.optional]
        if absent:
            raise RequestError(422, f"partial update: vLLM loads {name!r} in one layer with {', '.join(absent)}, "
                                    "which the file lacks; send every tensor of that layer", "weights")
    return len(header)


def read_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """Names -> (dtype, shape) from the safetensors header, and its metadata; the library checks offsets and sizes."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():
                s = f.get_slice(name)
                out[name] = (s.get_dtype(), tuple(s.get_shape()))
            return out, dict(f.metadata() or {})
    except Exception as e:  # SafetensorError, or OSError for a file that vanished: both the client's doing
        raise RequestError(422, f"not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})",
                           "weights") from None
