"""`grpo convert-trl`'s rollout parts: GRPOTrainer's environment_factory and tools (import paths in the config), and
TRL's vLLM fields. Importing this module must not import torch."""

from __future__ import annotations

from typing import Any

from grpo_cli.recipe.backends import BACKENDS
from grpo_cli.recipe.checks import unreplayed


def import_path(path: Any) -> Any:
    """A Python import path as TRL's users write it (my_envs.IncrementEnv) -> ours (my_envs:IncrementEnv); a path
    with a colon already, or a file path, unchanged."""
    if isinstance(path, str) and ":" not in path and "." in path and not path.endswith(".py"):
        module, _, name = path.rpartition(".")
        return f"{module}:{name}"
    return path


def agents(cfg: dict[str, Any]) -> dict[str, Any]:
    """rollout.environment, rollout.tools and rollout.max_turns of a TRL config (TRL's defaults filled in)."""
    out: dict[str, Any] = {}
    factory, tools = cfg.get("environment_factory"), cfg.get("tools")
    if factory:
        out["environment"] = {str(k): import_path(v) for k, v in factory.items()} \
            if isinstance(factory, dict) else import_path(factory)
    if tools:
        out["tools"] = [import_path(t) for t in tools]
    if cfg.get("max_tool_calling_iterations"):
        out["max_turns"] = int(cfg["max_tool_calling_iterations"]) + 1
    elif factory or tools:  # TRL: no limit but the tokens; every turn samples one at least
        out["max_turns"] = max(2, int(cfg["max_completion_length"]))
    if factory or tools:  # TRL appends each tool answer's tokens to the sampled ones: token in, token out
        out["history_change"] = "keep"
    return out


def vllm(cfg: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The rollout keys of a config with use_vllm (the vllm section, the importance-sampling correction); what
    changed on the way goes to `notes`."""
    out: dict[str, Any] = {}
    url = cfg.get("vllm_server_base_url") or f"http://{cfg['vllm_server_host']}:{cfg['vllm_server_port']}"
    url = url.replace("://0.0.0.0:", "://127.0.0.1:")
    out["vllm"] = {"mode": cfg["vllm_mode"], "server_url": url, "request_timeout_s": float(cfg["vllm_server_timeout"]),
                   "gpu_memory_utilization": cfg["vllm_gpu_memory_utilization"],
                   "max_model_len": cfg["vllm_max_model_length"],
                   "structured_outputs_regex": cfg["vllm_structured_outputs_regex"]}
    correction = cfg["vllm_importance_sampling_correction"]
    out["importance_sampling"] = cfg["vllm_importance_sampling_mode"] if correction else "none"
    trl_names = {"repetition_penalty": f"repetition_penalty {cfg['repetition_penalty']}",
                 "vllm.structured_outputs_regex": "vllm_structured_outputs_regex"}
    found = unreplayed(cfg["repetition_penalty"], cfg.get("generation_kwargs") or {},
                       cfg["vllm_structured_outputs_regex"])
    shaped = [trl_names.get(n, n) for n in found]
    if correction and shaped:
        out["importance_sampling"] = "none"
        notes.append(f"vllm_importance_sampling_correction: off, because {', '.join(shaped)} shape(s) the "
                     "distribution vLLM samples in a way the trainer cannot replay; TRL's ratio would be biased")
    cap = cfg.get("vllm_importance_sampling_cap") or cfg.get("vllm_importance_sampling_clip_max")
    if cap:
        out["importance_sampling_cap"] = float(cap)
    if cfg.get("vllm_importance_sampling_clip_min") is not None:
        out["importance_sampling_min"] = float(cfg["vllm_importance_sampling_clip_min"])
    if cfg["vllm_tensor_parallel_size"] != 1:
        tp = cfg["vllm_tensor_parallel_size"]
        if any(BACKENDS[n].splits_over_processes and BACKENDS[n].mode == cfg["vllm_mode"] for n in BACKENDS):
            out["vllm"]["tensor_parallel_size"] = tp
        else:
            notes.append(f"vllm_tensor_parallel_size {tp}: start the server with `grpo serve-vllm --tp {tp}`")
    return out
