"""Checks of a recipe that span several fields or sections (run by `Recipe`'s validator): multi-turn episodes,
generation settings, the label of a reward model's updates, keys that have a home of their own. Each raises a
ValueError whose message starts with the field it is about. Pure rules: a name given to code (a reward, a tool, an
environment, a generator) is checked here for its grammar only; grpo_cli/preflight imports it and checks its use.
This module must not import grpo_cli.recipe.schema.
"""

from __future__ import annotations

import re

from grpo_cli.recipe.specs import LOSSES
from grpo_cli.recipe.names import is_reward_model, unique_log_names
from grpo_cli.recipe.backends import backend_of

GENERATION_OWN = {  # rollout.generation_kwargs with a key of their own
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "top_k": "rollout.top_k", "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty", "max_new_tokens": "rollout.max_completion_length",
    "max_tokens": "rollout.max_completion_length", "max_length": "rollout.max_completion_length",
    "do_sample": "rollout.temperature", "eos_token_id": "(the model's EOS ids)", "stop_token_ids": "(the model's EOS ids)",
    "pad_token_id": "(the tokenizer's)", "seed": "train.seed", "n": "algorithm.num_generations",
    "num_return_sequences": "algorithm.num_generations", "logprobs": "(grpo asks for them)",
    "cache_implementation": "rollout.cache_implementation",
}
# rollout.generation_kwargs that change the distribution the sampler draws from in a way the trainer does not replay
# (it replays the temperature and top-k / top-p / min-p): transformers GenerationConfig and vLLM SamplingParams names
UNREPLAYED_KWARGS = {
    "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h", "top_n_sigma", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "bad_words_ids", "force_words_ids", "sequence_bias",
    "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "forced_decoder_ids",
    "min_new_tokens", "min_length", "exponential_decay_length_penalty", "guidance_scale", "watermarking_config",
    "presence_penalty", "frequency_penalty", "logit_bias", "bad_words", "min_tokens", "allowed_token_ids",
    "logits_processors",
}
INIT_OWN = {  # model.init_kwargs with a key of their own
    "dtype": "model.dtype", "torch_dtype": "model.dtype", "attn_implementation": "model.attn_implementation",
    "revision": "model.revision", "trust_remote_code": "model.trust_remote_code",
    "quantization_config": "model.load_in_4bit", "load_in_4bit": "model.load_in_4bit",
    "device_map": "(the trainer places the model)", "gguf_file": "model.gguf_file",
}


def refuse_own_keys(field: str, given: dict, own: dict[str, str]) -> None:
    """ValueError naming `field.KEY` for a key of `given` that has a recipe key of its own (`own`: key -> that
    recipe key, or a parenthesised reason it cannot be set at all)."""
    for key in given:
        if key in own:
            home = own[key]
            raise ValueError(f"{field}.{key}: " + (f"not settable {home}" if home.startswith("(") else
                                                   f"set {home} instead"))


def check_generation(ro) -> None:
    """rollout.generation_kwargs, cache_implementation and vllm.structured_outputs_regex (naming the field)."""
    if (regex := ro.vllm.structured_outputs_regex) is not None:
        if not backend_of(ro).structured_outputs:
            raise ValueError("rollout.vllm.structured_outputs_regex needs rollout.backend vllm (structured outputs "
                             "are vLLM's)")
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"rollout.vllm.structured_outputs_regex: not a regular expression ({e})") from None
    refuse_own_keys("rollout.generation_kwargs", ro.generation_kwargs, GENERATION_OWN)
    compiles = backend_of(ro).compiled_decoding
    if ro.compile is True and not compiles:
        raise ValueError("rollout.compile: compiled decoding is the hf backend's (vLLM compiles its own unless "
                         "rollout.vllm.enforce_eager)")
    if ro.compile is True and compiles and ro.cache_implementation is not None:  # auto leaves a chosen cache alone
        raise ValueError(f"rollout.cache_implementation: {ro.cache_implementation!r} with rollout.compile, which "
                         "builds its own static cache; leave one of them unset")


def unreplayed(repetition_penalty: float, generation_kwargs: dict, structured_outputs_regex: str | None) -> list[str]:
    """The sampling settings that shape the distribution beyond what the trainer replays (temperature, top-k, top-p,
    min-p), by their names under the recipe's rollout section (`grpo convert-trl` names TRL's fields from them)."""
    found = ["repetition_penalty"] if repetition_penalty != 1 else []
    found += [f"generation_kwargs.{k}" for k in generation_kwargs if k in UNREPLAYED_KWARGS]
    return found + (["vllm.structured_outputs_regex"] if structured_outputs_regex else [])


def check_sampler_logprobs(ro, algorithm) -> None:
    """Where the sampler's log-probs feed a correction (rollout.importance_sampling,
    algorithm.off_policy_mask_threshold: vLLM, or an hf sampling copy), the trainer must compute the same distribution.
    It replays the temperature and top-k / top-p / min-p; a setting it cannot replay would bias pi_train / pi_sampler
    on every token: refused.
    (A structured-outputs regex off vLLM is refused before, by check_generation.)"""
    records = backend_of(ro).own_weights or ro.dtype != "policy"
    corrects = ro.importance_sampling != "none" or algorithm.off_policy_mask_threshold is not None
    if records and LOSSES[algorithm.loss_type].takes_sampler_weights and ro.importance_sampling.startswith("sequence"):
        raise ValueError(
            f"rollout.importance_sampling ({ro.importance_sampling}) with algorithm.loss_type {algorithm.loss_type}: "
            f"{algorithm.loss_type} folds the sampler's per-token ratios into its own sequence weight, so it takes "
            "token_truncate or token_mask (as TRL), or none")
    found = unreplayed(ro.repetition_penalty, ro.generation_kwargs, ro.vllm.structured_outputs_regex)
    if records and corrects and found:
        named = [f"rollout.{n}" + (f" ({ro.repetition_penalty})" if n == "repetition_penalty" else "") for n in found]
        off = "rollout.importance_sampling: none" + (
            " and algorithm.off_policy_mask_threshold: null" if algorithm.off_policy_mask_threshold is not None else "")
        raise ValueError(
            f"{', '.join(named)}: {'shapes' if len(found) == 1 else 'shape'} the distribution the sampler draws from "
            f"in a way the trainer does not replay (it replays temperature, top_k, top_p and min_p), so the sampler's "
            f"log-probs would bias the importance ratio on every token; set {off}, or drop the setting")


def check_episodes(recipe) -> None:
    """Multi-turn settings that fit together (naming the field)."""
    ro = recipe.rollout
    uses_reward = [i for i, r in enumerate(recipe.rewards) if r.name == "environment"]
    if ro.agent is not None:
        if ro.environment is not None or ro.tools:
            raise ValueError(f"rollout.agent: an agent program owns its tool loop and environment; it does not "
                             f"combine with rollout.{'environment' if ro.environment is not None else 'tools'}")
        return
    if ro.environment is None and uses_reward:
        raise ValueError(f"rewards.{uses_reward[0]}.name: the reward `environment` needs rollout.environment (or "
                         "rollout.agent)")
    if ro.environment is None and not ro.tools:
        if ro.max_turns > 1:
            raise ValueError(f"rollout.max_turns ({ro.max_turns}) needs rollout.environment or rollout.tools: after "
                             "each turn something must answer the model")
        return
    if isinstance(ro.environment, dict):
        if not ro.environment:
            raise ValueError("rollout.environment: the mapping of routes to classes is empty")
        for route, kwargs in ro.environment_kwargs.items():
            if route not in ro.environment:
                raise ValueError(f"rollout.environment_kwargs.{route}: not a route of rollout.environment "
                                 f"({', '.join(ro.environment)}); with several environments, environment_kwargs "
                                 "maps a route to its class's kwargs")
            if not isinstance(kwargs, dict):
                raise ValueError(f"rollout.environment_kwargs.{route}: the kwargs of {ro.environment[route]}, a "
                                 f"mapping (got {type(kwargs).__name__})")
    if ro.tools and ro.max_turns < 2:
        raise ValueError("rollout.tools needs rollout.max_turns >= 2: a tool's answer comes in the next turn")


def update_label(rewards: list, i: int) -> int:
    """The index of the reward that labels reward model `i`'s updates (rewards[i].update.label); ValueError
    naming the field when `i` is no reward model or the label is missing, ambiguous or not verifiable."""
    spec = rewards[i]
    if not is_reward_model(spec.name):
        raise ValueError(f"rewards.{i}.update: only a reward model (name: model:PATH) is trained during the run; "
                         f"{spec.name!r} is a function: remove update")
    verifiable = [j for j, r in enumerate(rewards) if not is_reward_model(r.name) and r.level == "outcome"]
    label = spec.update.label
    if label is None:
        if len(verifiable) != 1:
            found = ", ".join(repr(rewards[j].name) for j in verifiable) or "none"
            raise ValueError(f"rewards.{i}.update.label: name the verifiable reward that labels the reward model's "
                             f"samples (outcome rewards that are not reward models: {found})")
        return verifiable[0]
    logged = unique_log_names([r.name for r in rewards])
    named = [j for j, r in enumerate(rewards) if r.name == label] or [j for j, x in enumerate(logged) if x == label]
    if not named:
        raise ValueError(f"rewards.{i}.update.label: {label!r} is neither the name of a reward in this recipe nor the "
                         f"name one is logged under ({', '.join(logged)})")
    if named[0] not in verifiable:
        raise ValueError(f"rewards.{i}.update.label: {label!r} is a reward model or step-level; the label must be an "
                         "outcome reward computed by a function (e.g. accuracy)")
    return named[0]


def check_rewards(recipe) -> None:
    """At least one reward, unless a teacher gives the signal; a reward model's updates have one label (what each
    name stands for is grpo_cli/preflight's to check)."""
    if not recipe.rewards and recipe.distillation is None:
        raise ValueError("rewards: name at least one reward (an empty list trains on a teacher alone: set distillation)")
    for i, r in enumerate(recipe.rewards):
        if r.update is not None:
            update_label(recipe.rewards, i)


def check_across_sections(recipe) -> None:
    """Settings of different sections that do not fit together (the batch, asynchronous rollouts, dynamic sampling,
    step rewards, the reference refresh, episodes, generation, QLoRA, the data generator)."""
    n = recipe.generation_batch_size
    if n % recipe.train.micro_batch_size:
        raise ValueError(
            f"train.micro_batch_size ({recipe.train.micro_batch_size}) must divide prompts_per_step * "
            f"num_generations ({recipe.train.prompts_per_step} * {recipe.algorithm.num_generations} = {n})"
        )
    k = recipe.rollout.max_staleness
    if k and backend_of(recipe.rollout).in_process:
        raise ValueError(
            f"rollout.max_staleness ({k}) needs rollout.backend vllm with rollout.vllm.mode server: asynchronous "
            "rollouts sample in another process (grpo serve-vllm) while this one trains; the hf backend and a "
            "colocated vLLM share the trainer's process and devices, so there is nothing to overlap"
        )
    if k and recipe.algorithm.dynamic_sampling.enabled:
        raise ValueError(
            "algorithm.dynamic_sampling does not combine with rollout.max_staleness yet: its extra rounds would be "
            "sampled outside the fixed staleness schedule; use one or the other"
        )
    if recipe.algorithm.dynamic_sampling.enabled and any(r.level == "step" for r in recipe.rewards):
        raise ValueError("algorithm.dynamic_sampling decides by the outcome rewards' spread, and step-level rewards "
                         "(rewards[].level: step) have their own: use one or the other")
    if recipe.algorithm.multi_objective_aggregation == "normalize_then_sum" and any(r.level == "step" for r in recipe.rewards):
        raise ValueError("algorithm.multi_objective_aggregation normalize_then_sum combines outcome rewards; "
                         "step-level rewards are normalised per step already: use sum_then_normalize")
    if recipe.algorithm.sync_ref_model and recipe.model.lora.r:
        raise ValueError(
            "algorithm.sync_ref_model with LoRA: the reference is the frozen base with the adapters disabled, "
            "which a refresh cannot move without a second copy of the model; train all weights (model.lora.r = 0) "
            "to refresh the reference"
        )
    if recipe.rollout.vllm.lora_sync == "adapter" and not (recipe.model.lora.r and backend_of(recipe.rollout).adapter_sync):
        raise ValueError("rollout.vllm.lora_sync adapter syncs LoRA adapters to grpo serve-vllm: it needs "
                         "model.lora.r > 0 with rollout.backend vllm and rollout.vllm.mode server")
    tp = recipe.rollout.vllm.tensor_parallel_size
    if tp > 1 and not backend_of(recipe.rollout).splits_over_processes:
        raise ValueError(f"rollout.vllm.tensor_parallel_size ({tp}) splits a colocated vLLM engine over training "
                         f"processes; a grpo serve-vllm server takes --tp {tp} itself")
    if tp > 1 and (recipe.rollout.tools or recipe.rollout.environment is not None or recipe.rollout.agent is not None):
        raise ValueError("rollout.vllm.tensor_parallel_size > 1 with multi-turn episodes: the processes of an "
                         "engine sample together, and episodes end at different turns on each; use 1")
    check_episodes(recipe)
    check_generation(recipe.rollout)
    check_sampler_logprobs(recipe.rollout, recipe.algorithm)
    if recipe.model.load_in_4bit and backend_of(recipe.rollout).own_weights:
        raise ValueError("model.load_in_4bit (QLoRA) works with rollout.backend hf only: vLLM cannot take 4-bit "
                         "merged weights from the trainer; use LoRA on a bf16 base with vLLM")
