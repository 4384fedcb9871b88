"""Non-finite steps: an optimizer step whose loss or gradient is NaN or infinite on any process is skipped on every
process, as DeepSpeed's and torch.amp's loss scalers skip an overflowed step; the weights, AdamW's moments and the
learning-rate schedule stay as they were. Each skip is counted (nonfinite/skipped_updates), named in a warning
line (the first non-finite quantity: the loss, or the first parameter whose gradient is not finite, with the
step's largest reward and advantage beside it), and train.max_nonfinite_steps steps in a row with a skip stop the
run with an error: past that the weights themselves are usually the cause, and the last checkpoint is intact.

A checkpoint is never written with non-finite weights (`check_weights`, before the save): a finite update can
still overflow float32 (a learning rate of 1e39).

Where the check runs: each process looks at its own loss and at the gradient of every parameter before clipping
(a per-parameter norm, one pass over the gradients); one collective makes the decision the same everywhere.
Under fp16 mixed precision the gradients are scaled: their overflow is the loss scaler's to skip (it lowers the
scale), and only a non-finite loss counts here. DeepSpeed steps its engine inside the backward, so there only
the loss is checked, after the fact, and the run stops at the limit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from grpo_cli.datatypes import Processes, StepBatch
from grpo_cli.errors import CheckpointError, NonFiniteError
from grpo_cli.models.finite import nonfinite_grad, nonfinite_weights, word
from grpo_cli.run.checkpoints import latest_checkpoint


def largest(s: StepBatch, adv: torch.Tensor) -> str:
    """The step's largest reward (and which function gave it) and largest advantage: where a huge value came from."""
    parts = []
    values = s.per_function.abs().nan_to_num(nan=-1.0)  # [N, K]
    if values.numel():
        k = int(values.max(dim=0).values.argmax())
        name = list(s.rewards.per_function)[k]
        parts.append(f"largest |reward| {s.per_function[:, k].abs().nan_to_num(nan=0).max().item():.3g} from reward "
                     f"{name!r}")
    if adv.numel():
        parts.append(f"largest |advantage| {adv.abs().nan_to_num(nan=0).max().item():.3g}")
    return "; ".join(parts)


class NonFiniteSteps:
    """The skip decision of every optimizer step, and the run's count of them (saved with the run's state)."""

    def __init__(self, limit: int | None, procs: Processes, *, check_grads: bool = True) -> None:
        """`check_grads`: False where the gradients are not this process's to read unscaled (fp16's loss scaler,
        DeepSpeed's engine); the loss is checked still."""
        self.limit, self.procs, self.check_grads = limit, procs, check_grads
        self.in_a_row, self.total, self.first_in_row = 0, 0, 0
        self.reasons: list[str] = []  # this step's skipped optimizer steps: why (every process's, in process order)

    def new_step(self) -> None:
        self.reasons = []

    def skip(self, loss: str | None, named: list[tuple[str, torch.Tensor]]) -> bool:
        """Whether to skip this optimizer step (a collective with several processes): `loss` says why this process's
        loss is not finite (None: it is)."""
        why = loss or (nonfinite_grad(named) if self.check_grads else None)
        if self.procs.count > 1:
            every = self.procs.gather_rows([why]) if self.procs.any(why is not None) else [None]
            whys = [f"{w} on process {i}" for i, w in enumerate(every) if w is not None]
        else:
            whys = [why] if why is not None else []
        if whys:
            self.reasons.append(", ".join(whys))
        return bool(whys)

    def overflowed(self, norm: float) -> bool:
        """The global gradient norm is not finite though every gradient was (it overflowed float32): skip too. The
        norm is the same on every process, so is the decision."""
        if math.isfinite(norm):
            return False
        self.reasons.append(f"the gradient norm is {word(norm)} (every parameter's gradient finite)")
        return True

    def end_step(self, step: int) -> dict[str, float]:
        """The step's counts as metrics; the run's count of steps in a row with a skip moves on."""
        skipped = len(self.reasons)
        if skipped:
            if not self.in_a_row:
                self.first_in_row = step
            self.in_a_row += 1
        else:
            self.in_a_row = 0
        self.total += skipped
        return {"nonfinite/skipped_updates": skipped, "nonfinite/skipped_total": self.total}

    def warning(self, step: int, optimizer_steps: int, context: str) -> str | None:
        """The step's warning line, or None when nothing was skipped."""
        if not self.reasons:
            return None
        n = len(self.reasons)
        which = "the optimizer step" if optimizer_steps == 1 else f"{n} of {optimizer_steps} optimizer steps"
        return f"step {step}: skipped {which} (weights unchanged): {'; '.join(self.reasons)}" + (
            f" ({context})" if context else "")

    def stop_if_over(self, step: int, run_dir: Path) -> None:
        """NonFiniteError once train.max_nonfinite_steps steps in a row had a skipped update."""
        if self.limit is None or self.in_a_row < self.limit:
            return
        span = f"step {step}" if self.in_a_row == 1 else f"steps {self.first_in_row}-{step}"
        last = latest_checkpoint(run_dir)
        kept = f"the last checkpoint ({last.name}) is intact" if last is not None else "no checkpoint was written"
        raise NonFiniteError(
            f"stopped: {self.in_a_row} steps in a row ({span}) had a non-finite loss or gradient and their updates "
            f"were skipped (train.max_nonfinite_steps: {self.limit}); {kept}. Lower train.learning_rate, keep "
            "train.max_grad_norm set, or check the rewards' scale (with algorithm.scale_rewards none they are the "
            "advantages); then resume with --resume auto --allow-recipe-change")

    def state_dict(self) -> dict[str, Any]:
        return {"in_a_row": self.in_a_row, "first_in_row": self.first_in_row, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.in_a_row, self.first_in_row, self.total = state["in_a_row"], state["first_in_row"], state["total"]


def check_weights(model: torch.nn.Module, procs: Processes, step: int) -> None:
    """CheckpointError naming the first parameter with a NaN or infinite value on any process, before a save."""
    bad = nonfinite_weights(model)
    every = procs.gather_rows([bad]) if procs.count > 1 else [bad]
    found = [f"{b} (process {i})" if procs.count > 1 else b for i, b in enumerate(every) if b is not None]
    if found:
        raise CheckpointError(
            f"not saving checkpoint step-{step}: the weights are not finite: {found[0]}; the last checkpoint is "
            "intact. The update overflowed float32: lower train.learning_rate, then resume with --resume auto "
            "--allow-recipe-change")
