"""Generation backends: what turns B prompts into B*G completions (a `Rollout`), and what each one can do.

Every backend implements `Generator`. A backend is one `BACKENDS` entry: its capabilities, so the rest of the
package asks what a backend can do instead of comparing its name, and its builder (`build_generator` makes the one
a recipe names): `hf` (transformers `generate` on the policy itself), `vllm-colocate` (a vLLM engine in this
process) and `vllm-server` (a `grpo serve-vllm` process over HTTP). This module imports neither torch nor a
backend (the builder is named as "module:function", imported when called): the recipe's checks read the
capabilities.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from grpo_cli.registry import Registry

if TYPE_CHECKING:
    import torch

    from grpo_cli.datatypes import Rollout
    from grpo_cli.rollout.common import Samples


class Generator(Protocol):
    pad_id: int  # the id rollouts pad with

    def generate(self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
                 temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows."""

    def sample(self, token_ids: list[list[int]], max_new_tokens: list[int], *, greedy: bool = False,
               temperature: float | None = None, top_p: float | None = None) -> Samples:
        """Continue each token sequence by at most its own budget (the turns of multi-turn episodes)."""

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Sample with `model`'s current weights from now on; -> seconds taken. Sets `sync_bytes`: what the sync
        handed over (tensor bytes in the receiver's dtype, or the file sent; 0 where nothing moves)."""

    def sleep(self) -> None:
        """Free what sampling holds while the trainer updates (where the backend can)."""

    def wake_up(self) -> None: ...

    def close(self) -> None: ...

    def state_dict(self) -> dict:
        """What a resumed run needs to sample as this one would have (JSON)."""

    def load_state_dict(self, state: dict) -> None: ...


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


def build_generator(cfg: Any, *, tokenizer, model=None, model_dir: str | None = None, seed: int = 0,
                    synced: bool = False) -> Generator:
    """The backend `cfg` (a recipe's rollout section) names (training, `grpo eval` and the run's eval go through
    it). `model`: the policy (hf samples with it); `model_dir`: the folder a colocated engine loads; `seed`:
    per-request seeds (vLLM); `synced`: the policy's weights are sharded over processes (hf)."""
    module, function = backend_of(cfg).builder.split(":")
    build = getattr(importlib.import_module(module), function)
    return build(cfg, tokenizer=tokenizer, model=model, model_dir=model_dir, seed=seed, synced=synced)
