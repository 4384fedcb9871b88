"""Processes: how a generation batch's rows split over them, the collectives the loop needs, and what FSDP
and DeepSpeed need done their way. Every function takes the run's accelerate `Accelerator`."""

from __future__ import annotations

import os

import torch

from grpo_cli.errors import SetupError
from grpo_cli.process.watchdog import COLLECTIVE, phase
from grpo_cli.trainer.layout import layout_problem


def is_fsdp(accelerator) -> bool:
    return accelerator.distributed_type.name == "FSDP"


def is_deepspeed(accelerator) -> bool:
    return accelerator.distributed_type.name == "DEEPSPEED"


def process_rows(accelerator, recipe) -> range:
    """This process's contiguous slice of the B*G completion rows; SetupError when the launch and the recipe
    do not fit together."""
    acc, world = accelerator, int(os.environ.get("WORLD_SIZE", "1"))
    asked = [name for env, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed"))
             if os.environ.get(env, "false").lower() == "true"]
    if world != acc.num_processes or (asked and acc.distributed_type.name not in ("FSDP", "DEEPSPEED")):
        # e.g. an FSDP config launched on a CPU-only machine: accelerate would train WORLD_SIZE unrelated copies
        raise SetupError(
            f"{world} processes were launched with {' + '.join(asked) or 'a distributed config'}, but accelerate "
            f"set up {acc.num_processes} process(es) of type {acc.distributed_type.name}; FSDP and DeepSpeed need "
            "GPUs: on CPU use `grpo train --num-processes N` (DDP over gloo)"
        )
    P, N = acc.num_processes, recipe.generation_batch_size
    if (problem := layout_problem(recipe, P)) is not None:
        raise SetupError(problem)
    return range(acc.process_index * (N // P), (acc.process_index + 1) * (N // P))


class Collectives:
    """The run's processes as grpo_cli.datatypes.Processes: counts, and the collectives a step needs. With one
    process every collective returns its input unchanged."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.count, self.index = accelerator.num_processes, accelerator.process_index
        self.is_main = accelerator.is_main_process

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every process's `x`, concatenated in process order, on the CPU (x itself with one process)."""
        if self.count == 1:
            return x
        with phase(f"{COLLECTIVE}gather"):
            return self.accelerator.gather(x.to(self.accelerator.device)).cpu()

    def gather_rows(self, rows: list) -> list:
        """Every process's list (picklable objects), concatenated in process order."""
        if self.count == 1:
            return rows
        from accelerate.utils import gather_object

        with phase(f"{COLLECTIVE}gather objects"):
            return gather_object(rows)

    def gather_ragged(self, x: torch.Tensor) -> torch.Tensor:
        """Every process's 1-D `x`, of any lengths, concatenated in process order on the CPU (x itself with one
        process): the lengths go first, then each part padded to the longest."""
        if self.count == 1:
            return x
        lengths = self.gather(torch.tensor([x.numel()])).tolist()
        padded = torch.zeros(max(lengths), dtype=x.dtype, device=x.device)
        padded[: x.numel()] = x
        every = self.gather(padded).view(self.count, -1)
        return torch.cat([every[i, :n] for i, n in enumerate(lengths)])

    def total(self, x: float) -> float:
        return self.gather(torch.tensor([float(x)])).sum().item()

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any process (e.g. a signal that reached one of them)."""
        return bool(self.gather(torch.tensor([float(flag)])).max()) if self.count > 1 else flag

    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `x` over processes, on the CPU."""
        if self.count == 1:
            return x
        with phase(f"{COLLECTIVE}sum"):
            return self.accelerator.reduce(x.to(self.accelerator.device), reduction="sum").cpu()


def full_optimizer_state(model, optimizer) -> dict:
    """FSDP2: AdamW state of every parameter, keyed by parameter name, on the main process (collective)."""
    import copy

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # deepcopy: the `step` tensors returned alias the live optimizer's, which the next step increments
    return copy.deepcopy(get_optimizer_state_dict(model, optimizer.optimizer, options=options))


def load_full_optimizer_state(model, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer.optimizer, state, options=StateDictOptions(full_state_dict=True))
