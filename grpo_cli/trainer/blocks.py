"""The trained weights' gradients and AdamW's two moments in one block of memory each, made once (CPU).

glibc's malloc serves a block below its mmap threshold (32 MiB under train.keep_freed_memory, process/allocator.py)
from its heap, and what the heap has held stays resident, free or not. A step made every weight's gradient anew in
its backward, between the micro-batch's activations (torch's zero_grad sets them to None after the optimizer step),
and AdamW made its moments at the first optimizer step in the heap the first backward had grown: bench/vs_trl.py's
SmolLM2 run held a 2.05 GiB heap at its peak for 1.75 GiB live, the rest freed pieces no later block fitted. Here
each is one block above the threshold, a mapping of its own that is never part of the heap:

- a trained weight's gradient, when a backward makes it (algo/head_gradient.kept_gradient: the linear layers, the
  chunked LM head and the embedding add into it in place), is its zeroed view of the gradient block
  (`head_gradient.GRADIENT_HOMES`). A weight no part of a step reaches still has no gradient (zero_grad's None keeps
  its meaning: AdamW skips that weight); one whose gradient autograd makes (a norm's, a bias) keeps its own tensor.
- AdamW's state of every trained weight is made at its first step, just before it, as that step would make it
  (`step` 0 and the two moments at zero: the same numbers), the moments as views of two blocks; a checkpoint's state,
  once loaded, is copied into them (`moment_blocks` again) and the loaded tensors' memory goes back to the system.

The gradient block only where an optimizer step takes more than one micro-batch, so that the gradients outlive
a micro-batch's activations anyway; with one, they are dead between steps and the heap gives their memory to the next
forward's activations (the quickstart's peak: 3.13 GiB that way, 3.20 with the block). CPU only (a GPU's caching
allocator reuses its blocks by size), and not where FSDP or DeepSpeed own the gradients and the optimizer.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch

from grpo_cli.algo.head_gradient import GRADIENT_HOMES
from grpo_cli.process.allocator import return_freed_memory

ADAM = (torch.optim.AdamW, torch.optim.Adam)
_IN_BLOCKS: weakref.WeakSet = weakref.WeakSet()  # the optimizers whose state lives in blocks (`moments_in_blocks`)
_PLACED: weakref.WeakSet = weakref.WeakSet()  # ... and is there now (`moment_blocks` ran)


def blocks_of(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """One uninitialized block per (device, dtype) of `params` -> a view of the weight's shape in it for each weight
    (pages are touched when first written)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        groups[(p.device, p.dtype)].append(i)
    views: list[torch.Tensor | None] = [None] * len(params)
    for (device, dtype), members in groups.items():
        block = torch.empty(sum(params[i].numel() for i in members), dtype=dtype, device=device)
        offset = 0
        for i in members:
            n = params[i].numel()
            views[i] = block[offset:offset + n].view(params[i].shape)
            offset += n
    return views


def gradient_block(params: list[torch.Tensor]) -> int:
    """Give every weight of `params` its gradient's home in one block; -> the block's bytes."""
    for p, home in zip(params, blocks_of(params)):
        GRADIENT_HOMES[p] = home
    return sum(p.numel() * p.element_size() for p in params)


def moment_blocks(optimizer: torch.optim.Optimizer) -> int:
    """AdamW's (or Adam's) state of every weight it trains in two (with amsgrad three) blocks: made as its first step
    makes it where the weight has none, copied in where it has (a loaded checkpoint's); -> the blocks' bytes (0 for
    another optimizer)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    if type(inner) not in ADAM:
        return 0
    _PLACED.add(inner)
    pairs = [(p, g) for g in inner.param_groups for p in g["params"]]
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if any(g["amsgrad"] for g in inner.param_groups) else (
        "exp_avg", "exp_avg_sq")
    homes = {name: blocks_of([p for p, _ in pairs]) for name in names}
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # torch's for `step`
    for i, (p, group) in enumerate(pairs):
        state = inner.state[p]
        if "step" not in state:  # as Adam's first step makes it: on the weight's device where fused or capturable
            on_device = group["fused"] or group["capturable"]
            state["step"] = torch.zeros((), dtype=scalar, device=p.device if on_device else "cpu")
        for name in names:
            home = homes[name][i]
            if name in state:
                home.copy_(state[name])
            else:
                home.zero_()
            state[name] = home
    return sum(p.numel() * p.element_size() for p, _ in pairs) * len(names)


def moments_in_blocks(optimizer: torch.optim.Optimizer) -> bool:
    """AdamW's state into blocks (`moment_blocks`) at its first step, not before: an optimizer that never steps keeps
    no state, as AdamW's own (a run whose every step was skipped saves none); -> whether it will (AdamW, Adam)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if type(inner) not in ADAM:
        return False
    _IN_BLOCKS.add(inner)

    def first_step(opt, args, kwargs) -> None:
        if opt not in _PLACED:
            moment_blocks(opt)

    inner.register_step_pre_hook(first_step)
    return True


def after_load(optimizer: torch.optim.Optimizer) -> None:
    """A checkpoint's optimizer state was loaded (as tensors of their own): into blocks again where it lives in
    blocks, and the loaded tensors' memory back to the system."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if inner in _IN_BLOCKS and inner.state:
        moment_blocks(inner)
        return_freed_memory()
