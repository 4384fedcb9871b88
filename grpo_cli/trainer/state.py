"""A run's state across processes, saved and restored by name: every stateful part (the optimizer, the
scheduler, the data stream, each process's RNGs and sampling counters, the reference, the reward models, the
batches in flight) goes through `state_dict` / `load_state_dict`; the policy's weights are the checkpoint's
model folder. A save is collective (FSDP gathers the full weights and optimizer state, the pipeline waits for
its batches) and the main process writes; the files are grpo_cli/run/checkpoints.py's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from grpo_cli.datatypes import Processes
from grpo_cli.errors import CheckpointError
from grpo_cli.models.lora import BASE_MODEL, base_identity, is_peft_model
from grpo_cli.recipe.files import recipe_to_yaml
from grpo_cli.run.checkpoint_io import load_trainer_tensors, load_training_state, save_checkpoint
from grpo_cli.run.folder import apply_optimizer_changes
from grpo_cli.run.statefiles import rng_state, set_rng_state
from grpo_cli.trainer.blocks import after_load
from grpo_cli.trainer.distributed import full_optimizer_state, is_deepspeed, is_fsdp, load_full_optimizer_state

FILE_PARTS = ("optimizer", "scheduler")  # parts with files of their own (trainer/optimizer.json, scheduler.json)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class ProcessRNG:
    """Every RNG this process draws from: python `random`, numpy's legacy generator, torch CPU and CUDA. Restored
    by the checkpoint reader itself (grpo_cli/run/statefiles.restore_rng), which also reads older layouts."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)


class OptimizerState:
    """The optimizer as a part: FSDP's sharded state gathered in full (collective), DeepSpeed's not saved (its ZeRO
    state holds Python objects, and grpo loads nothing it would have to unpickle)."""

    def __init__(self, accelerator, model, optimizer) -> None:
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer

    def state_dict(self) -> dict | None:
        if is_deepspeed(self.accelerator):
            return None
        return full_optimizer_state(self.model, self.optimizer) if is_fsdp(self.accelerator) else self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if is_fsdp(self.accelerator):
            load_full_optimizer_state(self.model, self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)
            after_load(self.optimizer)  # AdamW's moments into their blocks again (trainer/blocks.py)


@dataclass
class RunState:
    """The stateful parts of a run by the name each is saved under (trainer_state.json's keys, or a file's)."""

    parts: dict[str, Stateful]  # one state for the run (the main process's is saved; every process restores it)
    per_process: dict[str, Stateful] = field(default_factory=dict)  # each process its own, saved in process order


def save_run(run_dir: Path, step: int, procs: Processes, accelerator, *, policy, tokenizer, recipe, state: RunState,
             sharded: bool, say) -> None:
    """Checkpoint step `step` (collective: every process calls it; the main one writes)."""
    per_process = {name: procs.gather_rows([part.state_dict()]) for name, part in state.per_process.items()}
    weights = accelerator.get_state_dict(policy) if sharded else None  # every process takes part in gathering
    parts = {name: part.state_dict() for name, part in state.parts.items()}  # FSDP's optimizer: after the weights
    accelerator.wait_for_everyone()
    if procs.is_main:
        model = accelerator.unwrap_model(policy)
        extra = {BASE_MODEL: base_identity(model, recipe.model)} if is_peft_model(model) else {}
        optimizer_state, scheduler_state = (parts.pop(name, None) for name in FILE_PARTS)
        path = save_checkpoint(
            run_dir, step, model=model, tokenizer=tokenizer, extra_json=extra, state_dict=weights,
            optimizer=None, optimizer_state=optimizer_state, scheduler=None, scheduler_state=scheduler_state,
            recipe_yaml=recipe_to_yaml(recipe), trainer_state={"step": step, **per_process, **parts},
            keep_last=recipe.checkpoint.keep_last,
        )
        say(f"saved {path}")
    accelerator.wait_for_everyone()


def restore_run(checkpoint: Path, procs: Processes, state: RunState, *, changes: set[str], train) -> int:
    """Every part of `state` from `checkpoint` (this process's own per-process parts), then the optimizer settings
    the resume changed (--allow-recipe-change); -> the checkpoint's step."""
    optimizer, scheduler = (state.parts.get(name) for name in FILE_PARTS)
    deepspeed = isinstance(optimizer, OptimizerState) and is_deepspeed(optimizer.accelerator)
    saved = legacy_parts(checkpoint, load_training_state(
        checkpoint, optimizer=None if deepspeed else optimizer, scheduler=scheduler, rank=procs.index, world=procs.count))
    if optimizer is not None:
        apply_optimizer_changes(getattr(optimizer, "optimizer", optimizer), scheduler, changes, train)
    if deepspeed:
        logging.getLogger(__name__).warning(
            "DeepSpeed: AdamW moments restart from zero on resume (checkpoints do not hold its ZeRO optimizer "
            "state: it contains Python objects, and grpo loads nothing it would have to unpickle)")
    for name, part in state.parts.items():
        if name in FILE_PARTS or name not in saved:
            continue
        try:
            part.load_state_dict(saved[name])
        except ValueError as e:  # e.g. --allow-recipe-change to a smaller dataset
            raise CheckpointError(f"{checkpoint}: {e}; resume with the data the run trained on") from None
    for name, part in state.per_process.items():
        every = saved.get(name) or []
        if name != "rng_per_rank" and len(every) == procs.count:  # e.g. request seeds continue where they were
            part.load_state_dict(every[procs.index])
    step = int(saved["step"])
    if not saved["rng_restored"] and procs.count > 1:  # resumed on another process count: fresh streams
        torch.manual_seed(train.seed + procs.index + 1000 * step)
    return step


def legacy_parts(checkpoint: Path, saved: dict) -> dict:
    """Checkpoints written before the run's state was saved by part name: the refresh count of the reference was
    `ref_model_syncs`, and a reward model's part did not name its weights file (the files are the same)."""
    if "ref_model" not in saved and saved.get("ref_model_syncs"):
        saved["ref_model"] = {"syncs": saved["ref_model_syncs"], "weights": load_trainer_tensors(checkpoint, "ref_model")}
    for key, rm in (saved.get("reward_models") or {}).items():
        if rm.get("updates") and "weights" not in rm:
            rm["weights"] = load_trainer_tensors(checkpoint, key)
    return saved
