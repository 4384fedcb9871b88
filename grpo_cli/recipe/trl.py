"""TRL's GRPOConfig -> a `grpo` recipe: every field's home here (the README table), and `grpo convert-trl`.

`HOMES` gives each field of TRL 1.16's GRPOConfig (trl_fields.GRPO_CONFIG, TrainingArguments' included) and of the
`trl grpo` script's model and dataset arguments its recipe key, or why it has none. `convert` turns the YAML that
`trl grpo --config` reads into a complete recipe: every mapped field written out, TRL's defaults included where they
change what is learned (so a converted run trains the algorithm TRL would), batch sizes translated with the
arithmetic shown, and the fields it could not map listed with the reason. Importing this module must not import
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_cli.recipe.trl_fields import GRPO_CONFIG, MODEL_ARGS, SCRIPT_ARGS, TRL_VERSION
from grpo_cli.errors import ConversionError

# ---------------------------------------------------------------- where each field lives

_SAME = "same meaning"
# field -> (recipe key or None, how it maps / why it has no home)
HOMES: dict[str, tuple[str | None, str]] = {
    # the model (GRPOConfig, then ModelConfig)
    "model_init_kwargs": ("model.init_kwargs", "dtype / attn_implementation / revision / trust_remote_code go to their own keys"),
    "trust_remote_code": ("model.trust_remote_code", _SAME),
    "model_name_or_path": ("model.name_or_path", _SAME),
    "model_revision": ("model.revision", _SAME),
    "dtype": ("model.dtype", "auto (TRL's default: the checkpoint's dtype) becomes bfloat16 with bf16, else float32"),
    "attn_implementation": ("model.attn_implementation", _SAME),
    "use_peft": ("model.lora.r", "false: r = 0 (full fine-tuning); true: r = lora_r"),
    "lora_r": ("model.lora.r", "when use_peft"),
    "lora_alpha": ("model.lora.alpha", _SAME),
    "lora_dropout": ("model.lora.dropout", _SAME),
    "lora_target_modules": ("model.lora.target_modules", "None (peft's per-architecture default) becomes all-linear"),
    "lora_modules_to_save": ("model.lora.modules_to_save", _SAME),
    "use_rslora": ("model.lora.use_rslora", _SAME),
    "load_in_4bit": ("model.load_in_4bit", "NF4 with double quantization, compute in model.dtype"),
    "lora_target_parameters": (None, "LoRA on parameters (MoE experts) is not supported"),
    "lora_task_type": (None, "always a causal LM"),
    "use_dora": (None, "DoRA is not supported"),
    "load_in_8bit": (None, "8-bit bases are not supported; load_in_4bit (QLoRA) is"),
    "bnb_4bit_quant_type": (None, "always nf4"),
    "use_bnb_nested_quant": (None, "always on (double quantization)"),
    "bnb_4bit_quant_storage": (None, "bitsandbytes' default storage"),
    "router_aux_loss_coef": (None, "MoE router losses are not added"),
    "disable_dropout": (None, "dropout is always off in the policy (ratios would be noisy); no setting"),
    "cast_lm_head_to_fp32": (None, "log-probs are always computed in fp32 from the logits (logprobs.py)"),
    "gradient_checkpointing": ("model.gradient_checkpointing", "TRL's default is true, ours false (faster)"),
    "gradient_checkpointing_kwargs": (None, "non-reentrant checkpointing, always"),
    # data
    "dataset_name": ("data.dataset", _SAME),
    "dataset_config": ("data.config", _SAME),
    "dataset_train_split": ("data.split", _SAME),
    "dataset_test_split": ("eval.split", "an eval section is written"),
    "dataset_streaming": (None, "datasets are loaded in full"),
    "ignore_bias_buffers": (None, "a DDP workaround grpo does not need"),
    "shuffle_dataset": ("data.shuffle", _SAME),
    "chat_template_kwargs": ("data.chat_template_kwargs", _SAME),
    "remove_unused_columns": (None, "every column always reaches the rewards (TRL's GRPO default, false, is the behaviour)"),
    "data_seed": ("data.seed", _SAME),
    "seed": ("train.seed", _SAME),
    # rewards
    "reward_funcs": ("rewards", "TRL's built-in names become ours (accuracy_reward -> accuracy, think_format_reward -> "
                     "format); module paths stay"),
    "reward_model_name_or_path": ("rewards", "a `model:` reward"),
    "reward_weights": ("rewards[].weight", "one per reward, in order"),
    "multi_objective_aggregation": ("algorithm.multi_objective_aggregation", _SAME),
    # batch and schedule
    "num_generations": ("algorithm.num_generations", _SAME),
    "num_generations_eval": (None, "grpo eval samples with eval.num_samples"),
    "per_device_train_batch_size": ("train.micro_batch_size", "completions per forward; with the accumulation steps and "
                                    "processes it makes train.prompts_per_step (see the printed arithmetic)"),
    "gradient_accumulation_steps": ("train.prompts_per_step", "folded into prompts_per_step"),
    "steps_per_generation": ("train.prompts_per_step", "must equal gradient_accumulation_steps: one generation batch per "
                             "optimizer step (several optimizer steps on slices of one batch are not supported)"),
    "generation_batch_size": ("train.prompts_per_step", "must equal the optimizer step's completions (as above)"),
    "max_steps": ("train.max_steps", "TRL's optimizer steps = grpo's steps when one generation batch is one step"),
    "num_train_epochs": (None, "give max_steps: the step count is not derived from the dataset size"),
    "learning_rate": ("train.learning_rate", _SAME),
    "lr_scheduler_type": ("train.scheduler", "constant / linear / cosine (constant_with_warmup -> constant)"),
    "lr_scheduler_kwargs": (None, "the three schedules take no options"),
    "warmup_steps": ("train.warmup_steps", "a fraction < 1 is a ratio of max_steps (TRL's convention)"),
    "optim": ("train.optimizer", "adamw_torch(_fused) -> adamw, adafactor -> adafactor, adamw_bnb_8bit / adamw_8bit -> "
              "adamw_8bit, paged_adamw_8bit -> paged_adamw_8bit"),
    "optim_args": (None, "optimizer options are train.* keys"),
    "optim_target_modules": (None, "GaLore-style targets are not supported"),
    "weight_decay": ("train.weight_decay", _SAME),
    "adam_beta1": ("train.adam_beta1", _SAME),
    "adam_beta2": ("train.adam_beta2", "TRL's default 0.999 is written out (ours is 0.99)"),
    "adam_epsilon": (None, "fixed at 1e-8 (TRL's default)"),
    "max_grad_norm": ("train.max_grad_norm", _SAME),
    "average_tokens_across_devices": (None, "dapo / cispo always normalise by the global token count"),
    "label_smoothing_factor": (None, "not a GRPO setting"),
    "bf16": ("train.mixed_precision", "true -> bf16 autocast (and bfloat16 for dtype auto)"),
    "fp16": ("train.mixed_precision", "true -> fp16"),
    "bf16_full_eval": (None, "evaluation runs in the training dtype"),
    "fp16_full_eval": (None, "evaluation runs in the training dtype"),
    "tf32": (None, "torch's matmul precision setting; set it in your environment"),
    "torch_compile": (None, "not supported"),
    "torch_compile_backend": (None, "not supported"),
    "torch_compile_mode": (None, "not supported"),
    "use_liger_kernel": (None, "log-probs are already chunked and recomputed in backward (logprobs.py): no [B, T, V] "
                         "fp32 tensor exists, the memory Liger's fused loss saves"),
    "liger_kernel_config": (None, "see use_liger_kernel"),
    "use_cache": (None, "generation always uses the KV cache; training forwards never do"),
    "neftune_noise_alpha": (None, "not a GRPO setting"),
    "torch_empty_cache_steps": (None, "the allocator is left alone"),
    "auto_find_batch_size": (None, "set train.micro_batch_size"),
    "use_cpu": (None, "accelerate's choice: CUDA when present; ACCELERATE_USE_CPU=1 forces the CPU"),
    "accelerator_config": (None, "use `grpo train --config accelerate.yaml`"),
    "parallelism_config": (None, "use an accelerate config (DDP / FSDP / DeepSpeed)"),
    "fsdp": (None, "use an accelerate config (recipes/accelerate/)"),
    "fsdp_config": (None, "use an accelerate config (recipes/accelerate/)"),
    "deepspeed": (None, "use an accelerate config (recipes/accelerate/)"),
    "ds3_gather_for_generation": (None, "ZeRO-3 always gathers for generation"),
    "ddp_find_unused_parameters": (None, "accelerate's default"),
    "ddp_bucket_cap_mb": (None, "accelerate's default"),
    "ddp_broadcast_buffers": (None, "accelerate's default"),
    "ddp_static_graph": (None, "accelerate's default"),
    "ddp_backend": (None, "accelerate's choice (nccl on GPUs, gloo on CPUs)"),
    "ddp_timeout": (None, "accelerate's default"),
    "local_rank": (None, "set by the launcher"),
    "debug": (None, "no debug modes"),
    "full_determinism": (None, "runs are deterministic and resumable by default"),
    "pad_to_multiple_of": (None, "batches are padded to their longest row"),
    # generation
    "max_completion_length": ("rollout.max_completion_length", "TRL's default 512 is written out (ours is 256)"),
    "temperature": ("rollout.temperature", _SAME),
    "top_p": ("rollout.top_p", _SAME),
    "top_k": ("rollout.top_k", "0 (off) -> null"),
    "min_p": ("rollout.min_p", _SAME),
    "repetition_penalty": ("rollout.repetition_penalty", _SAME),
    "generation_kwargs": ("rollout.generation_kwargs", _SAME),
    "cache_implementation": ("rollout.cache_implementation", _SAME),
    "use_transformers_paged": (None, "transformers' continuous batching (generate_batch) took 23-33 s for 2 x 8 tokens of "
                               "the tiny model on the CI CPU (generate: 0.05 s); vLLM is the continuous-batching backend"),
    "use_transformers_continuous_batching": (None, "as use_transformers_paged"),
    "transformers_continuous_batching_config": (None, "as use_transformers_paged"),
    "max_tool_calling_iterations": ("rollout.max_turns", "iterations + 1 assistant turns (tools: rollout.tools)"),
    "use_vllm": ("rollout.backend", "true -> vllm"),
    "vllm_mode": ("rollout.vllm.mode", _SAME),
    "vllm_model_impl": (None, "vLLM's own implementation"),
    "vllm_enable_sleep_mode": (None, "a colocated engine always sleeps during the update on GPUs"),
    "vllm_structured_outputs_regex": ("rollout.vllm.structured_outputs_regex", _SAME),
    "vllm_server_base_url": ("rollout.vllm.server_url", _SAME),
    "vllm_server_host": ("rollout.vllm.server_url", "http://HOST:PORT"),
    "vllm_server_port": ("rollout.vllm.server_url", "http://HOST:PORT"),
    "vllm_server_timeout": ("rollout.vllm.request_timeout_s", "grpo's is per request"),
    "vllm_group_port": (None, "weights travel over HTTP (a file or its bytes), no NCCL group"),
    "vllm_gpu_memory_utilization": ("rollout.vllm.gpu_memory_utilization", _SAME),
    "vllm_max_model_length": ("rollout.vllm.max_model_len", _SAME),
    "vllm_tensor_parallel_size": (None, "colocate: one GPU per process; server: `grpo serve-vllm --tp N`"),
    "vllm_importance_sampling_correction": ("rollout.importance_sampling", "false -> none"),
    "vllm_importance_sampling_mode": ("rollout.importance_sampling", _SAME),
    "vllm_importance_sampling_cap": ("rollout.importance_sampling_cap", _SAME),
    "vllm_importance_sampling_clip_max": ("rollout.importance_sampling_cap", "TRL's older name of the cap"),
    "vllm_importance_sampling_clip_min": (None, "no lower clip"),
    # the algorithm
    "beta": ("algorithm.beta", _SAME),
    "num_iterations": ("algorithm.num_iterations", _SAME),
    "epsilon": ("algorithm.epsilon", _SAME),
    "epsilon_high": ("algorithm.epsilon_high", _SAME),
    "delta": ("algorithm.delta", _SAME),
    "sapo_temperature_neg": ("algorithm.sapo_temperature_neg", _SAME),
    "sapo_temperature_pos": ("algorithm.sapo_temperature_pos", _SAME),
    "vespo_k_pos": (None, "loss_type vespo is not implemented"),
    "vespo_lambda_pos": (None, "loss_type vespo is not implemented"),
    "vespo_k_neg": (None, "loss_type vespo is not implemented"),
    "vespo_lambda_neg": (None, "loss_type vespo is not implemented"),
    "importance_sampling_level": ("algorithm.importance_sampling_level", _SAME),
    "scale_rewards": ("algorithm.scale_rewards", "true -> group, false -> none"),
    "loss_type": ("algorithm.loss_type", "grpo / bnpo / dr_grpo / dapo / cispo / sapo"),
    "mask_truncated_completions": ("algorithm.mask_truncated_completions", _SAME),
    "sync_ref_model": ("algorithm.sync_ref_model", _SAME),
    "ref_model_mixup_alpha": ("algorithm.ref_model_mixup_alpha", _SAME),
    "ref_model_sync_steps": ("algorithm.ref_model_sync_steps", _SAME),
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", _SAME),
    "entropy_coef": (None, "no entropy bonus (0 = TRL's default is the behaviour)"),
    "use_adaptive_entropy": (None, "no entropy bonus"),
    "entropy_coef_min": (None, "no entropy bonus"),
    "entropy_coef_max": (None, "no entropy bonus"),
    "entropy_coef_delta": (None, "no entropy bonus"),
    "entropy_target": (None, "no entropy bonus"),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask_threshold", _SAME),
    "use_bias_correction_kl": ("algorithm.use_bias_correction_kl", "TRL's default true is written out (ours false)"),
    # logging, saving, evaluation
    "output_dir": ("logging.output_dir", _SAME),
    "run_name": ("name", _SAME),
    "logging_steps": ("logging.every_steps", "metrics.jsonl gets every step regardless"),
    "logging_strategy": (None, "steps, always"),
    "logging_first_step": (None, "every step is in metrics.jsonl"),
    "logging_nan_inf_filter": (None, "NaN metrics are left out of the console line"),
    "log_on_each_node": (None, "the main process logs"),
    "log_level": (None, "GRPO_VERBOSE=1 shows library logs"),
    "log_level_replica": (None, "the main process logs"),
    "log_completions": ("logging.num_completions_to_print", "true without num_completions_to_print -> 4"),
    "num_completions_to_print": ("logging.num_completions_to_print", _SAME),
    "log_multimodal": (None, "text models only"),
    "log_unique_prompts": (None, "rollouts.jsonl holds every prompt; grpo inspect-rollouts --prompt follows one"),
    "log_completions_hub_repo": (None, "no hub upload; rollouts.jsonl is in the run folder"),
    "report_to": ("logging.trackers", "none -> []"),
    "project": (None, "set by your tracker's own settings"),
    "trackio_space_id": (None, "trackio is not one of accelerate's trackers"),
    "trackio_bucket_id": (None, "trackio is not one of accelerate's trackers"),
    "trackio_static_space_id": (None, "trackio is not one of accelerate's trackers"),
    "include_num_input_tokens_seen": (None, "throughput/gen_tokens_per_s is logged"),
    "disable_tqdm": (None, "the progress bar shows on a terminal only"),
    "skip_memory_metrics": (None, "memory/peak_gib is always logged"),
    "save_strategy": ("checkpoint.every_steps", "no -> 0 (only at the end); epoch is not supported"),
    "save_steps": ("checkpoint.every_steps", _SAME),
    "save_total_limit": ("checkpoint.keep_last", _SAME),
    "save_only_model": (None, "checkpoints always hold the trainer state: resume is exact"),
    "save_on_each_node": (None, "the main process writes (each node's caches are its own)"),
    "enable_jit_checkpoint": (None, "SIGTERM / SIGINT save a checkpoint after the current step"),
    "resume_from_checkpoint": (None, "`grpo train --resume auto` (or a checkpoint path)"),
    "ignore_data_skip": (None, "the data position is restored exactly"),
    "restore_callback_states_from_checkpoint": (None, "no callbacks"),
    "load_best_model_at_end": (None, "every checkpoint is a model folder; pick one with grpo eval"),
    "metric_for_best_model": (None, "see load_best_model_at_end"),
    "greater_is_better": (None, "see load_best_model_at_end"),
    "push_to_hub": (None, "no hub upload: checkpoints are model folders (`hf upload` them)"),
    "hub_token": (None, "no hub upload"),
    "hub_private_repo": (None, "no hub upload"),
    "hub_model_id": (None, "no hub upload"),
    "hub_strategy": (None, "no hub upload"),
    "hub_always_push": (None, "no hub upload"),
    "hub_revision": (None, "no hub upload"),
    "eval_strategy": ("eval.every_steps", "no -> no eval section; steps -> eval_steps"),
    "eval_steps": ("eval.every_steps", _SAME),
    "eval_delay": (None, "eval.every_steps only"),
    "eval_on_start": (None, "grpo eval base checks the start"),
    "per_device_eval_batch_size": ("eval.batch_size", _SAME),
    "prediction_loss_only": (None, "eval measures accuracy and rewards, not a loss"),
    "eval_do_concat_batches": (None, "not a GRPO setting"),
    "eval_use_gather_object": (None, "not a GRPO setting"),
    "eval_accumulation_steps": (None, "not a GRPO setting"),
    "include_for_metrics": (None, "not a GRPO setting"),
    "batch_eval_metrics": (None, "not a GRPO setting"),
    "do_train": (None, "`grpo train` trains"),
    "do_eval": (None, "`grpo eval`"),
    "do_predict": (None, "`grpo eval`"),
    # the data loader
    "dataloader_drop_last": (None, "batches run across epochs"),
    "dataloader_num_workers": (None, "prompts are rendered in the trainer"),
    "dataloader_pin_memory": (None, "prompts are rendered in the trainer"),
    "dataloader_persistent_workers": (None, "prompts are rendered in the trainer"),
    "dataloader_prefetch_factor": (None, "prompts are rendered in the trainer"),
    "dataloader_multiprocessing_context": (None, "prompts are rendered in the trainer"),
    "dataloader_in_order": (None, "prompts are rendered in the trainer"),
    "train_sampling_strategy": ("data.shuffle", "random -> true, sequential -> false"),
    "label_names": (None, "not a GRPO setting"),
    "length_column_name": (None, "not a GRPO setting"),
}

# TRL reward function names -> ours (name, kwargs)
TRL_REWARDS = {
    "accuracy_reward": ("accuracy", {}),
    "think_format_reward": ("format", {"pattern": r"^<think>(?!.*<think>).*?</think>.*$"}),
    "reasoning_accuracy_reward": ("accuracy", {}),
}
# names older TRL versions used -> TRL 1.16's (max_prompt_length: TRL < 1.0's prompt truncation, data.max_prompt_length)
LEGACY = {"use_liger_loss": "use_liger_kernel", "wandb_log_unique_prompts": "log_unique_prompts",
          "vllm_guided_decoding_regex": "vllm_structured_outputs_regex", "torch_dtype": "dtype",
          "evaluation_strategy": "eval_strategy"}
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adafactor": "adafactor",
              "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "paged_adamw_8bit"}
SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}


def known_fields() -> set[str]:
    return set(GRPO_CONFIG) | set(MODEL_ARGS) | set(SCRIPT_ARGS)


def accepted_fields() -> set[str]:
    """What convert-trl reads: TRL 1.16's fields, the older names in LEGACY, and max_prompt_length."""
    return known_fields() | set(LEGACY) | {"max_prompt_length"}


def trl_table() -> str:
    """The README's table: every field of TRL 1.16's GRPOConfig and `trl grpo` arguments, its key here or why none."""
    rows = ["| TRL field | TRL default | `grpo` recipe key | how / why not |", "|---|---|---|---|"]
    defaults = {**{k: None for k in (*MODEL_ARGS, *SCRIPT_ARGS)}, **GRPO_CONFIG}
    for name in sorted(defaults):
        key, note = HOMES[name]
        default = "" if name not in GRPO_CONFIG else f"`{GRPO_CONFIG[name]!r}`"
        rows.append(f"| `{name}` | {default} | {f'`{key}`' if key else '-'} | {note.replace('|', '/')} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- converting a config


@dataclass
class Conversion:
    recipe: dict[str, Any]
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)  # (field, value, why)
    notes: list[str] = field(default_factory=list)  # the batch arithmetic and other translations shown
    unknown: list[str] = field(default_factory=list)  # fields TRL 1.16 does not have


def _set(recipe: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = recipe
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def convert(config: dict[str, Any], *, num_processes: int = 1, name: str | None = None) -> Conversion:
    """A `trl grpo --config` YAML (as a dict) -> the recipe, its notes and what could not be mapped."""
    unknown = sorted(k for k in config if k not in accepted_fields())
    renamed = [f"{old} is older TRL's name of {LEGACY[old]}" for old in config if old in LEGACY]
    config = {LEGACY.get(k, k): v for k, v in config.items()}
    given = {k: v for k, v in config.items() if k in known_fields()}
    cfg = {**GRPO_CONFIG, **given}  # TRL's defaults where the file is silent: a converted run trains TRL's algorithm
    out = Conversion(recipe={}, unknown=unknown, notes=renamed)
    r = out.recipe
    handled: set[str] = set()

    def take(*keys: str) -> None:
        handled.update(keys)

    def unmapped(key: str, why: str | None = None) -> None:
        handled.add(key)
        if key in given and given[key] != GRPO_CONFIG.get(key, None):
            out.unmapped.append((key, given[key], why or HOMES[key][1]))

    if not cfg.get("model_name_or_path"):
        raise ConversionError("model_name_or_path is missing: the recipe needs a model")
    if not cfg.get("dataset_name"):
        raise ConversionError("dataset_name is missing: the recipe needs training data")
    r["name"] = name or cfg.get("run_name") or str(cfg["model_name_or_path"]).rstrip("/").split("/")[-1] + "-grpo"
    take("run_name")

    # the model
    bf16 = cfg.get("bf16") if cfg.get("bf16") is not None else not cfg.get("use_cpu", False)  # TRL: bf16 off CPU
    init = dict(cfg.get("model_init_kwargs") or {})
    dtype = init.pop("dtype", None) or init.pop("torch_dtype", None) or cfg.get("dtype") or "auto"
    dtype = {"auto": "bfloat16" if bf16 else "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
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
    take("model_name_or_path", "model_revision", "dtype", "attn_implementation", "trust_remote_code",
         "gradient_checkpointing", "model_init_kwargs", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
         "lora_target_modules", "lora_modules_to_save", "use_rslora", "load_in_4bit")

    # data
    data: dict[str, Any] = {"dataset": cfg["dataset_name"], "split": cfg.get("dataset_train_split") or "train",
                            "prompt_column": "prompt", "chat_template": True,
                            "shuffle": bool(cfg.get("shuffle_dataset", True))
                            and cfg.get("train_sampling_strategy", "random") != "sequential"}
    if cfg.get("dataset_config"):
        data["config"] = cfg["dataset_config"]
    if cfg.get("chat_template_kwargs"):
        data["chat_template_kwargs"] = cfg["chat_template_kwargs"]
    if cfg.get("data_seed") is not None:
        data["seed"] = cfg["data_seed"]
    if config.get("max_prompt_length") is not None:  # TRL < 1.0 truncated prompts to it (from the left)
        data["max_prompt_length"] = int(config["max_prompt_length"])
    r["data"] = data
    take("dataset_name", "dataset_config", "dataset_train_split", "shuffle_dataset", "train_sampling_strategy",
         "chat_template_kwargs", "data_seed")

    # rewards
    rewards = []
    for fn in cfg.get("reward_funcs") or []:
        ours, kwargs = TRL_REWARDS.get(fn, (fn, {}))
        if ours == fn and ":" not in fn and "." in fn:  # my_module.my_reward -> my_module:my_reward
            ours = fn.rsplit(".", 1)[0] + ":" + fn.rsplit(".", 1)[1]
        rewards.append({"name": ours, **({"kwargs": kwargs} if kwargs else {})})
    if cfg.get("reward_model_name_or_path"):
        rewards.append({"name": f"model:{cfg['reward_model_name_or_path']}"})
    if not rewards:
        raise ConversionError("reward_funcs (or reward_model_name_or_path) is missing: the recipe needs a reward")
    weights = cfg.get("reward_weights")
    if weights:
        if len(weights) != len(rewards):
            raise ConversionError(f"reward_weights has {len(weights)} values for {len(rewards)} rewards")
        for rw, w in zip(rewards, weights):
            rw["weight"] = float(w)
    r["rewards"] = rewards
    take("reward_funcs", "reward_model_name_or_path", "reward_weights")

    # batch arithmetic: TRL counts completions, grpo prompts
    G = int(cfg["num_generations"])
    per_device, accumulation = int(cfg["per_device_train_batch_size"]), int(cfg["gradient_accumulation_steps"])
    per_step = per_device * accumulation * num_processes
    steps_per_generation = cfg.get("steps_per_generation")
    generation = cfg.get("generation_batch_size")
    if steps_per_generation is not None and int(steps_per_generation) != accumulation:
        raise ConversionError(
            f"steps_per_generation ({steps_per_generation}) != gradient_accumulation_steps ({accumulation}): TRL then "
            "takes several optimizer steps on slices of one generation batch, which grpo does not do; use "
            "num_iterations for several updates on one batch")
    if generation is not None and int(generation) != per_step:
        raise ConversionError(
            f"generation_batch_size ({generation}) != per_device_train_batch_size x gradient_accumulation_steps x "
            f"processes ({per_device} x {accumulation} x {num_processes} = {per_step}): grpo generates one batch per "
            "optimizer step")
    if per_step % G:
        raise ConversionError(f"{per_step} completions per optimizer step is not a multiple of num_generations ({G})")
    prompts = per_step // G
    out.notes.append(
        f"batch: TRL's optimizer step = per_device_train_batch_size x gradient_accumulation_steps x processes = "
        f"{per_device} x {accumulation} x {num_processes} = {per_step} completions = {prompts} prompts x G={G} -> "
        f"train.prompts_per_step: {prompts}, train.micro_batch_size: {per_device} (completions per forward); one "
        "generation batch per optimizer step, as TRL with steps_per_generation = gradient_accumulation_steps")
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
                 "sapo_temperature_pos": cfg["sapo_temperature_pos"], "sapo_temperature_neg": cfg["sapo_temperature_neg"]}
    if algorithm["loss_type"] == "vespo":
        raise ConversionError("loss_type vespo is not implemented in grpo")
    r["algorithm"] = algorithm
    take("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
         "generation_batch_size", "beta", "epsilon", "epsilon_high", "delta", "loss_type", "scale_rewards",
         "num_iterations", "importance_sampling_level", "mask_truncated_completions", "top_entropy_quantile",
         "use_bias_correction_kl", "off_policy_mask_threshold", "multi_objective_aggregation", "sync_ref_model",
         "ref_model_mixup_alpha", "ref_model_sync_steps", "sapo_temperature_pos", "sapo_temperature_neg")

    # rollout
    rollout: dict[str, Any] = {
        "backend": "vllm" if cfg["use_vllm"] else "hf", "max_completion_length": cfg["max_completion_length"],
        "temperature": cfg["temperature"], "top_p": cfg["top_p"], "top_k": cfg["top_k"] or None,
        "min_p": cfg["min_p"], "repetition_penalty": cfg["repetition_penalty"],
    }
    if cfg.get("generation_kwargs"):
        rollout["generation_kwargs"] = cfg["generation_kwargs"]
    if cfg.get("cache_implementation"):
        rollout["cache_implementation"] = cfg["cache_implementation"]
    if cfg.get("max_tool_calling_iterations"):
        rollout["max_turns"] = int(cfg["max_tool_calling_iterations"]) + 1
    if cfg["use_vllm"]:
        url = cfg.get("vllm_server_base_url") or f"http://{cfg['vllm_server_host']}:{cfg['vllm_server_port']}"
        url = url.replace("://0.0.0.0:", "://127.0.0.1:")
        rollout["vllm"] = {"mode": cfg["vllm_mode"], "server_url": url,
                           "request_timeout_s": float(cfg["vllm_server_timeout"]),
                           "gpu_memory_utilization": cfg["vllm_gpu_memory_utilization"],
                           "max_model_len": cfg["vllm_max_model_length"],
                           "structured_outputs_regex": cfg["vllm_structured_outputs_regex"]}
        correction = cfg["vllm_importance_sampling_correction"]
        rollout["importance_sampling"] = cfg["vllm_importance_sampling_mode"] if correction else "none"
        cap = cfg.get("vllm_importance_sampling_cap") or cfg.get("vllm_importance_sampling_clip_max")
        if cap:
            rollout["importance_sampling_cap"] = float(cap)
        if cfg["vllm_tensor_parallel_size"] != 1:
            out.notes.append(f"vllm_tensor_parallel_size {cfg['vllm_tensor_parallel_size']}: start the server with "
                             f"`grpo serve-vllm --tp {cfg['vllm_tensor_parallel_size']}`")
    elif cfg.get("vllm_structured_outputs_regex"):
        unmapped("vllm_structured_outputs_regex", "structured outputs need use_vllm")
    r["rollout"] = rollout
    take("use_vllm", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
         "generation_kwargs", "cache_implementation", "max_tool_calling_iterations", "vllm_mode",
         "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
         "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_structured_outputs_regex",
         "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_cap",
         "vllm_importance_sampling_clip_max", "vllm_tensor_parallel_size")

    # train
    max_steps = int(cfg["max_steps"])
    if max_steps <= 0:
        raise ConversionError("max_steps is not set (TRL would derive it from num_train_epochs and the dataset size): "
                              "give max_steps")
    warmup = cfg.get("warmup_steps") or 0
    if isinstance(warmup, float) and 0 < warmup < 1:
        warmup = round(warmup * max_steps)
        out.notes.append(f"warmup_steps {cfg['warmup_steps']} is a ratio: {warmup} of {max_steps} steps")
    scheduler = SCHEDULERS.get(cfg["lr_scheduler_type"])
    if scheduler is None:
        unmapped("lr_scheduler_type", f"{cfg['lr_scheduler_type']} is not one of constant / linear / cosine: linear used")
        scheduler = "linear"
    optimizer = OPTIMIZERS.get(cfg["optim"])
    if optimizer is None:
        unmapped("optim", f"{cfg['optim']} has no counterpart: adamw used")
        optimizer = "adamw"
    precision = "fp16" if cfg.get("fp16") else ("bf16" if bf16 and dtype == "float32" else "no")
    r["train"] = {"max_steps": max_steps, "prompts_per_step": prompts, "micro_batch_size": per_device,
                  "optimizer": optimizer, "learning_rate": cfg["learning_rate"], "scheduler": scheduler,
                  "warmup_steps": int(warmup), "weight_decay": cfg["weight_decay"], "adam_beta1": cfg["adam_beta1"],
                  "adam_beta2": cfg["adam_beta2"], "max_grad_norm": cfg["max_grad_norm"], "mixed_precision": precision,
                  "seed": cfg["seed"]}
    take("max_steps", "warmup_steps", "lr_scheduler_type", "optim", "fp16", "bf16", "learning_rate", "weight_decay",
         "adam_beta1", "adam_beta2", "max_grad_norm", "seed", "use_cpu")

    # checkpoints, logging, eval
    every = 0 if cfg["save_strategy"] == "no" else int(cfg["save_steps"])
    if cfg["save_strategy"] == "epoch":
        unmapped("save_strategy", "epoch is not supported: checkpoints every save_steps")
    r["checkpoint"] = {"every_steps": every, "keep_last": cfg["save_total_limit"]}
    report = cfg["report_to"]
    report = [] if report in (None, "none", ["none"]) else ([report] if isinstance(report, str) else list(report))
    trackers = [t for t in report if t in ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml")]
    for t in report:
        if t not in trackers and t != "all":
            out.unmapped.append(("report_to", t, "not one of accelerate's trackers"))
    prints = cfg["num_completions_to_print"] or (4 if cfg["log_completions"] else 0)
    r["logging"] = {"output_dir": cfg["output_dir"] or f"runs/{r['name']}", "every_steps": int(cfg["logging_steps"]),
                    "trackers": trackers, "num_completions_to_print": int(prints)}
    take("save_strategy", "save_steps", "save_total_limit", "report_to", "output_dir", "logging_steps",
         "log_completions", "num_completions_to_print")
    if cfg["eval_strategy"] != "no" or cfg.get("dataset_test_split"):
        steps = cfg.get("eval_steps") or cfg["logging_steps"]
        r["eval"] = {"every_steps": int(steps) if cfg["eval_strategy"] == "steps" else 0,
                     "split": cfg.get("dataset_test_split") or "test",
                     "batch_size": int(cfg["per_device_eval_batch_size"])}
    take("eval_strategy", "eval_steps", "dataset_test_split", "per_device_eval_batch_size")

    for key in given:
        if key not in handled:
            unmapped(key)
    out.notes.append(f"TRL {TRL_VERSION}'s defaults are written out where the file is silent (beta {cfg['beta']}, "
                     f"loss_type {cfg['loss_type']}, use_bias_correction_kl {cfg['use_bias_correction_kl']}, learning_rate "
                     f"{cfg['learning_rate']}, adam_beta2 {cfg['adam_beta2']}, max_grad_norm {cfg['max_grad_norm']}, "
                     f"max_completion_length {cfg['max_completion_length']}, scheduler {cfg['lr_scheduler_type']})")
    return out
