"""The memory plan of `grpo doctor`: a step's peak, part by part, from the model's config (no weights loaded), against
the device's free memory, with the first setting to change when it does not fit.

What it counts, in the model's dtype unless said otherwise:
- runtime: on the CPU, this process's resident memory with torch and transformers imported (peft too with LoRA; the
  trainer holds as much before its first tensor); on a GPU cuBLAS's workspaces, which torch's allocator holds and
  counts in its peak: one for each thread that runs matmuls (the forward's and autograd's), 32 MiB each on Hopper;
- weights; their gradients and the optimizer's state (AdamW: two moments; 8-bit AdamW: two bytes; Adafactor:
  factored rows and columns) for what trains (every weight, or LoRA's adapters); a second copy for the reference
  (beta > 0 with full fine-tuning);
- sampling: the KV cache of this process's rows over prompt + completion positions, the sampling copy
  (rollout.dtype), the last position's logits in float32; with a colocated vLLM engine instead its share
  (rollout.vllm.gpu_memory_utilization of the GPU, or on the CPU its own weights and rollout.vllm.cpu_kv_cache_gib);
- a micro-batch's forward and backward: per token and layer, what a Llama-style block keeps for its backward
  (grpo's lean norms, gated MLP, grouped attention and linear layers that keep a lean norm's input instead of its
  output: 5 x hidden + 2 x key/value width + 2 x intermediate values,
  1 x intermediate with the up projection recomputed; under autocast its own bytes; with gradient checkpointing one
  hidden state a layer and one layer's whole set), over the completion tokens and each group's prompt once; the
  logits and their gradient (float32 under autocast), a row's float32 log-softmax; under autocast its bfloat16
  weight copies (the LM head's chunks instead of whole logits: a chunk's logits and their float32 copies, every
  chunk's logits where they are kept, and the head's one bfloat16 copy); the attention mask sdpa reads (on a GPU one
  for each query head of a key/value head: models/attention.py folds them);
- the optimizer step's temporaries: AdamW's square root of the second moments, for every tensor at once on CUDA
  (foreach), one tensor at a time on the CPU.
The peak is the runtime, the weights, the reference, the optimizer state and the gradients, plus the largest of
sampling, the forward and backward and the optimizer step. The forwards are counted as the trainer runs them
(trainer/setup.forward_choices, the function build_policy follows): a group's prompt once, the LM head in row chunks,
the lean MLP, grouped attention and autocast where it uses them; batches are padded to the longest prompt of the rows
read (PROMPT_ROWS); a `grpo serve-vllm` samples in its own process, so nothing of sampling is counted here.

The tensors are what a GPU's allocator reports: tests/doctor/test_memory.py holds them within 10% of a real run's live
tensors (full and LoRA, fp32 and bf16 autocast, short and long prompts; bench/doctor_memory.py adds server mode), and
on an H200 the plan came within 7.4% of the allocator's peak on every shape of bench/doctor_memory.py (bench/RESULTS.md;
what is alive at a peak, bench/cuda_memory_trace.py shows). On the CPU, memory/peak_gib is resident memory, which adds
what the C allocator keeps of freed tensors: the plan counts it there as a part of its own (`retention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_cli.algo.logprobs import KEEP_LOGITS
from grpo_cli.process.memory import host_available_bytes
from grpo_cli.recipe.specs import OPTIMIZERS
from grpo_cli.trainer.offload import offloads
from grpo_cli.trainer.setup import ForwardChoices, forward_choices, head_and_up, targeted
from grpo_cli.views.verdicts import Verdict

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}
PROMPT_ROWS = 1024  # rows whose prompts are rendered for their lengths


@dataclass
class PromptLengths:
    """The lengths of the rendered prompts (tokens, cut to data.max_prompt_length) of the rows the doctor read."""

    longest: int
    first: int
    rows: int


@dataclass
class Part:
    name: str
    bytes: float
    change: str  # the setting that makes it smaller


@dataclass
class Shape:
    params: int
    linear: list[tuple[str, int, int]]  # (name, in, out) of every nn.Linear but the LM head
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # key/value heads x head size
    vocab: int
    n_rep: int = 1  # query heads per key/value head


def model_sizes(config: Any) -> Shape:
    """Parameters and sizes from the config alone: the model built on the meta device (no memory, no download)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    linear = [(n, m.in_features, m.out_features) for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m is not head]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    return Shape(params, linear, text.num_hidden_layers, text.hidden_size,
                 getattr(text, "intermediate_size", 4 * text.hidden_size), kv * head_dim, text.vocab_size, heads // kv)


def cublas_workspaces() -> float:
    """The bytes of cuBLAS's workspaces a step holds on this GPU: two (the forward's thread and autograd's each get
    a handle and a workspace from torch's allocator; 2 x 32 MiB measured on an H200), each CUBLAS_WORKSPACE_CONFIG's
    size (':KiB:count' pairs) or torch's default: 32 MiB on Hopper and later, 4096 KiB x 2 + 16 KiB x 8 before."""
    import os

    import torch

    pairs = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "").strip(":").split(":")
    try:
        size = sum(int(k) * 1024 * int(n) for k, n in zip(pairs[::2], pairs[1::2]))
    except ValueError:
        size = 0
    if not size:
        size = 32 * 2**20 if torch.cuda.get_device_capability()[0] >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8
    return 2.0 * size


def runtime_bytes(recipe) -> float:
    """This process's resident memory now (Linux), after the imports a trainer makes (peft too with LoRA: 0.1 GiB)."""
    import accelerate  # noqa: F401  (the trainer imports it too)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from grpo_cli.process.memory import status_kib

    if recipe.model.lora.r > 0:
        import peft  # noqa: F401
    return (status_kib("VmRSS") or 0) * 1024.0


def plan(recipe, shape: Shape, processes: int, prompt_tokens: int, device: str, runtime: float,
         device_total: float = 0.0, choices: ForwardChoices | None = None, teacher: Shape | None = None) -> list[Part]:
    """The parts of a step's memory; `prompt_tokens`: the longest prompt (a batch is padded to its longest);
    `device_total`: the GPU's memory (a colocated vLLM takes a share of it); `choices`: how the trainer runs the
    forwards (trainer/setup.forward_choices; default: what it decides for this recipe without a config); `teacher`:
    on-policy distillation's teacher, a frozen model beside the policy."""
    from grpo_cli.recipe.backends import backend_of

    m, t, a, ro = recipe.model, recipe.train, recipe.algorithm, recipe.rollout
    chunked, up = head_and_up(t, device)
    shared = device == "cpu" and not m.gradient_checkpointing
    ch = choices or ForwardChoices(shared_prompts=shared, chunked_head=chunked, lean_mlp=True, grouped_attention=True,
                                   autocast=t.mixed_precision in ("bf16", "fp16"), recompute_up=up)
    width = BYTES.get(m.dtype, 4)
    lora = m.lora.r > 0
    trainable = (sum(m.lora.r * (i + o) for name, i, o in shape.linear if targeted(name, m.lora.target_modules))
                 if lora else shape.params)
    rows = recipe.generation_batch_size // processes
    positions = prompt_tokens + ro.max_completion_length
    sampling_copy = shape.params * 2 if ro.dtype == "bfloat16" or (ro.dtype == "auto" and device == "cuda"
                                                                   and width == 4 and not lora) else 0
    sampling = rows * shape.layers * 2 * shape.kv_width * positions * (2 if sampling_copy else width) \
        + sampling_copy + 2 * rows * shape.vocab * 4
    vllm = 0.0
    backend = backend_of(ro)
    if not backend.in_process:  # grpo serve-vllm samples in its own process: no cache, no logits here
        sampling = 0.0
    elif backend.loads_model_folder:  # a vLLM engine in this process: its share instead of transformers' cache
        sampling = 0.0
        vllm = (ro.vllm.gpu_memory_utilization * device_total if device == "cuda"
                else shape.params * width + max(1, round(ro.vllm.cpu_kv_cache_gib)) * GIB)
    mbs = t.micro_batch_size
    activations = _activations(recipe, shape, ch, prompt_tokens, device, width)
    # the log-probs run a row at a time (algo/logprobs.py): a row's float32 log-softmax takes three [T, V] temporaries
    row = ro.max_completion_length * shape.vocab
    if ch.chunked_head:  # algo/head_gradient.py: a chunk's logits (a row's, CHUNK_LOGITS at most) and their float32
        # copies beside the head's weight gradient, built in the weight's kept gradient (added in place, from zeros on
        # a step's first micro-batch) that the embedding's rows join (under autocast with a chunk's bfloat16 product);
        # with KEEP_LOGITS every chunk's logits, kept for the backward
        from grpo_cli.algo.head_gradient import CHUNK_LOGITS

        keep = ch.chunked_head == KEEP_LOGITS  # the chunks' logits kept: a chunk's float32 log-softmax and softmax
        chunk = min(row, max(1, CHUNK_LOGITS // shape.vocab) * shape.vocab) * (8 if keep else
                                                                                (2 if ch.autocast else width) + 4 + 12)
        product = shape.vocab * shape.hidden * 2 if ch.autocast and not lora else 0
        logits = product + chunk + (mbs * row * (2 if ch.autocast else width) if keep else 0)
    else:  # kept for the backward and their gradient, in the model's dtype (autocast: its float32 copy of them)
        logits = mbs * row * 2 * (4 if ch.autocast else width) + 3 * row * 4
    # autocast keeps a bfloat16 copy of every weight a matmul saves for its backward: once for weights that train
    # (its cache), once a forward for frozen ones (LoRA's base; a group's prompt runs in a forward of its own); the
    # chunked head's once, in its backward
    calls = 2 if lora and ch.shared_prompts else 1
    head = shape.vocab * shape.hidden if ch.chunked_head else 0  # the chunked head casts its weight once, backward
    casts = ((shape.params - head) * calls + head) * 2 if ch.autocast and width == 4 else 0.0
    optimizer, step = _optimizer(recipe, shape, trainable, width, device, processes)
    parts = [
        Part("runtime", runtime, ""),
        Part("weights", shape.params * width, "model.dtype=bfloat16, or a smaller model"),
        Part("reference", shape.params * width if a.beta > 0 and not lora else 0.0,
             "algorithm.beta=0, or LoRA (model.lora.r=16: the base with adapters off is the reference)"),
        Part("teacher", teacher.params * BYTES.get(recipe.distillation.teacher.dtype, 4) if teacher else 0.0,
             "distillation.teacher.dtype=bfloat16, or a smaller teacher"),
        Part("optimizer state", trainable * optimizer,
             "model.lora.r=16, train.optimizer=adamw_8bit, or train.offload_optimizer=true" if device == "cuda"
             else "model.lora.r=16, or train.optimizer=adamw_8bit"),
        Part("gradients", trainable * width, "model.lora.r=16"),
        Part("vLLM's share (colocated: " + ("rollout.vllm.gpu_memory_utilization)" if device == "cuda" else
                                            "its weights and rollout.vllm.cpu_kv_cache_gib)"), vllm,
             "rollout.vllm.gpu_memory_utilization, or rollout.vllm.mode=server (vLLM on other GPUs)"),
        Part("sampling (KV cache, logits" + (", bf16 copy)" if sampling_copy else ")"), sampling,
             "rollout.max_completion_length, or fewer rows a process (train.prompts_per_step, --num-processes)"),
        Part("forward + backward (activations, logits" + (", bf16 weight copies)" if casts else ")"),
             activations + logits + casts, "train.micro_batch_size, or model.gradient_checkpointing=true"),
        Part("optimizer step (temporaries)", step, "train.optimizer=adamw_8bit, or model.lora.r=16"),
    ]
    return parts


def _optimizer(recipe, shape: Shape, trainable: float, width: int, device: str, processes: int) -> tuple[float, float]:
    """The optimizer's state per trained parameter and its step's temporaries. torch's AdamW on CUDA updates every
    tensor at once (foreach: the second moments' square root, one copy of what trains); on the CPU one tensor at a
    time (copies of the largest). Offloaded (trainer/offload.py), a GPU holds neither; on a CPU the offload adds its
    copies of the trained weights and their gradients."""
    m, t = recipe.model, recipe.train
    lora = m.lora.r > 0
    opt = OPTIMIZERS[t.optimizer]
    state = opt.state_bytes or opt.state_widths * width
    largest = (max([i * o for name, i, o in shape.linear] + [shape.vocab * shape.hidden]) if not lora
               else max((m.lora.r * (i + o) for name, i, o in shape.linear if targeted(name, m.lora.target_modules)),
                        default=0))
    step = trainable * width if device == "cuda" and opt.foreach_on_cuda else opt.step_largest * largest * width
    if offloads(t, lora, device, processes, False, trainable * width):
        return (0.0, 0.0) if device == "cuda" else (state + 2 * width, step)
    return state, step


def _activations(recipe, shape: Shape, ch: ForwardChoices, prompt_tokens: int, device: str, width: int) -> float:
    """What a micro-batch's forward keeps for its backward: per token and layer the block's saved tensors, and the
    attention mask."""
    mbs, G, T = recipe.train.micro_batch_size, recipe.algorithm.num_generations, recipe.rollout.max_completion_length
    # each group's prompt once (shared prompts) or every row's, each padded to the longest
    tokens = mbs * T + (math.ceil(mbs / G) if ch.shared_prompts else mbs) * prompt_tokens
    kv = shape.kv_width if ch.grouped_attention else shape.hidden  # repeated keys and values are kept otherwise
    mlp = (1 if ch.recompute_up else 2) if ch.lean_mlp else 4
    H, I = shape.hidden, shape.intermediate
    if ch.autocast:  # bytes: the residual stream and the norms' inputs in float32 (the model's own norms keep two
        # float32 copies more), a bfloat16 cast of each matmul's input (q, k and v cast it apiece, gate and up too),
        # attention's inputs and output, the MLP's four intermediates in bfloat16 (its own forward under autocast)
        per_token_layer = (8 if ch.lean_norms else 16) * H + 16 * H + 4 * kv + 8 * I
    else:
        # lean norms: the linear layers they feed keep the norm's input, not its output (models/linear.py)
        per_token_layer = ((5 if ch.lean_norms else 8) * H + 2 * kv + mlp * I) * width
    if recipe.model.gradient_checkpointing:
        activations = tokens * (shape.layers * H * width + per_token_layer)
    else:
        activations = tokens * shape.layers * per_token_layer
    # the additive mask sdpa reads, made once a forward (models/attention.py): [rows, 1, T, T] on the CPU, whose
    # kernel groups heads itself; elsewhere folded, one copy per query head of a key/value head, rows 16-aligned
    folded = shape.n_rep if ch.grouped_attention and device != "cpu" else 1
    positions = prompt_tokens + T
    return activations + mbs * folded * positions * (positions + -positions % 16) * (2 if ch.autocast else width)


TRANSIENT = ("sampling", "forward", "optimizer step")  # the phases of a step, one at a time
RETAINED = 0.6  # of the largest phase: what glibc keeps of freed tensors at the resident peak (measured 0.35-0.96)
RETENTION = "the C allocator's retention (CPU)"


def retention(parts: list[Part]) -> Part:
    """On the CPU resident memory (memory/peak_gib there) also holds what glibc keeps of the tensors a step frees:
    below its mmap threshold (up to 32 MiB) they come from heaps it returns only from the top, so fragments stay.
    Measured at the resident peak against live tensors: 0.35-0.96 of the step's largest phase over the 7 shapes of
    bench/doctor_memory.py and SmolLM2-135M's quickstart step (bench/RESULTS.md); counted as 0.6 of it."""
    largest = max(p.bytes for p in parts if p.name.startswith(TRANSIENT))
    return Part(RETENTION, RETAINED * largest, "train.micro_batch_size (it scales with a step's largest phase)")


def peak(parts: list[Part]) -> float:
    fixed = sum(p.bytes for p in parts if not p.name.startswith(TRANSIENT))
    return fixed + max(p.bytes for p in parts if p.name.startswith(TRANSIENT))


def free_bytes(device: str) -> float | None:
    if device == "cuda":
        import torch

        return float(torch.cuda.mem_get_info()[0])
    return host_available_bytes()


def prompt_lengths(batch) -> PromptLengths:
    """The lengths of a PromptBatch's prompts as the trainer tokenizes them (cut to data.max_prompt_length)."""
    lengths = [len(ids) for ids in batch.input_ids]
    return PromptLengths(max(lengths), lengths[0], len(lengths))


def check_memory(recipe, config: Any, processes: int, prompts: PromptLengths, teacher: Any = None) -> Verdict:
    import torch

    if config is None:
        return Verdict("memory plan", "skip", "the model's config could not be read")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    total_memory = float(torch.cuda.mem_get_info()[1]) if device == "cuda" else 0.0
    choices = forward_choices(recipe, device, config)
    parts = plan(recipe, model_sizes(config), processes, prompts.longest, device,
                 cublas_workspaces() if device == "cuda" else runtime_bytes(recipe), total_memory, choices,
                 model_sizes(teacher) if teacher is not None else None)
    if device == "cpu":
        parts.append(retention(parts))
    total, free = peak(parts), free_bytes(device)
    per = f" per process ({processes} on this machine)" if processes > 1 and device == "cpu" else ""
    evidence = [f"{p.name}: {_size(p.bytes)}" for p in parts if p.bytes] + [
        f"peak: {total / GIB:.2f} GiB{per} (the fixed parts + the largest of sampling, forward + backward and the "
        f"optimizer step)",
        f"prompts: the longest {prompts.longest} tokens of {prompts.rows} rows read ({prompts.first} the first; a "
        f"batch is padded to its longest)",
        "forwards as the trainer runs them: " + ", ".join(
            name for name, on in (("a group's prompt once", choices.shared_prompts),
                                  ("the LM head in chunks" + (", their logits kept" if choices.chunked_head ==
                                                              KEEP_LOGITS else ""), bool(choices.chunked_head)),
                                  ("the lean gated MLP", choices.lean_mlp),
                                  ("its up projection recomputed", choices.recompute_up),
                                  ("the lean RMS norms", choices.lean_norms),
                                  ("grouped attention", choices.grouped_attention),
                                  ("autocast", choices.autocast),
                                  ("rows packed (planned as padded: the worst case)", choices.packing is True),
                                  ("rows packed where that runs fewer tokens (planned as padded)",
                                   choices.packing == "auto")) if on)
        or "as the model's own"]
    need = total * (processes if device == "cpu" else 1)
    if free is not None:
        evidence.append(f"free on this machine's {device}: {free / GIB:.1f} GiB (MemAvailable or cudaMemGetInfo)")
    if free is not None and need > free:
        biggest = max((p for p in parts if p.change and p.bytes), key=lambda p: p.bytes)
        return Verdict("memory plan", "fail", f"needs about {need / GIB:.1f} GiB, {free / GIB:.1f} GiB free: "
                       f"the largest part is {biggest.name} ({biggest.bytes / GIB:.1f} GiB)", evidence,
                       biggest.change)
    if free is not None and need > 0.85 * free:
        return Verdict("memory plan", "warn", f"needs about {need / GIB:.1f} GiB of {free / GIB:.1f} GiB free",
                       evidence, "leave room: other processes and the allocator's cache need some")
    return Verdict("memory plan", "ok", f"about {total / GIB:.2f} GiB at its peak" + per, evidence)


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"
