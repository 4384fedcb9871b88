"""How a step's B*G completion rows are dealt to the run's processes: what a layout must satisfy, checked by every
process (trainer/distributed.py's `process_rows`) and by `grpo train --num-processes N` before it launches them
(trainer/launch.py); `grpo doctor` applies its mini-batch rule.

Importing this module must not import torch: the launcher stays a small process for the whole run.
"""

from __future__ import annotations

from grpo_cli.rewards.scoring import ranks_groups


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
