"""Generation backends: what turns B prompts into B*G completions (a `Rollout`).

Every backend implements `Generator`; `build_generator` makes the one a recipe names from its entry in
grpo_cli/recipe/backends.py's `BACKENDS` (its capabilities and its builder, named as "module:function"): `hf`
(transformers `generate` on the policy itself), `vllm-colocate` (a vLLM engine in this process) and `vllm-server` (a
`grpo serve-vllm` process over HTTP). This module imports neither torch nor a backend: the builder is imported when
called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from grpo_cli.recipe.backends import backend_of

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
               temperature: float | None = None, top_p: float | None = None, logprobs: bool = False) -> Samples:
        """Continue each token sequence by at most its own budget (the turns of multi-turn episodes). `logprobs`:
        report the sampler's log-probs of the drawn tokens (vLLM always does)."""

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


def build_generator(cfg: Any, *, tokenizer, model=None, model_dir: str | None = None, seed: int = 0,
                    synced: bool = False) -> Generator:
    """The backend `cfg` (a recipe's rollout section) names (training, `grpo eval` and the run's eval go through
    it). `model`: the policy (hf samples with it); `model_dir`: the folder a colocated engine loads; `seed`:
    per-request seeds (vLLM); `synced`: the policy's weights are sharded over processes (hf)."""
    module, function = backend_of(cfg).builder.split(":")
    build = getattr(importlib.import_module(module), function)
    return build(cfg, tokenizer=tokenizer, model=model, model_dir=model_dir, seed=seed, synced=synced)
