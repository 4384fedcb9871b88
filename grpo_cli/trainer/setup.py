"""Setting a run up: where it starts (a fresh folder or a checkpoint, the recipe's drift), the policy and its
reference on accelerate's devices, the optimizer and learning-rate schedule, the prompt stream.

The order of the steps is part of the contract: it fixes what every RNG draws, so a run and its resume sample
the same tokens (LoRA's fresh adapters draw from torch's generator after `torch.manual_seed(train.seed)`; a
colocated vLLM engine re-seeds torch's generator on CPU; a fresh run then seeds every process apart).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_cli.agents.tools import schemas
from grpo_cli.algo.logprobs import HEAD_CHUNKED, KEEP_LOGITS
from grpo_cli.algo.packing import PACKED_MODELS
from grpo_cli.data.prompts import PromptStream
from grpo_cli.data.sources import load_rows
from grpo_cli.errors import RunFolderError, SetupError
from grpo_cli.models.attention import grouped_heads
from grpo_cli.models.loading import disable_dropout, load_model, load_tokenizer, resolve_mixed_precision
from grpo_cli.models.lora import load_policy, parameter_summary
from grpo_cli.models.swiglu import recompute_up_projection
from grpo_cli.recipe.specs import OPTIMIZERS
from grpo_cli.registry import Registry
from grpo_cli.run.folder import check_drift, start_point
from grpo_cli.run.rewind import rewind as set_aside_later
from grpo_cli.trainer.blocks import gradient_block, moments_in_blocks
from grpo_cli.trainer.distributed import is_deepspeed, is_fsdp
from grpo_cli.trainer.offload import HostOptimizer, offloads

log = logging.getLogger(__name__)


def start_from(run_dir: Path, resume: str | None, start_over: bool, allow_recipe_change: bool, recipe,
               accelerator, rewind: bool = False) -> tuple[Path | None, dict[str, tuple[Any, Any]]]:
    """The checkpoint to continue from (None: step 1) and the recipe fields that differ from its; RunFolderError for
    a folder that would be rewound or overwritten silently, or a change a resume may not make. `rewind`: the later
    checkpoints of the folder are set aside once the resume is known to go ahead (grpo_cli/run/rewind.py)."""
    main = accelerator.is_main_process
    say = print if main else (lambda _: None)
    with accelerator.main_process_first():  # the main process carries out --start-over before the others look
        checkpoint = start_point(run_dir, resume, start_over=start_over, rewind=rewind, delete=main, say=say)
    if checkpoint is None:
        return None, {}
    changes = check_drift(checkpoint, recipe.model_dump(mode="json"), allow_recipe_change)
    if "train.optimizer" in changes:
        old, new = changes["train.optimizer"]
        raise RunFolderError(f"train.optimizer cannot change on resume ({old} -> {new}): the checkpoint holds {old}'s "
                             f"state. Start a new run from its weights instead: model.name_or_path={checkpoint}")
    if rewind and main:
        set_aside_later(Path(run_dir), checkpoint, say)
    return checkpoint, changes


@dataclass(frozen=True)
class ForwardChoices:
    """How the trainer runs a training forward and backward, decided once from the recipe, the device and the
    model's config: `build_policy` follows it, and `grpo doctor`'s memory plan counts with it."""

    shared_prompts: bool  # a group's prompt runs once per micro-batch (through the key/value cache)
    chunked_head: bool | str  # the LM head inside the log-prob chunks (KEEP_LOGITS: their logits kept for the backward)
    lean_mlp: bool  # the gated MLP keeps gate and up for its backward, not four tensors (models/swiglu.py)
    grouped_attention: bool  # keys and values of grouped heads are not repeated (models/attention.py)
    autocast: bool  # forwards in bf16 / fp16 autocast (train.mixed_precision)
    packing: bool | str = False  # rows packed end to end (grpo_cli/algo/packing.py): True, "auto" (where fewer tokens)
    recompute_up: bool = False  # the lean MLP recomputes its up projection in the backward (models/swiglu.py)
    lean_norms: bool = True  # RMS norms keep their input, not two float32 copies (models/rmsnorm.py): whole weights


def head_and_up(t, device_type: str) -> tuple[bool | str, bool]:
    """train.chunked_lm_head and train.recompute_up_projection on `device_type`, `auto` decided: the head's logits
    recomputed in the backward on CUDA and kept on CPUs; the up projection recomputed on CUDA."""
    head = (True if device_type == "cuda" else KEEP_LOGITS) if t.chunked_lm_head == "auto" else t.chunked_lm_head
    up = device_type == "cuda" if t.recompute_up_projection == "auto" else t.recompute_up_projection
    return head, bool(up)


def targeted(name: str, targets: list[str] | str) -> bool:
    """Whether LoRA's model.lora.target_modules adapt the linear layer `name` (a module's name or its last part)."""
    if targets == "all-linear":
        return True
    names = [targets] if isinstance(targets, str) else targets
    return name.rsplit(".", 1)[-1] in names


def forward_choices(recipe, device_type: str, config: Any, sharded: bool = False) -> ForwardChoices:
    """The trainer's choices for a training forward (`sharded`: FSDP or ZeRO-3 weights): what build_policy and the
    forwards it runs decide, from what is known before any weight is loaded."""
    t, m = recipe.train, recipe.model
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # a group's prompt runs once per micro-batch through the key/value cache, which gradient checkpointing turns
    # off. It pays where compute is the cost (CPU: train 7.9 -> 5.6 s/step); on a GPU the two forwards and the
    # cache gather made a micro-batch's forward + backward 2.2x slower (bench/step_phases.py, H100)
    packing = t.packing if getattr(text, "model_type", None) in PACKED_MODELS else False
    if t.packing is True and not packing:
        raise SetupError(f"train.packing: true, but grpo has not checked packing for model type "
                         f"{getattr(text, 'model_type', None)!r} (its attention may not stay inside each packed row); "
                         f"it has for: {', '.join(sorted(PACKED_MODELS))}. Set train.packing: false (or auto)")
    shared = not m.gradient_checkpointing and device_type == "cpu" and packing is not True
    wanted, up = head_and_up(t, device_type)
    # algo/logprobs._head_of's rule
    chunked = wanted if getattr(text, "model_type", None) in HEAD_CHUNKED and not sharded else False
    autocast = resolve_mixed_precision(t.mixed_precision, m.dtype) in ("bf16", "fp16")
    down_adapted = m.lora.r > 0 and targeted("down_proj", m.lora.target_modules)
    gated = getattr(text, "hidden_act", None) in ("silu", "swish") and hasattr(text, "intermediate_size")
    lean = gated and not autocast and not sharded and not down_adapted and not m.load_in_4bit  # swiglu.lean_forward
    grouped = grouped_heads(text) and m.attn_implementation in (None, "sdpa", "sdpa_grouped")  # loading.load_model
    up_adapted = m.lora.r > 0 and targeted("up_proj", m.lora.target_modules)
    return ForwardChoices(shared, chunked, lean, grouped, autocast, packing, lean and up and not up_adapted,
                          lean_norms=not sharded)


@dataclass
class Policy:
    """The trained model on accelerate's devices, and what trains it."""

    tokenizer: Any
    model: Any  # prepared by accelerate (DDP, FSDP or DeepSpeed wrapped)
    reference: Any  # a frozen copy for the KL (beta > 0, full fine-tuning), else None
    teacher: Any  # on-policy distillation's frozen teacher (recipe distillation), else None
    optimizer: Any
    scheduler: Any
    model_cfg: Any  # the model section it was loaded from (a checkpoint's folder when resuming)
    summary: str  # its parameters, for the run's first line
    sharded: bool  # weights split over processes (FSDP, ZeRO-3): every process runs every forward
    forward: ForwardChoices  # how its training forwards run


def build_policy(recipe, accelerator, checkpoint: Path | None) -> Policy:
    """Tokenizer, policy (fresh, or the checkpoint's weights or LoRA adapters), the reference copy, the optimizer
    and the schedule, all prepared by accelerate."""
    r, t = recipe, recipe.train
    cfg = r.model
    if checkpoint is not None:  # weights and tokenizer come from the checkpoint
        cfg = cfg.model_copy(update={"name_or_path": str(checkpoint), "gguf_file": None, "revision": None})
    # each node's main process fills its model cache (GGUF conversion, builtin models) before the others
    # there read it; on a filesystem the nodes share, the caches are written atomically (models/loading.py)
    with accelerator.local_main_process_first():
        tokenizer = load_tokenizer(cfg)
        model = load_policy(cfg, r.model, checkpoint, accelerator.device)
        reference = None
        if r.algorithm.beta > 0 and not r.model.lora.r:  # with LoRA the reference is the base: adapters disabled
            ref_cfg = r.model.model_copy(update={"gradient_checkpointing": False})
            reference = load_model(ref_cfg).to(accelerator.device).eval().requires_grad_(False)
        teacher = None
        if r.distillation is not None and r.distillation.teacher is not None:
            teacher_cfg = r.distillation.teacher.model_copy(update={"gradient_checkpointing": False})
            teacher = load_model(teacher_cfg).to(accelerator.device).eval().requires_grad_(False)
    disable_dropout(model)
    summary = parameter_summary(model)
    params = [p for p in model.parameters() if p.requires_grad]
    wrapped = is_fsdp(accelerator) or is_deepspeed(accelerator)  # their optimizers: DTensors, DeepSpeed's wrapper
    fused = not wrapped and accelerator.device.type in ("cpu", "cuda") and OPTIMIZERS[t.optimizer].fusable
    trained = sum(p.numel() * p.element_size() for p in params)
    if offloads(t, bool(r.model.lora.r), accelerator.device.type, accelerator.num_processes, wrapped, trained):
        optimizer = offloaded_optimizer(params, t, accelerator, fused)
        summary += f"; {t.optimizer} in host memory (train.offload_optimizer)"
    else:
        optimizer = build_optimizer(params, t, fused=fused, device=accelerator.device)
        if accelerator.device.type == "cpu" and not wrapped:  # out of glibc's heap (trainer/blocks.py)
            rows = r.generation_batch_size // (accelerator.num_processes * t.mini_batches)  # an optimizer step's
            if rows > t.micro_batch_size:  # the gradients outlive a micro-batch (else the heap reuses their memory)
                gradient_block(params)
            moments_in_blocks(optimizer)
    optimizer_steps = t.max_steps * r.algorithm.num_iterations * t.mini_batches
    scheduler = make_scheduler(optimizer, t.scheduler, t.warmup_steps, optimizer_steps)
    if is_deepspeed(accelerator):  # no dataloader to infer these from; grpo accumulates itself
        accelerator.state.deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=t.micro_batch_size, gradient_accumulation_steps=1)
    model, optimizer = accelerator.prepare(model, optimizer)
    sharded = is_fsdp(accelerator) or (is_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3)
    if sharded and r.algorithm.sync_ref_model:
        raise SetupError("algorithm.sync_ref_model needs the policy's full weights on every process; with FSDP "
                         "or ZeRO-3 they are sharded: use DDP (or ZeRO-1/2) to refresh the reference")
    choices = forward_choices(r, accelerator.device.type, accelerator.unwrap_model(model).config, sharded)
    recompute_up_projection(accelerator.unwrap_model(model), choices.recompute_up)
    return Policy(tokenizer, model, reference, teacher, optimizer, scheduler, cfg, summary, sharded, choices)


def build_stream(recipe, tokenizer, accelerator):
    """The endless, seeded, resumable stream of the recipe's prompts (grpo_cli/data/prompts.py)."""
    d = recipe.data
    data_seed = d.seed if d.seed is not None else recipe.train.seed
    with accelerator.local_main_process_first():  # one download / cache write per node
        dataset = load_rows(d, data_seed)
    tools = None
    if recipe.rollout.tools:  # every prompt describes them
        tools = schemas(recipe.rollout.tools)
    return PromptStream(dataset, d, tokenizer, recipe.train.prompts_per_step, data_seed, tools=tools,
                        in_flight=recipe.rollout.max_staleness + 1)


def offloaded_optimizer(params, t, accelerator, fused: bool) -> HostOptimizer:
    """train.optimizer in host memory (train.offload_optimizer), over host copies of the trained weights."""
    if is_fsdp(accelerator) or is_deepspeed(accelerator):
        raise SetupError("train.offload_optimizer offloads one process's optimizer; FSDP and DeepSpeed shard theirs: "
                         "use FSDP's cpu_offload or DeepSpeed's offload_optimizer in the accelerate config instead")
    if not OPTIMIZERS[t.optimizer].host_step:
        hosted = " or ".join(n for n, spec in OPTIMIZERS.items() if spec.host_step)
        raise SetupError(f"train.offload_optimizer steps on the host's kernels: {hosted}, not {t.optimizer} "
                         f"({OPTIMIZERS[t.optimizer].what})")
    if accelerator.device.type != "cuda":
        log.warning("train.offload_optimizer on %s: the optimizer's state is in host memory already; the offload "
                    "only adds a copy of the trained weights", accelerator.device.type)
    return HostOptimizer(params, lambda host: build_optimizer(host, t, fused=fused, device=torch.device("cpu")))


def build_optimizer(params, t, *, fused: bool, device: torch.device | None = None) -> torch.optim.Optimizer:
    """train.optimizer with train.* settings.

    adamw: torch's; `fused`: one kernel over all tensors (5x faster than the per-tensor loop on CPU for 135M
    parameters); sharded runs (FSDP's DTensors, DeepSpeed's wrapper) keep the default. adafactor: transformers'
    with a fixed learning rate (the schedule is train.scheduler's; no relative step, no parameter scaling, as TRL
    and the Trainer build it). adamw_8bit / paged_adamw_8bit: bitsandbytes' (betas and weight decay as AdamW's)."""
    kind = getattr(t, "optimizer", "adamw")
    spec = OPTIMIZERS[kind]
    if spec.needs_cuda and (device is None or device.type != "cuda"):
        raise SetupError(f"train.optimizer {kind} ({spec.what}) needs CUDA; on this device use another: "
                         f"{', '.join(n for n, s in OPTIMIZERS.items() if not s.needs_cuda)}")
    return OPTIMIZER_BUILDERS.get(kind)(params, t, fused)


# train.optimizer -> fn(params, train section, fused) -> torch optimizer; what each keeps is recipe/specs.py's table
OPTIMIZER_BUILDERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("optimizer")


@OPTIMIZER_BUILDERS.register("adamw")
def _adamw(params, t, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2),
                             weight_decay=t.weight_decay, fused=fused or None)


@OPTIMIZER_BUILDERS.register("adafactor")
def _adafactor(params, t, fused: bool) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=t.learning_rate, scale_parameter=False, relative_step=False, warmup_init=False,
                     weight_decay=t.weight_decay, beta1=None)


def _bitsandbytes(kind: str):
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise SetupError(f"train.optimizer {kind} needs bitsandbytes: pip install 'grpo-cli[qlora]' (or "
                         "bitsandbytes)") from None
    return bnb.optim


@OPTIMIZER_BUILDERS.register("adamw_8bit")
def _adamw_8bit(params, t, fused: bool) -> torch.optim.Optimizer:
    return _bitsandbytes("adamw_8bit").AdamW8bit(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2),
                                                 weight_decay=t.weight_decay)


@OPTIMIZER_BUILDERS.register("paged_adamw_8bit")
def _paged_adamw_8bit(params, t, fused: bool) -> torch.optim.Optimizer:
    return _bitsandbytes("paged_adamw_8bit").PagedAdamW8bit(params, lr=t.learning_rate, betas=(t.adam_beta1,
                                                            t.adam_beta2), weight_decay=t.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """Linear warm-up, then constant / linear decay to 0 / cosine decay to 0 over `total` optimizer steps."""

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[kind]

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
