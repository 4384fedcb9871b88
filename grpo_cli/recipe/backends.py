"""The rollout backends a recipe can name, and what each one can do: one `BACKENDS` entry a backend, its
capabilities (the recipe's checks, the doctor and the rollouts ask them instead of comparing names) and its builder,
named as "module:function" (grpo_cli/rollout/backends.py's `build_generator` imports it when called). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_cli.registry import Registry


@dataclass(frozen=True)
class Backend:
    """What a rollout backend can do, and what builds it."""

    builder: str  # "module:function": (cfg, *, tokenizer, model, model_dir, seed, synced) -> Generator
    own_weights: bool  # samples from its own copy of the weights: the policy's are pushed to it after each update
    in_process: bool  # runs in the trainer's process (False: another process samples, so rollouts can run ahead)
    structured_outputs: bool  # can constrain completions to a regular expression
    compiled_decoding: bool = False  # rollout.compile applies (vLLM compiles its own unless enforce_eager)
    adapter_sync: bool = False  # can take a LoRA adapter instead of merged weights (rollout.vllm.lora_sync)

    @property
    def loads_model_folder(self) -> bool:
        """Starts from the model folder itself (a colocated vLLM engine), not from the trainer's tensors."""
        return self.own_weights and self.in_process

    @property
    def imports_vllm(self) -> bool:
        """Needs the vllm package in the trainer's environment (a server's client speaks HTTP)."""
        return self.own_weights and self.in_process


BACKENDS: Registry[Backend] = Registry("rollout backend")
BACKENDS.register("hf")(Backend(
    "grpo_cli.rollout.hf:build_hf_generator", own_weights=False, in_process=True, structured_outputs=False,
    compiled_decoding=True))
BACKENDS.register("vllm-colocate")(Backend(
    "grpo_cli.rollout.vllm_colocate:build_colocated_generator", own_weights=True, in_process=True,
    structured_outputs=True))
BACKENDS.register("vllm-server")(Backend(
    "grpo_cli.rollout.vllm_server:build_server_generator", own_weights=True, in_process=False,
    structured_outputs=True, adapter_sync=True))

# `grpo eval --backend`: the rollout settings each choice means
EVAL_BACKENDS = {"hf": {"backend": "hf"}, "vllm": {"backend": "vllm", "mode": "colocate"}}


def backend_name(cfg: Any) -> str:
    """The BACKENDS name of a recipe's rollout section (`rollout.backend` and, for vllm, `rollout.vllm.mode`)."""
    return "hf" if cfg.backend == "hf" else f"vllm-{cfg.vllm.mode}"


def backend_of(cfg: Any) -> Backend:
    return BACKENDS.get(backend_name(cfg))


def for_eval(cfg: Any, choice: str) -> Any:
    """The rollout section `grpo eval --backend CHOICE` samples with; ValueError naming the choices."""
    if choice not in EVAL_BACKENDS:
        raise ValueError(f"--backend {choice!r} is not available; valid: {', '.join(EVAL_BACKENDS)}")
    setting = EVAL_BACKENDS[choice]
    vllm = cfg.vllm.model_copy(update={"mode": setting["mode"]}) if "mode" in setting else cfg.vllm
    return cfg.model_copy(update={"backend": setting["backend"], "vllm": vllm})
