"""Generation backends: turn B prompts into B*G completions (a `Rollout`).

Every backend implements `Generator`; `build_generator` makes the one a recipe names (the engine, `grpo
eval` and the CLI all go through it). Backends register by name in `BACKENDS`: `hf` (transformers
`generate` on the policy itself), `vllm-colocate` (a vLLM engine in this process) and `vllm-server`
(a `grpo serve-vllm` process over HTTP). Heavy imports happen when a backend is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from grpo_cli.registry import Registry

if TYPE_CHECKING:
    import torch

    from grpo_cli.datatypes import Rollout
    from grpo_cli.recipe.schema import RolloutConfig
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
        """Sample with `model`'s current weights from now on; -> seconds taken."""

    def sleep(self) -> None:
        """Free what sampling holds while the trainer updates (where the backend can)."""

    def wake_up(self) -> None: ...

    def close(self) -> None: ...

    def state_dict(self) -> dict:
        """What a resumed run needs to sample as this one would have (JSON)."""

    def load_state_dict(self, state: dict) -> None: ...


# name -> fn(cfg, *, model, tokenizer, model_dir, seed, synced) -> Generator
BACKENDS: Registry[Callable[..., Generator]] = Registry("rollout backend")


@BACKENDS.register("hf")
def _hf(cfg: RolloutConfig, *, model, tokenizer, synced: bool = False, **_: Any) -> Generator:
    from grpo_cli.rollout.hf import HFGenerator

    return HFGenerator(model, tokenizer, cfg, synced=synced)


@BACKENDS.register("vllm-colocate")
def _vllm_colocate(cfg: RolloutConfig, *, tokenizer, model_dir: str, seed: int, **_: Any) -> Generator:
    from grpo_cli.rollout.vllm_colocate import VLLMColocateGenerator

    return VLLMColocateGenerator(model_dir, tokenizer, cfg, seed)


@BACKENDS.register("vllm-server")
def _vllm_server(cfg: RolloutConfig, *, tokenizer, seed: int, **_: Any) -> Generator:
    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    return VLLMServerGenerator(tokenizer, cfg, seed)


def backend_name(cfg: RolloutConfig) -> str:
    return "hf" if cfg.backend == "hf" else f"vllm-{cfg.vllm.mode}"


def build_generator(cfg: RolloutConfig, *, tokenizer, model=None, model_dir: str | None = None, seed: int = 0,
                    synced: bool = False) -> Generator:
    """The backend `cfg` names. `model`: the policy (hf samples with it); `model_dir`: the folder a vLLM engine
    loads; `seed`: per-request seeds (vLLM); `synced`: the policy's weights are sharded over processes (hf)."""
    return BACKENDS.get(backend_name(cfg))(cfg, model=model, tokenizer=tokenizer, model_dir=model_dir, seed=seed,
                                           synced=synced)
