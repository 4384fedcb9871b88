"""`grpo convert-trl`: TRL's GRPOConfig -> a `grpo` recipe, field by field as trl_homes.HOMES says.

`convert` turns the YAML that `trl grpo --config` reads into a complete recipe: every mapped field written out,
TRL's defaults included where they change what is learned (so a converted run trains the algorithm TRL would),
batch sizes translated with the arithmetic shown, and the fields it could not map listed with the reason.
Importing this module must not import torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_cli.recipe.specs import LOSSES
from grpo_cli.errors import ConversionError
from grpo_cli.recipe.trl_batch import layout
from grpo_cli.recipe.trl_fields import GRPO_CONFIG, TRL_VERSION
from grpo_cli.recipe.trl_rollout import agents, import_path, vllm
from grpo_cli.recipe.trl_homes import HOMES, LEGACY, OPTIMIZERS, SCHEDULERS, TRL_REWARDS, accepted_fields, known_fields

VESPO_FIELDS = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")
ENTROPY_FIELDS = ("entropy_coef", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
                  "entropy_target")


@dataclass
class Conversion:
    recipe: dict[str, Any]
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)  # (field, value, why)
    notes: list[str] = field(default_factory=list)  # the batch arithmetic and other translations shown
    unknown: list[str] = field(default_factory=list)  # fields TRL 1.16 does not have


def precision_note(asked: str, dtype: str, precision: str, bf16: bool, bf16_given: bool) -> str:
    """How TRL's dtype and bf16 / fp16 became model.dtype and train.mixed_precision, in one sentence."""
    said = f"dtype {asked}"
    if asked == "auto":
        said += (f" (the checkpoint's own dtype, not read when converting: {dtype} assumed; set model.dtype if it "
                 "differs)")
    flag = f"bf16 {'true' if bf16 else 'false'}" + ("" if bf16_given else " (TRL's default)")
    if precision == "fp16":
        return f"{said}, fp16 true: {dtype} weights under float16 autocast (train.mixed_precision: fp16)"
    if precision == "bf16":
        return (f"{said}, {flag}: float32 weights, gradients and AdamW state under bfloat16 autocast "
                "(train.mixed_precision: bf16), as TRL trains; model.dtype=bfloat16 halves their memory")
    if bf16:
        return (f"{said}, {flag}: the weights are {dtype} already (model.dtype), so no autocast "
                "(train.mixed_precision: no)")
    return f"{said}, {flag}: {dtype} weights, no autocast (train.mixed_precision: no)"


def unknown_fields(config: dict[str, Any]) -> list[str]:
    """The fields of a TRL config that TRL 1.16 does not have (a typo, or another version's), each with the closest
    field it may have meant: `  max_step: not a field of ... (did you mean 'max_steps'?)`."""
    from grpo_cli.recipe.trl_fields import TRL_VERSION
    from grpo_cli.registry import did_you_mean

    known = accepted_fields()
    return [f"  {k}: not a field of TRL {TRL_VERSION}'s GRPOConfig or `trl grpo` arguments{did_you_mean(k, known)}"
            for k in sorted(config) if k not in known and k != "warmup_ratio"]


def convert(config: dict[str, Any], *, num_processes: int = 1, name: str | None = None,
            owns_reward: Callable[[str], bool] | None = None) -> Conversion:
    """A `trl grpo --config` YAML (as a dict) -> the recipe, its notes and what could not be mapped.
    `owns_reward(path)`: whether an environment_factory class has get_reward (assumed when not given)."""
    renamed = []
    if "warmup_ratio" in config:  # transformers < 5 (most TRL configs before it); TRL 1.16: a fraction in warmup_steps
        config = dict(config)
        ratio = config.pop("warmup_ratio")
        if config.get("warmup_steps"):
            renamed.append(f"warmup_ratio {ratio} is left out: warmup_steps {config['warmup_steps']} is given too "
                           "(transformers uses warmup_steps then)")
        elif ratio:
            config["warmup_steps"] = float(ratio)
            renamed.append(f"warmup_ratio {ratio} is older transformers' name of a fractional warmup_steps")
    unknown = sorted(k for k in config if k not in accepted_fields())
    renamed += [f"{old} is older TRL's name of {LEGACY[old]}" for old in config if old in LEGACY]
    sections = Sections(config, Conversion(recipe={}, unknown=unknown, notes=renamed), owns_reward)
    cfg, r = sections.cfg, sections.out.recipe
    if not cfg.get("model_name_or_path"):
        raise ConversionError("model_name_or_path is missing: the recipe needs a model")
    if not cfg.get("dataset_name") and not cfg.get("environment_factory"):
        raise ConversionError("dataset_name is missing: the recipe needs training data (or an environment_factory "
                              "whose reset() writes the prompts)")
    # a recipe name is [A-Za-z0-9._-]+: a run name or a model path may hold anything else
    r["name"] = name or re.sub(r"[^A-Za-z0-9._-]+", "-", str(cfg.get("run_name") or (
        str(cfg["model_name_or_path"]).rstrip("/").split("/")[-1] + "-grpo"))).strip("-") or "grpo"
    sections.take("run_name")
    sections.model()
    sections.data()
    column_note = sections.rewards()
    prompts = sections.algorithm(num_processes)
    sections.rollout()
    sections.train(prompts)
    sections.logging()
    return sections.finish(column_note)


class Sections:
    """The recipe's sections from a TRL config, one method each; every TRL field a section reads is `take`n, and one
    it cannot map is `unmapped` with the reason."""

    def __init__(self, config: dict[str, Any], out: Conversion,
                 owns_reward: Callable[[str], bool] | None = None) -> None:
        self.owns_reward = owns_reward
        self.config = config = {LEGACY.get(k, k): v for k, v in config.items()}
        self.given = {k: v for k, v in config.items() if k in known_fields()}
        self.cfg = {**GRPO_CONFIG, **self.given}  # TRL's defaults where the file is silent: TRL's algorithm
        self.out, self.handled = out, set()
        self.bf16 = self.dtype = self.asked = None  # the model's, read by train's precision
        self.per_device = 1  # completions per forward, from the batch arithmetic

    def take(self, *keys: str) -> None:
        self.handled.update(keys)

    def unmapped(self, key: str, why: str | None = None) -> None:
        self.handled.add(key)
        if key in self.given and self.given[key] != GRPO_CONFIG.get(key, None):
            self.out.unmapped.append((key, self.given[key], why or HOMES[key][1]))

    def model(self) -> None:
        cfg, r = self.cfg, self.out.recipe
        # TRL 1.16: bf16 unless fp16
        self.bf16 = bf16 = cfg.get("bf16") if cfg.get("bf16") is not None else not cfg.get("fp16")
        init = dict(cfg.get("model_init_kwargs") or {})
        # TRL 1.16 loads the model in float32 unless told otherwise (ModelConfig.dtype; `trl grpo` passes it on)
        asked = init.pop("dtype", None) or init.pop("torch_dtype", None) or cfg.get("dtype")
        self.asked = asked = asked or "float32 (TRL's default)"
        self.dtype = dtype = {"auto": "bfloat16" if bf16 else "float32", "bf16": "bfloat16", "fp16": "float16",
                              "float32 (TRL's default)": "float32"}.get(asked, asked)
        model: dict[str, Any] = {"name_or_path": cfg["model_name_or_path"], "dtype": dtype,
                                 "trust_remote_code": bool(init.pop("trust_remote_code", cfg.get("trust_remote_code"))),
                                 "gradient_checkpointing": bool(cfg.get("gradient_checkpointing"))}
        for key, ours in (("model_revision", "revision"), ("attn_implementation", "attn_implementation")):
            value = init.pop(ours, None) or cfg.get(key)
            if value is not None:
                model[ours] = value
        if init:
            model["init_kwargs"] = init
        if cfg.get("use_peft"):
            lora = {"r": cfg.get("lora_r") or 16, "alpha": float(cfg.get("lora_alpha") or 32),
                    "dropout": float(cfg.get("lora_dropout") or 0.0),
                    "target_modules": cfg.get("lora_target_modules") or "all-linear",
                    "use_rslora": bool(cfg.get("use_rslora"))}
            if cfg.get("lora_modules_to_save"):
                lora["modules_to_save"] = cfg["lora_modules_to_save"]
            model["lora"] = lora
        if cfg.get("load_in_4bit"):
            model["load_in_4bit"] = True
        r["model"] = model
        self.take("model_name_or_path", "model_revision", "dtype", "attn_implementation", "trust_remote_code",
                  "gradient_checkpointing", "model_init_kwargs", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
                  "lora_target_modules", "lora_modules_to_save", "use_rslora", "load_in_4bit")

    def data(self) -> None:
        cfg, r, config = self.cfg, self.out.recipe, self.config
        data: dict[str, Any] = {"dataset": cfg.get("dataset_name"), "split": cfg.get("dataset_train_split") or "train",
                                "prompt_column": "prompt", "chat_template": True,
                                "shuffle": bool(cfg.get("shuffle_dataset", True))
                                and cfg.get("train_sampling_strategy", "random") != "sequential"}
        if not cfg.get("dataset_name"):  # the environment owns the data: blank rows, reset() writes each prompt
            data = {"generator": "blank", "chat_template": True}
        elif isinstance(cfg.get("environment_factory"), dict):
            self.out.notes.append("environment_factory is a mapping: rows route by their `environment` column "
                                  "(rollout.environment_column); a dataset with no prompt column needs "
                                  "data.prompt_column: null")
        if cfg.get("dataset_config"):
            data["config"] = cfg["dataset_config"]
        if cfg.get("chat_template_kwargs"):
            data["chat_template_kwargs"] = cfg["chat_template_kwargs"]
        if cfg.get("data_seed") is not None:
            data["seed"] = cfg["data_seed"]
        if cfg.get("dataset_streaming"):
            data["streaming"] = True
        if config.get("max_prompt_length") is not None:  # TRL < 1.0 truncated prompts to it (from the left)
            data["max_prompt_length"] = int(config["max_prompt_length"])
        r["data"] = data
        self.take("dataset_name", "dataset_config", "dataset_train_split", "shuffle_dataset", "train_sampling_strategy",
                  "chat_template_kwargs", "data_seed", "dataset_streaming")

    def rewards(self) -> str | None:
        """-> the note on the answer column TRL's accuracy rewards read, if they do."""
        cfg, r, data = self.cfg, self.out.recipe, self.out.recipe["data"]
        rewards = []
        for fn in cfg.get("reward_funcs") or []:
            ours, kwargs = TRL_REWARDS.get(fn, (fn, {}))
            if ours == fn:  # my_module.my_reward -> my_module:my_reward
                ours = import_path(fn)
            rewards.append({"name": ours, **({"kwargs": kwargs} if kwargs else {})})
        if cfg.get("reward_model_name_or_path"):
            rewards.append({"name": f"model:{cfg['reward_model_name_or_path']}"})
        owned = self.environment_reward()
        if not rewards and not owned:
            raise ConversionError("reward_funcs (or reward_model_name_or_path) is missing: the recipe needs a reward "
                                  "(or an environment_factory whose class has get_reward)")
        reads_solution = [fn for fn in cfg.get("reward_funcs") or []
                          if fn in ("accuracy_reward", "reasoning_accuracy_reward")]
        if reads_solution:  # TRL's accuracy rewards read the dataset column `solution`
            data["answer_column"] = "solution"
        column_note = (f"{reads_solution[0]} reads the dataset column `solution` (TRL's): data.answer_column: solution"
                       if reads_solution else None)
        weights = cfg.get("reward_weights")
        if weights:
            if len(weights) != len(rewards):
                raise ConversionError(f"reward_weights has {len(weights)} values for {len(rewards)} rewards")
            for rw, w in zip(rewards, weights):
                rw["weight"] = float(w)
        if owned:  # TRL adds get_reward as one more reward, weight 1, after reward_funcs
            rewards.append({"name": "environment", "weight": 1.0})
        r["rewards"] = rewards
        self.take("reward_funcs", "reward_model_name_or_path", "reward_weights")
        return column_note

    def environment_reward(self) -> bool:
        """Whether environment_factory's class (any of them) has get_reward, which TRL adds as a reward; told by
        `owns_reward` (the command resolves the class), assumed without it."""
        factory = self.cfg.get("environment_factory")
        if not factory:
            return False
        named = factory if isinstance(factory, dict) else {None: factory}
        return self.owns_reward is None or any(self.owns_reward(import_path(p)) for p in named.values())

    def algorithm(self, num_processes: int) -> int:
        """The batch arithmetic (TRL counts completions, grpo prompts) and the algorithm; -> prompts per step."""
        cfg, r = self.cfg, self.out.recipe
        self.layout = layout(cfg, num_processes)
        self.out.notes.append(self.layout.note)
        per_device, prompts, G = self.layout.micro_batch_size, self.layout.prompts_per_step, int(cfg["num_generations"])
        algorithm = {"num_generations": G, "beta": cfg["beta"], "epsilon": cfg["epsilon"],
                     "epsilon_high": cfg["epsilon_high"], "delta": cfg["delta"], "loss_type": cfg["loss_type"],
                     "scale_rewards": {True: "group", False: "none"}.get(cfg["scale_rewards"], cfg["scale_rewards"]),
                     "num_iterations": cfg["num_iterations"],
                     "importance_sampling_level": cfg["importance_sampling_level"],
                     "mask_truncated_completions": cfg["mask_truncated_completions"],
                     "top_entropy_quantile": cfg["top_entropy_quantile"],
                     "use_bias_correction_kl": cfg["use_bias_correction_kl"],
                     "off_policy_mask_threshold": cfg["off_policy_mask_threshold"],
                     "multi_objective_aggregation": cfg["multi_objective_aggregation"],
                     "sync_ref_model": cfg["sync_ref_model"], "ref_model_mixup_alpha": cfg["ref_model_mixup_alpha"],
                     "ref_model_sync_steps": cfg["ref_model_sync_steps"],
                     "sapo_temperature_pos": cfg["sapo_temperature_pos"],
                     "sapo_temperature_neg": cfg["sapo_temperature_neg"],
                     **{k: cfg[k] for k in VESPO_FIELDS + ENTROPY_FIELDS}}
        loss = LOSSES.get(algorithm["loss_type"])
        if loss is not None and loss.level is not None and algorithm["importance_sampling_level"] != loss.level:
            self.out.notes.append(
                f"loss_type {loss.name} with importance_sampling_level {algorithm['importance_sampling_level']}: "
                f"{loss.level_reason} -> algorithm.importance_sampling_level: {loss.level}")
            algorithm["importance_sampling_level"] = loss.level
        r["algorithm"] = algorithm
        self.take("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                  "steps_per_generation", "generation_batch_size", "beta", "epsilon", "epsilon_high", "delta",
                  "loss_type", "scale_rewards", "num_iterations", "importance_sampling_level",
                  "mask_truncated_completions", "top_entropy_quantile", "use_bias_correction_kl",
                  "off_policy_mask_threshold", "multi_objective_aggregation", "sync_ref_model", "ref_model_mixup_alpha",
                  "ref_model_sync_steps", "sapo_temperature_pos", "sapo_temperature_neg", *VESPO_FIELDS,
                  *ENTROPY_FIELDS)
        self.per_device = per_device
        return prompts

    def rollout(self) -> None:
        cfg, r = self.cfg, self.out.recipe
        rollout: dict[str, Any] = {
            "backend": "vllm" if cfg["use_vllm"] else "hf", "max_completion_length": cfg["max_completion_length"],
            "temperature": cfg["temperature"], "top_p": cfg["top_p"], "top_k": cfg["top_k"] or None,
            "min_p": cfg["min_p"], "repetition_penalty": cfg["repetition_penalty"],
        }
        if cfg.get("generation_kwargs"):
            rollout["generation_kwargs"] = cfg["generation_kwargs"]
        if cfg.get("cache_implementation"):
            rollout["cache_implementation"] = cfg["cache_implementation"]
        rollout |= agents(cfg)
        if "history_change" in rollout:
            self.out.notes.append("rollout.history_change: keep, as TRL (each turn continues the tokens so far); where "
                                  "a chat template drops earlier <think> blocks, `split` samples what a deployed model "
                                  "sees (docs/agents.md)")
        if cfg["use_vllm"]:
            rollout |= vllm(cfg, self.out.notes)
        elif cfg.get("vllm_structured_outputs_regex"):
            self.unmapped("vllm_structured_outputs_regex", "structured outputs need use_vllm")
        r["rollout"] = rollout
        self.take("use_vllm", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "generation_kwargs", "cache_implementation", "max_tool_calling_iterations", "environment_factory",
                  "tools", "vllm_mode",
                  "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
                  "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_structured_outputs_regex",
                  "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                  "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
                  "vllm_importance_sampling_clip_min", "vllm_tensor_parallel_size")

    def train(self, prompts: int) -> None:
        cfg, r, per_device = self.cfg, self.out.recipe, self.per_device
        bf16, dtype, asked, given = self.bf16, self.dtype, self.asked, self.given
        trl_steps = int(cfg["max_steps"])
        max_steps = self.layout.steps(trl_steps) if trl_steps > 0 else None  # TRL: -1, num_train_epochs counts
        warmup = cfg.get("warmup_steps") or 0  # optimizer steps on both sides
        if isinstance(warmup, float) and 0 < warmup < 1:
            if max_steps is None:
                raise ConversionError(f"warmup_steps {warmup} is a ratio of the steps, which num_train_epochs leaves "
                                      "unknown until the data is read: give max_steps, or warmup_steps as a count")
            warmup = round(warmup * trl_steps)
            self.out.notes.append(f"warmup_steps {cfg['warmup_steps']} is a ratio: {warmup} of {max_steps} steps")
        scheduler = SCHEDULERS.get(cfg["lr_scheduler_type"])
        if scheduler is None:
            self.unmapped("lr_scheduler_type",
                          f"{cfg['lr_scheduler_type']} is not one of constant / linear / cosine: linear used")
            scheduler = "linear"
        optimizer = OPTIMIZERS.get(cfg["optim"])
        if optimizer is None:
            self.unmapped("optim", f"{cfg['optim']} has no counterpart: adamw used")
            optimizer = "adamw"
        precision = "fp16" if cfg.get("fp16") else ("bf16" if bf16 and dtype == "float32" else "no")
        self.out.notes.append(precision_note(asked, dtype, precision, bf16, "bf16" in given))
        if max_steps is None:
            self.out.notes.append(f"max_steps is not set: num_train_epochs {cfg['num_train_epochs']} -> train.epochs "
                                  "(the steps counted from the data's rows when the run starts)")
        steps = {"max_steps": max_steps} if max_steps is not None else {"epochs": float(cfg["num_train_epochs"])}
        r["train"] = {**steps, "prompts_per_step": prompts, "micro_batch_size": per_device,
                      **({"mini_batches": self.layout.mini_batches} if self.layout.mini_batches > 1 else {}),
                      "optimizer": optimizer, "learning_rate": cfg["learning_rate"], "scheduler": scheduler,
                      "warmup_steps": int(warmup), "weight_decay": cfg["weight_decay"], "adam_beta1": cfg["adam_beta1"],
                      "adam_beta2": cfg["adam_beta2"], "max_grad_norm": cfg["max_grad_norm"],
                      "mixed_precision": precision, "seed": cfg["seed"]}
        self.take("max_steps", "num_train_epochs", "warmup_steps", "lr_scheduler_type", "optim", "fp16", "bf16",
                  "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm", "seed", "use_cpu")

    def logging(self) -> None:
        """Checkpoints, logging, eval."""
        cfg, r = self.cfg, self.out.recipe
        every = 0 if cfg["save_strategy"] == "no" else self.layout.steps(int(cfg["save_steps"]))
        if cfg["save_strategy"] == "epoch":
            self.unmapped("save_strategy", "epoch is not supported: checkpoints every save_steps")
        r["checkpoint"] = {"every_steps": every, "keep_last": cfg["save_total_limit"]}
        report = cfg["report_to"]
        report = [] if report in (None, "none", ["none"]) else ([report] if isinstance(report, str) else list(report))
        trackers = [t for t in report
                    if t in ("tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "aim", "clearml")]
        for t in report:
            if t not in trackers and t != "all":
                self.out.unmapped.append(("report_to", t, "not one of accelerate's trackers"))
        prints = cfg["num_completions_to_print"] or (4 if cfg["log_completions"] else 0)
        r["logging"] = {"output_dir": cfg["output_dir"] or f"runs/{r['name']}",
                        "every_steps": int(cfg["logging_steps"]), "trackers": trackers,
                        "num_completions_to_print": int(prints)}
        self.take("save_strategy", "save_steps", "save_total_limit", "report_to", "output_dir", "logging_steps",
                  "log_completions", "num_completions_to_print")
        if cfg["eval_strategy"] != "no" or cfg.get("dataset_test_split"):
            steps = cfg.get("eval_steps") or cfg["logging_steps"]
            r["eval"] = {"every_steps": int(steps) if cfg["eval_strategy"] == "steps" else 0,
                         "split": cfg.get("dataset_test_split") or "test",
                         "batch_size": int(cfg["per_device_eval_batch_size"])}
        self.take("eval_strategy", "eval_steps", "dataset_test_split", "per_device_eval_batch_size")

    def finish(self, column_note: str | None) -> Conversion:
        """Every field given and not read is unmapped; the notes on TRL's defaults and the answer column."""
        cfg, given = self.cfg, self.given
        for key in given:
            if key not in self.handled:
                self.unmapped(key)
        silent = [f"{k} {cfg[k]}" for k in ("beta", "loss_type", "use_bias_correction_kl", "learning_rate",
                                            "adam_beta2", "max_grad_norm", "max_completion_length",
                                            "lr_scheduler_type") if k not in given]
        if silent:  # only what the file does not say: the user's own values are theirs, not TRL's defaults
            self.out.notes.append(f"TRL {TRL_VERSION}'s defaults are written out where the file is silent "
                                  f"({', '.join(silent)})")
        if column_note:
            self.out.notes.append(column_note)
        return self.out
