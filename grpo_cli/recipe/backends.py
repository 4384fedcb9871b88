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
    """What a rollout backend can do, what a recipe calls it and what builds it."""

    builder: str  # "module:function": (cfg, *, tokenizer, model, model_dir, seed, synced) -> Generator
    backend: str  # the rollout.backend that selects it
    mode: str | None  # and the rollout.vllm.mode (None: the backend has one mode)
    own_weights: bool  # samples from its own copy of the weights: the policy's are pushed to it after each update
    in_process: bool  # runs in the trainer's process (False: another process samples, so rollouts can run ahead)
    structured_outputs: bool  # can constrain completions to a regular expression
    compiled_decoding: bool = False  # rollout.compile applies (vLLM compiles its own unless enforce_eager)
    adapter_sync: bool = False  # can take a LoRA adapter instead of merged weights (rollout.vllm.lora_sync)
    evaluates: bool = False  # `grpo eval --backend <its rollout.backend>` samples with it
    splits_over_processes: bool = False  # one engine over several training processes (rollout.vllm.tensor_parallel_size)

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
    "grpo_cli.rollout.hf:build_hf_generator", "hf", None, own_weights=False, in_process=True,
    structured_outputs=False, compiled_decoding=True, evaluates=True))
BACKENDS.register("vllm-colocate")(Backend(
    "grpo_cli.rollout.vllm_colocate:build_colocated_generator", "vllm", "colocate", own_weights=True, in_process=True,
    structured_outputs=True, evaluates=True, splits_over_processes=True))
BACKENDS.register("vllm-server")(Backend(
    "grpo_cli.rollout.vllm_servers:build_server_generator", "vllm", "server", own_weights=True, in_process=False,
    structured_outputs=True, adapter_sync=True))

# what a recipe can write: rollout.backend's values, and rollout.vllm.mode's
BACKEND_CHOICES = tuple(dict.fromkeys(BACKENDS[n].backend for n in BACKENDS))
MODE_CHOICES = tuple(dict.fromkeys(BACKENDS[n].mode for n in BACKENDS if BACKENDS[n].mode is not None))
# `grpo eval --backend`: a rollout.backend value -> the entry it evaluates with
EVAL_BACKENDS = {BACKENDS[n].backend: n for n in BACKENDS if BACKENDS[n].evaluates}


def backend_name(cfg: Any) -> str:
    """The BACKENDS name of a recipe's rollout section: the entry its rollout.backend (and rollout.vllm.mode) say."""
    for name in BACKENDS:
        entry = BACKENDS[name]
        if entry.backend == cfg.backend and entry.mode in (None, cfg.vllm.mode):
            return name
    raise ValueError(f"rollout.backend {cfg.backend!r} with rollout.vllm.mode {cfg.vllm.mode!r} is no backend")


def backend_of(cfg: Any) -> Backend:
    return BACKENDS.get(backend_name(cfg))


def for_eval(cfg: Any, choice: str) -> Any:
    """The rollout section `grpo eval --backend CHOICE` samples with; ValueError naming the choices."""
    if choice not in EVAL_BACKENDS:
        raise ValueError(f"--backend {choice!r} is not available; valid: {', '.join(EVAL_BACKENDS)}")
    entry = BACKENDS[EVAL_BACKENDS[choice]]
    vllm = cfg.vllm.model_copy(update={"mode": entry.mode}) if entry.mode is not None else cfg.vllm
    return cfg.model_copy(update={"backend": entry.backend, "vllm": vllm})
