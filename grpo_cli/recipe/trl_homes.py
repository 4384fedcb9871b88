"""Where each TRL setting lives in a `grpo` recipe: every field of TRL 1.16's GRPOConfig (TrainingArguments' included,
trl_fields.GRPO_CONFIG) and of the `trl grpo` script's model and dataset arguments, with its recipe key or why it has
none (the docs' table, and what `grpo convert-trl` follows). Importing this module must not import torch."""

from __future__ import annotations

from grpo_cli.recipe.trl_fields import GRPO_CONFIG, MODEL_ARGS, SCRIPT_ARGS

# ---------------------------------------------------------------- where each field lives

_SAME = "same meaning"
# field -> (recipe key or None, how it maps / why it has no home)
HOMES: dict[str, tuple[str | None, str]] = {
    # the model (GRPOConfig, then ModelConfig)
    "model_init_kwargs": ("model.init_kwargs", "dtype / attn_implementation / revision / trust_remote_code go to their own keys"),
    "trust_remote_code": ("model.trust_remote_code", _SAME),
    "model_name_or_path": ("model.name_or_path", _SAME),
    "model_revision": ("model.revision", _SAME),
    "dtype": ("model.dtype", "float32 by default, as in TRL; auto (the checkpoint's dtype) becomes bfloat16 with bf16, "
                             "else float32"),
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
    "dataset_streaming": ("data.streaming", "same meaning; shuffled in blocks of data.shuffle_buffer rows (1000, "
                          "datasets' default buffer) and resumed exactly"),
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
    "steps_per_generation": ("train.mini_batches", "the generation batch (train.prompts_per_step) and, over "
                             "gradient_accumulation_steps, the optimizer steps taken on it (train.mini_batches)"),
    "generation_batch_size": ("train.prompts_per_step", "the generation batch's completions / G; with the optimizer "
                              "step's completions it makes train.mini_batches"),
    "max_steps": ("train.max_steps", "TRL's optimizer steps / (mini_batches x num_iterations): grpo counts generation "
                  "batches"),
    "num_train_epochs": ("train.epochs", "where max_steps is not set (TRL's -1): the steps counted from the data's "
                         "rows"),
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
    "bf16": ("train.mixed_precision", "true (TRL's default unless fp16) -> bf16 autocast over float32 weights; "
                                       "none over bfloat16 weights"),
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
    "accelerator_config": (None, "use `grpo train --accelerate-config accelerate.yaml`"),
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
    "max_tool_calling_iterations": ("rollout.max_turns", "iterations + 1 assistant turns (tools: rollout.tools); "
                                    "TRL's None (no limit) with tools: max_completion_length turns, which never "
                                    "binds first (every turn samples a token)"),
    # GRPOTrainer's arguments that `trl grpo` has no flag for, written as import paths in the config
    "environment_factory": ("rollout.environment", "a class's import path (my_envs.IncrementEnv -> "
                            "my_envs:IncrementEnv), or a mapping {route: path} routed by the rows' `environment` "
                            "column; with get_reward the reward `environment` (weight 1) is added; without "
                            "dataset_name the environment owns the data"),
    "tools": ("rollout.tools", "import paths of the functions (my_tools.add -> my_tools:add)"),
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
    "vllm_tensor_parallel_size": ("rollout.vllm.tensor_parallel_size", "colocate; server: `grpo serve-vllm --tp N`"),
    "vllm_importance_sampling_correction": ("rollout.importance_sampling", "false -> none"),
    "vllm_importance_sampling_mode": ("rollout.importance_sampling", _SAME),
    "vllm_importance_sampling_cap": ("rollout.importance_sampling_cap", _SAME),
    "vllm_importance_sampling_clip_max": ("rollout.importance_sampling_cap", "TRL's older name of the cap"),
    "vllm_importance_sampling_clip_min": ("rollout.importance_sampling_min", _SAME),
    # the algorithm
    "beta": ("algorithm.beta", _SAME),
    "num_iterations": ("algorithm.num_iterations", _SAME),
    "epsilon": ("algorithm.epsilon", _SAME),
    "epsilon_high": ("algorithm.epsilon_high", _SAME),
    "delta": ("algorithm.delta", _SAME),
    "sapo_temperature_neg": ("algorithm.sapo_temperature_neg", _SAME),
    "sapo_temperature_pos": ("algorithm.sapo_temperature_pos", _SAME),
    "vespo_k_pos": ("algorithm.vespo_k_pos", _SAME),
    "vespo_lambda_pos": ("algorithm.vespo_lambda_pos", _SAME),
    "vespo_k_neg": ("algorithm.vespo_k_neg", _SAME),
    "vespo_lambda_neg": ("algorithm.vespo_lambda_neg", _SAME),
    "importance_sampling_level": ("algorithm.importance_sampling_level", _SAME),
    "scale_rewards": ("algorithm.scale_rewards", "true -> group, false -> none"),
    "loss_type": ("algorithm.loss_type", "grpo / bnpo / dr_grpo / dapo / cispo / sapo / luspo (sequence level) / vespo"),
    "mask_truncated_completions": ("algorithm.mask_truncated_completions", _SAME),
    "sync_ref_model": ("algorithm.sync_ref_model", _SAME),
    "ref_model_mixup_alpha": ("algorithm.ref_model_mixup_alpha", _SAME),
    "ref_model_sync_steps": ("algorithm.ref_model_sync_steps", _SAME),
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", _SAME),
    "entropy_coef": ("algorithm.entropy_coef", _SAME),
    "use_adaptive_entropy": ("algorithm.use_adaptive_entropy", _SAME),
    "entropy_coef_min": ("algorithm.entropy_coef_min", _SAME),
    "entropy_coef_max": ("algorithm.entropy_coef_max", _SAME),
    "entropy_coef_delta": ("algorithm.entropy_coef_delta", _SAME),
    "entropy_target": ("algorithm.entropy_target", _SAME),
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
    "trackio_space_id": (None, "logging.trackers [trackio] logs locally; a Space or bucket is trackio's own setting"),
    "trackio_bucket_id": (None, "logging.trackers [trackio] logs locally; a Space or bucket is trackio's own setting"),
    "trackio_static_space_id": (None, "logging.trackers [trackio] logs locally; a Space or bucket is trackio's own setting"),
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


TRAINER_ARGS = ("environment_factory", "tools")  # GRPOTrainer's arguments, given as import paths


def known_fields() -> set[str]:
    return set(GRPO_CONFIG) | set(MODEL_ARGS) | set(SCRIPT_ARGS) | set(TRAINER_ARGS)


def accepted_fields() -> set[str]:
    """What convert-trl reads: TRL 1.16's fields, the older names in LEGACY, and max_prompt_length."""
    return known_fields() | set(LEGACY) | {"max_prompt_length"}


def trl_table() -> str:
    """The README's table: every field of TRL 1.16's GRPOConfig and `trl grpo` arguments, its key here or why none."""
    rows = ["| TRL field | TRL default | `grpo` recipe key | how / why not |", "|---|---|---|---|"]
    defaults = {**{k: None for k in (*MODEL_ARGS, *SCRIPT_ARGS, *TRAINER_ARGS)}, **GRPO_CONFIG}
    for name in sorted(defaults):
        key, note = HOMES[name]
        default = "" if name not in GRPO_CONFIG else f"`{GRPO_CONFIG[name]!r}`"
        rows.append(f"| `{name}` | {default} | {f'`{key}`' if key else '-'} | {note.replace('|', '/')} |")
    return "\n".join(rows)
