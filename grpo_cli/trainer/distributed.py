"""Processes: how a generation batch's rows split over them, the collectives the loop needs, and what FSDP
and DeepSpeed need done their way. Every function takes the run's accelerate `Accelerator`."""

from __future__ import annotations

import os

import torch

from grpo_cli.errors import SetupError
from grpo_cli.process.watchdog import COLLECTIVE, phase
from grpo_cli.rewards.scoring import ranks_groups


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


def layout_problem(recipe, P: int) -> str | None:
    """Why the recipe's completion rows cannot be dealt to `P` processes, or None: checked by every process
    (`process_rows`) and, with `grpo train --num-processes P`, before the processes are launched."""
    N, mbs, k, G = (recipe.generation_batch_size, recipe.train.micro_batch_size, recipe.train.mini_batches,
                    recipe.algorithm.num_generations)
    if N % P or (N // P) % mbs:
        return (f"prompts_per_step * num_generations = {N} completions must split evenly over {P} processes "
                f"into micro-batches of train.micro_batch_size = {mbs}")
    ranked = [s.name for s in recipe.rewards if ranks_groups(s.name, s.kwargs)]
    if ranked and (N // P) % G:  # contiguous slices of whole groups need a multiple of G rows each
        return (f"reward {ranked[0]!r} ranks each prompt's {G} completions together, but {N // P} rows a process would "
                f"split a group over processes (each part ranked alone); make prompts_per_step * num_generations / "
                f"processes a multiple of {G}: train.prompts_per_step a multiple of {P}")
    if not splits_into_mini_batches(N // P, k, mbs):
        return (f"the {N // P} completions of each of {P} process(es) must split into train.mini_batches = {k} equal "
                f"mini-batches of whole micro-batches of train.micro_batch_size = {mbs}")
    if recipe.rollout.max_staleness and P > 1:
        return (f"rollout.max_staleness runs one trainer process for now ({P} were launched); "
                "the server side scales with `grpo serve-vllm --tp N`")
    return None


def splits_into_mini_batches(rows: int, mini_batches: int, micro_batch_size: int) -> bool:
    """Whether a process's `rows` split into `mini_batches` equal mini-batches of whole micro-batches (of
    `micro_batch_size` rows, or one micro-batch of a smaller mini-batch)."""
    mini = rows // mini_batches
    return rows % mini_batches == 0 and mini > 0 and mini % min(micro_batch_size, mini) == 0


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
