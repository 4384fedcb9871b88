"""A vLLM worker extension that swaps the policy's weights in place, reached with `collective_rpc`.

vLLM mixes this class into its worker (`LLM(worker_extension_cls=...)` or `--worker-extension-cls`),
so `self` below is the worker (`CPUWorker` on CPU builds, the CUDA `Worker` on GPUs; both inherit
`reload_weights` from `vllm.v1.worker.gpu_worker.Worker`). Names are HF checkpoint names: vLLM's
`reload_weights(is_checkpoint_format=True)` runs the model's own loader (which fuses q/k/v and
gate/up) and then `process_weights_after_loading`, which rebuilds the CPU oneDNN handles, except
for a tied lm_head, whose handle packs a copy of the embedding: `_refresh_cpu_lm_head` repacks it.

Used by both the colocated generator (in-process, tensors pass by reference) and `grpo serve-vllm`
(string arguments only: a safetensors path). Keep the method names and signatures stable.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from grpo_cli.process.cpus import allow_amx

VERSION_ATTR = "_grpo_weight_version"  # not the method's name: an attribute would shadow it


# vLLM imports this module in the process that hosts its worker (the engine process, or this one), before the
# model's first forward: the place to ask for AMX, which vLLM's CPU attention uses without asking (process/cpus.py)
allow_amx()


class WeightSyncExtension:
    """Methods added to the vLLM worker; the attribute `grpo_weight_version` lives on the worker."""

    def grpo_load_weights_from_file(self, path: str, version: int) -> int:
        """Reload every weight from one safetensors file (HF names); -> the new version."""
        from safetensors.torch import load_file

        state = load_file(path, device="cpu")
        return self.grpo_load_weights(list(state.items()), version)

    def grpo_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Reload from (HF name, tensor) pairs without a disk round trip; -> the new version.

        In-process the pairs arrive by reference (a lazy generator works too); across processes they are
        serialized, so the server uses `grpo_load_weights_from_file` instead."""
        self.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
        _refresh_cpu_lm_head(self.model_runner.get_model())
        setattr(self, VERSION_ATTR, int(version))
        return int(version)

    def grpo_weight_version(self) -> int:
        """Version of the weights now loaded; 0 = the checkpoint the engine started from."""
        return int(getattr(self, VERSION_ATTR, 0))

    def grpo_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused layers, e.g. {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}: a partial weight
        update must hold all of a fused layer's tensors (grpo_cli/serve/weights.py)."""
        mapping = getattr(self.model_runner.get_model(), "packed_modules_mapping", None) or {}
        return {str(k): [str(m) for m in v] for k, v in dict(mapping).items()}


def _refresh_cpu_lm_head(model: torch.nn.Module) -> None:
    """CPU builds compute logits through a prepacked GEMM handle (`lm_head.cpu_linear`) made at load
    time; with tied embeddings the reload updates the embedding but not that packed copy. GPU: no-op."""
    from vllm.platforms import current_platform

    lm_head = getattr(model, "lm_head", None)
    if not current_platform.is_cpu() or lm_head is None or not hasattr(lm_head, "cpu_linear"):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
