"""TRL's batch arithmetic in grpo's terms. TRL counts completions and micro-steps: a generation batch of
per_device_train_batch_size x steps_per_generation x processes completions, an optimizer step every
gradient_accumulation_steps micro-batches, the generation batch reused num_iterations times; its max_steps, save_steps
and warmup_steps count optimizer steps. grpo counts prompts and generation batches: a step is one generation batch,
split into train.mini_batches optimizer steps, mu = algorithm.num_iterations times."""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_cli.errors import ConversionError


@dataclass(frozen=True)
class Layout:
    prompts_per_step: int  # train.prompts_per_step: the generation batch's prompts
    micro_batch_size: int  # completions per forward
    mini_batches: int  # optimizer steps per generation batch and iteration
    optimizer_steps: int  # per grpo step: mini_batches x mu
    note: str

    def steps(self, trl_steps: int) -> int:
        """A count of TRL's optimizer steps in grpo's steps (rounded up: TRL's last generation batch is used)."""
        return math.ceil(trl_steps / self.optimizer_steps)


def layout(cfg: dict, num_processes: int) -> Layout:
    """The layout of a TRL GRPOConfig (as a dict of its fields) on `num_processes` processes; ConversionError where
    TRL's own arithmetic does not close."""
    G, mu = int(cfg["num_generations"]), int(cfg.get("num_iterations") or 1)
    per_device, accumulation = int(cfg["per_device_train_batch_size"]), int(cfg["gradient_accumulation_steps"])
    per_step = per_device * accumulation * num_processes  # one optimizer step's completions
    spg, generation = cfg.get("steps_per_generation"), cfg.get("generation_batch_size")
    if spg is not None and generation is not None:
        raise ConversionError("steps_per_generation and generation_batch_size are both set: TRL takes one of them")
    if generation is not None:
        if int(generation) % (per_device * num_processes):
            raise ConversionError(
                f"generation_batch_size ({generation}) is not a multiple of per_device_train_batch_size x processes "
                f"({per_device} x {num_processes})")
        spg = int(generation) // (per_device * num_processes)
    spg = accumulation if spg is None else int(spg)
    if spg % accumulation:
        raise ConversionError(
            f"steps_per_generation ({spg}) is not a multiple of gradient_accumulation_steps ({accumulation}): TRL "
            "would step the optimizer in the middle of a slice of the generation batch")
    k, completions = spg // accumulation, per_device * spg * num_processes
    if completions % G:
        raise ConversionError(f"{completions} completions per generation batch is not a multiple of num_generations "
                              f"({G})")
    prompts = completions // G
    note = (f"batch: TRL's generation batch = per_device_train_batch_size x steps_per_generation x processes = "
            f"{per_device} x {spg} x {num_processes} = {completions} completions = {prompts} prompts x G={G} -> "
            f"train.prompts_per_step: {prompts}, train.micro_batch_size: {per_device} (completions per forward)")
    note += (f"; an optimizer step every gradient_accumulation_steps = {accumulation} micro-batches ({per_step} "
             f"completions) -> train.mini_batches: {k}" if k > 1 else
             "; one optimizer step per generation batch (steps_per_generation = gradient_accumulation_steps)")
    if k * mu > 1:
        note += (f"; TRL's step counts (max_steps, save_steps) are optimizer steps: {k * mu} a grpo step "
                 f"(mini_batches {k} x num_iterations {mu})")
    return Layout(prompts, per_device, k, k * mu, note)
