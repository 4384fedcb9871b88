"""A run's state beyond the model, across processes: what `Engine.save` gathers into a checkpoint (every
process's RNGs and generator counters, the rollouts in flight, FSDP's full optimizer state) and what a resume
puts back where it belongs. The files themselves are checkpoint.py's."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from grpo_cli.train.distributed import full_optimizer_state, is_deepspeed, is_fsdp, load_full_optimizer_state


def save_run(run_dir: Path, step: int, accelerator, model, optimizer, scheduler, tokenizer, recipe, stream, generator,
             pipeline, *, sharded: bool, say, ref_model=None, ref_syncs: int = 0, reward_models=()) -> None:
    """Checkpoint step `step` (collective: every process calls it; the main one writes). `ref_model`: a reference
    refreshed `ref_syncs` times (algorithm.sync_ref_model), which is no longer the base model, so it is saved.
    `reward_models`: the updaters of rewards[].update (their buffers; their weights once trained)."""
    from accelerate.utils import gather_object

    from grpo_cli.run.checkpoints import save_checkpoint
    from grpo_cli.run.statefiles import rng_state
    from grpo_cli.models.lora import BASE_MODEL, base_identity, is_peft_model
    from grpo_cli.recipe.schema import recipe_to_yaml

    several = accelerator.num_processes > 1
    rng_per_rank = gather_object([rng_state()]) if several else [rng_state()]  # each process samples with its own
    in_flight = pipeline.state() if pipeline is not None else None  # waits for them (one process)
    generators = gather_object([generator.state_dict()]) if several else [generator.state_dict()]
    # sharded: every process takes part in gathering the full weights and optimizer state to the main one
    weights = accelerator.get_state_dict(model) if sharded else None
    optimizer_state = full_optimizer_state(model, optimizer) if is_fsdp(accelerator) else None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        policy = accelerator.unwrap_model(model)
        extra = {BASE_MODEL: base_identity(policy, recipe.model)} if is_peft_model(policy) else {}
        state = {"step": step, "data": stream.state_dict(), "rng_per_rank": rng_per_rank, "generator_per_rank": generators}
        if in_flight is not None:
            state["in_flight"] = in_flight
        tensors = {}
        if ref_model is not None:
            state["ref_model_syncs"] = ref_syncs
            tensors["ref_model"] = dict(ref_model.named_parameters())
        if reward_models:
            state["reward_models"] = {u.key: u.state_dict() for u in reward_models}
            tensors |= {u.key: u.tensors() for u in reward_models if u.updates}
        path = save_checkpoint(
            run_dir, step, model=policy, tokenizer=tokenizer, extra_json=extra, state_dict=weights,
            optimizer_state=optimizer_state, optimizer=None if is_deepspeed(accelerator) else optimizer,
            scheduler=scheduler, recipe_yaml=recipe_to_yaml(recipe), trainer_state=state,
            keep_last=recipe.checkpoint.keep_last,
            trainer_tensors=tensors or None,
        )
        say(f"saved {path}")
    accelerator.wait_for_everyone()


def restore_run(checkpoint: Path, accelerator, model, optimizer, scheduler, stream, generator, *, changes: set[str],
                train, ref_model=None) -> tuple[int, dict]:
    """Optimizer, scheduler, data position, this process's RNGs and generator counter (and a refreshed reference
    model's weights) from `checkpoint`; the optimizer settings the resume changed (--allow-recipe-change) then
    take effect. -> (step, trainer state)."""
    from grpo_cli.run.checkpoints import CheckpointError, load_training_state
    from grpo_cli.run.folder import apply_optimizer_changes

    acc = accelerator
    state = load_training_state(
        checkpoint, optimizer=None if is_deepspeed(acc) else optimizer, scheduler=scheduler,
        load_optimizer=partial(load_full_optimizer_state, model, optimizer) if is_fsdp(acc) else None,
        rank=acc.process_index, world=acc.num_processes,
    )
    apply_optimizer_changes(optimizer, scheduler, changes, train)
    if is_deepspeed(acc):
        import logging

        logging.getLogger(__name__).warning(
            "DeepSpeed: AdamW moments restart from zero on resume (checkpoints do not hold its ZeRO optimizer "
            "state: it contains Python objects, and grpo loads nothing it would have to unpickle)")
    try:
        stream.load_state_dict(state["data"])
    except ValueError as e:  # e.g. --allow-recipe-change to a smaller dataset
        raise CheckpointError(f"{checkpoint}: {e}; resume with the data the run trained on") from None
    step = int(state["step"])
    if state.get("ref_model_syncs") and ref_model is not None:
        from grpo_cli.run.checkpoints import load_trainer_tensors

        saved = load_trainer_tensors(checkpoint, "ref_model")
        with torch.no_grad():
            for name, p in ref_model.named_parameters():
                p.copy_(saved[name])
    generators = state.get("generator_per_rank") or []
    if len(generators) == acc.num_processes:  # request seeds continue where they were
        generator.load_state_dict(generators[acc.process_index])
    if not state["rng_restored"] and acc.num_processes > 1:  # resumed on another process count: fresh streams
        torch.manual_seed(train.seed + acc.process_index + 1000 * step)
    return step, state
