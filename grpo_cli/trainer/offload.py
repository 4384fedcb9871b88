"""The optimizer's state in host memory (train.offload_optimizer): ZeRO-Offload's trade for one process's optimizer.

AdamW keeps two moments per trained weight, twice the weights' bytes, on the device for the whole run; a GPU step
reads them once. `HostOptimizer` keeps them, and a copy of the weights it steps, in host memory: each optimizer step
copies the gradients down, steps the optimizer there and copies the weights back. The update is the optimizer's own
(the same class and settings, run on the host's kernels); its state dict is the plain optimizer's, so a checkpoint
written with the offload loads without it and the other way round. The device keeps weights, gradients and
activations; the price is a step's host-device traffic (the gradients down, the weights up) and the host's step."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from grpo_cli.process.memory import host_available_bytes
from grpo_cli.recipe.specs import OPTIMIZERS


HOST_ROOM = 5  # auto offloads where the host has this many times the trained weights' bytes available: its copy of
# them, of their gradients, AdamW's two moments, and a share for everything else


def offloads(train, lora: bool, device_type: str, processes: int, sharded: bool, trained_bytes: float) -> bool:
    """Whether train.offload_optimizer puts the optimizer in host memory. auto: where it frees a GPU's memory and
    costs the host little: full fine-tuning (LoRA's state is small) on CUDA by one process (each process would
    keep its own host copy of the state), not sharded (FSDP and DeepSpeed offload their own), with AdamW, and
    HOST_ROOM x `trained_bytes` of host memory available."""
    if train.offload_optimizer != "auto":
        return bool(train.offload_optimizer)
    spec = OPTIMIZERS[train.optimizer]  # a state at least the weights' size, and a step the host can take
    if not (device_type == "cuda" and processes == 1 and not sharded and not lora and spec.host_step
            and spec.state_widths >= 1):
        return False
    available = host_available_bytes()
    return available is None or available >= HOST_ROOM * trained_bytes


class HostOptimizer(torch.optim.Optimizer):
    """`build(host_params)` -> the optimizer to run in host memory, over host copies of `params` (pinned where the
    weights are on CUDA, so the copies run without staging). Its parameter groups are the inner optimizer's, over
    the device's tensors: a schedule or a caller that changes a group's learning rate changes the step's."""

    def __init__(self, params: Iterable[torch.Tensor], build: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
        params = list(params)
        pin = any(p.device.type == "cuda" for p in params)
        self.host = [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin) for p in params]
        self.grads = [torch.empty_like(h, pin_memory=pin) for h in self.host]
        with torch.no_grad():
            for h, p in zip(self.host, params):
                h.copy_(p)
        self.inner = build(self.host)
        index = {id(h): i for i, h in enumerate(self.host)}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [params[index[id(h)]] for h in g["params"]]} for g in self.inner.param_groups]
        super().__init__(groups, self.inner.defaults)
        self._pairs = [(p, self.host[index[id(h)]], self.grads[index[id(h)]])
                       for g, ig in zip(self.param_groups, self.inner.param_groups) for p, h in zip(g["params"],
                                                                                                   ig["params"])]

    def _sync_groups(self) -> None:
        """The groups' settings (a schedule's learning rate) onto the inner optimizer's groups."""
        for g, ig in zip(self.param_groups, self.inner.param_groups):
            ig.update({k: v for k, v in g.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("train.offload_optimizer steps without a closure (the loss is computed on the device)")
        self._sync_groups()
        stepped = []
        for p, h, g in self._pairs:  # a weight without a gradient is not stepped, as the plain optimizer skips it
            if p.grad is None:
                h.grad = None
                continue
            g.copy_(p.grad, non_blocking=True)
            h.grad = g
            stepped.append((p, h))
        if any(p.device.type == "cuda" for p, _ in stepped):
            torch.cuda.synchronize()  # the gradients are in host memory (and last step's weight copies are done)
        self.inner.step()
        for p, h in stepped:  # asynchronous from pinned memory; the device's next use of p is queued after it
            p.copy_(h, non_blocking=True)
        return None

    def state_dict(self) -> dict:
        self._sync_groups()
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """A plain optimizer's state dict (moved to host memory by the inner optimizer's own loader); the groups'
        settings come with it, as they do for the plain optimizer."""
        self.inner.load_state_dict(state_dict)
        for g, ig in zip(self.param_groups, self.inner.param_groups):
            g.update({k: v for k, v in ig.items() if k != "params"})
