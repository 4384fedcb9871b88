"""The recipe's `train` section: steps and batches, the optimizer and its schedule, and how a step runs on the
machine (memory, threads, the stall watchdog). Checks across sections are checks.py's. Never imports torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_cli.recipe.section import Section
from grpo_cli.recipe.specs import OPTIMIZERS


class TrainConfig(Section):
    max_steps: int | None = Field(None, ge=1, description="Training steps (one generation batch each), or train.epochs.")
    epochs: float | None = Field(None, gt=0, description=(
        "Passes over the data when max_steps is not given (TRL's num_train_epochs): max_steps = ceil(epochs x rows / "
        "prompts_per_step), the data's rows (after data.limit) counted as the run starts; not with data.streaming."))
    prompts_per_step: int = Field(8, ge=1, description="B: prompts per step; the batch holds B * G completions.")
    micro_batch_size: int = Field(8, ge=1, description="Completions per forward/backward; the rest is gradient accumulation.")
    mini_batches: int = Field(1, ge=1, description=(
        "Optimizer steps per generation batch: each process's rows split in order into this many mini-batches, one "
        "optimizer step each, the old policy's log-probs taken once before the first (verl's train_batch_size / "
        "ppo_mini_batch_size; TRL's steps_per_generation / gradient_accumulation_steps). With mu "
        "(algorithm.num_iterations) the step makes mu x mini_batches optimizer steps."))
    packing: bool | Literal["auto"] = Field("auto", description=(
        "Pack a micro-batch's rows end to end for the training forwards (the policy's, the old policy's, the "
        "reference's): positions restart with each row and attention stays inside it, so no padding is computed and "
        "the log-probs and gradients are the padded layout's. Rows share bins as long as the longest row (sdpa, "
        "eager) or one bin (flash and flex attention's varlen kernels); each row carries its prompt. auto: a "
        "micro-batch is packed where that runs fewer tokens than padding (on CPUs, than a group's prompt once), "
        "for the model types grpo has checked; true: always, and an error for other model types."))
    optimizer: Literal[tuple(OPTIMIZERS)] = Field(  # type: ignore[valid-type]  (recipe/specs.py's table)
        "adamw", description="; ".join(f"{s.name}: {s.what}" for s in OPTIMIZERS.values()) + ".")
    offload_optimizer: bool | Literal["auto"] = Field("auto", description=(
        "Keep the optimizer's state (AdamW's two moments: twice the trained weights' bytes) and a copy of the "
        "weights it steps in host memory, and step there (ZeRO-Offload's trade, verl's optimizer_offload): each "
        "optimizer step copies the gradients down and the weights up. The update is the optimizer's own and "
        "checkpoints are the plain optimizer's. For GPUs (on a CPU the state is in host memory already); one "
        "process's optimizer, not FSDP's or DeepSpeed's (their own offload settings). auto: on for full fine-tuning "
        "with adamw on one CUDA process, where the host has 5x the trained weights' bytes available."))
    keep_freed_memory: bool | Literal["auto"] = Field("auto", description=(
        "Keep host memory a step frees for the next step (glibc's malloc: blocks up to 32 MiB from its heap, none "
        "given back below 2 GiB free), not faulted in again (docs/quickstart.md). auto: for grpo train's and "
        "grpo eval's own processes on a CPU, unless MALLOC_*, GLIBC_TUNABLES or LD_PRELOAD is set; true: any "
        "device, grpo_cli.train too."))
    learning_rate: float = Field(1e-6, gt=0, description="AdamW peak learning rate.")
    scheduler: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up: constant, linear or cosine to 0.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global grad norm; None disables.")
    max_nonfinite_steps: int | None = Field(
        3, ge=1, description="An optimizer step whose loss or gradient norm is NaN or infinite on any process is "
        "skipped on every process (weights, AdamW moments and the schedule untouched), logged as "
        "nonfinite/skipped_updates and named in a warning (the loss, the largest reward, the first parameter whose "
        "gradient is not finite). This many steps in a row with a skipped update stop the run with an error (the "
        "last checkpoint intact); None: never stop. A checkpoint is never written with non-finite weights.",
    )
    chunked_lm_head: bool | Literal["auto", "keep_logits"] = Field(
        "auto", description="Llama/Qwen2/Qwen3/Mistral: run the LM head inside the log-prob chunks, the head's "
        "weight gradient added in place into one tensor (a tied embedding's rows too): true: the micro-batch's "
        "[rows, T, vocab] logits never exist, for a second head product in the backward (Qwen2.5-0.5B's head over "
        "8 x 256 tokens in bf16: 1969 -> 1119 MiB); keep_logits: the chunks' logits are kept for the backward, no "
        "second product. auto: true on CUDA, keep_logits on CPUs. The same numbers either way as each other.",
    )
    recompute_up_projection: bool | Literal["auto"] = Field(
        "auto", description="Gated SiLU MLPs (Llama, Qwen, Mistral): recompute the up projection in the backward "
        "instead of keeping its output, one product of a layer's seven for a quarter of its activations. Same numbers "
        "either way. auto: on CUDA (where a step at micro-batch shapes waits on the host, not on products), off on "
        "CPUs.",
    )
    mixed_precision: Literal["no", "auto", "bf16", "fp16"] = Field(
        "no", description="Autocast for forward passes (accelerate); weights, gradients and AdamW stay in model.dtype. "
        "auto: bf16 for float32 weights where the hardware computes bf16 natively (CUDA, CPUs with AVX512-BF16 or AMX), else no.",
    )
    seed: int = Field(0, description="Seed of sampling, shuffling and initialisation.")
    threads: int | Literal["auto"] | None = Field(
        "auto", description="torch intra-op threads (CPU), for grpo train and grpo eval. auto: the cores free when the "
        "run starts (its affinity minus what other processes keep busy), split between the run's processes; threads "
        "that outnumber the free cores wait on each other (a step can take 20x longer). None keeps torch's choice.",
    )
    stall_timeout_s: float | None = Field(
        900, gt=0, description="No silent hang: a phase of the run (generation, a reward, a collective across "
        "processes, a server request, a checkpoint write) that makes no progress for this long stops the run with an "
        "error naming the phase and the process, after writing every thread's stack of every process into "
        "RUN/stalls/; the last checkpoint stays intact. Progress: a decoded token (transformers generation), a vLLM "
        "engine step (colocated, or a server's, seen through its /health while a request runs), a synced tensor, a "
        "micro-batch, a reward call, a checkpoint's files growing and each block of them hashed. None: never.",
    )

    @model_validator(mode="after")
    def _steps(self) -> TrainConfig:
        if self.max_steps is None and self.epochs is None:
            raise ValueError("train.max_steps is not set: give the training steps, or train.epochs")
        return self

    @field_validator("threads")
    @classmethod
    def _threads(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("train.threads must be >= 1, auto, or null")
        return v

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, v: Any) -> Any:
        return "no" if v is False else v  # YAML 1.1 reads a bare `no` as false
