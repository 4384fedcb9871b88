"""`grpo train` with FSDP2 on CPU, for tests/test_distributed.py (run under torchrun, 2 processes, gloo).

accelerate 1.15 turns FSDP on only for accelerator devices (its state.py switches MULTI_GPU-like types to
FSDP, never MULTI_CPU), while torch's fully_shard itself works on CPU over gloo. This test-only shim
creates the Accelerator with an FSDP2 plugin and marks its state FSDP, so the engine's sharded code
paths (synced generation, gathered weights and optimizer state in checkpoints, exact resume) run here.
"""

import sys

import accelerate
import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

torch.set_num_threads(1)


class CPUFSDPAccelerator(accelerate.Accelerator):
    def __init__(self, **kwargs):
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT",
            reshard_after_forward=True,
        )
        super().__init__(cpu=True, fsdp_plugin=plugin, **kwargs)
        self.state.distributed_type = DistributedType.FSDP
        self.state.fsdp_plugin = plugin
        PartialState().distributed_type = DistributedType.FSDP


accelerate.Accelerator = CPUFSDPAccelerator

if __name__ == "__main__":
    from grpo_cli.cli import main

    sys.argv = ["grpo", "train", *sys.argv[1:]]
    main()
