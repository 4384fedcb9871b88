"""The tables of advantage estimators and optimizers, torch-free: the schema's choices
(`algorithm.advantage_estimator`, `train.optimizer`), their rules, the doctor's memory plan and the docs read them
from here; the math is algo/advantages.py's `ESTIMATORS` entry of the same name, an optimizer's builder
trainer/setup.py's `OPTIMIZER_BUILDERS` entry. Adding one is a spec here and a function there (docs/development.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    baseline: str  # what each completion's reward is compared with, in words
    paper: str
    scale: str | None = None  # the algorithm.scale_rewards it takes (its own normalisation); None: any
    aggregates: bool = True  # takes multi_objective_aggregation normalize_then_sum (GDPO normalises per function)


ESTIMATORS = {s.name: s for s in (
    EstimatorSpec("grpo", "the mean reward of its group, divided by scale_rewards' std",
                  "DeepSeekMath arXiv:2402.03300"),
    EstimatorSpec("rloo", "the mean reward of the other completions of its group (leave-one-out), divided by "
                  "scale_rewards' std (none: the paper's)", "RLOO, Ahmadian et al. arXiv:2402.14740", aggregates=False),
    EstimatorSpec("reinforce_plus_plus_baseline", "the mean reward of its group, then whitened over the batch (the "
                  "batch's mean and std of those differences)", "REINFORCE++, Hu et al. arXiv:2501.03262",
                  scale="batch", aggregates=False),
)}


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer keeps and needs, for the schema's choices and the doctor's memory plan (the builders are
    trainer/setup.py's `OPTIMIZER_BUILDERS`, under the same names)."""

    name: str
    what: str
    state_widths: float = 0.0  # state per trained parameter, in weights' widths (AdamW: two moments)
    state_bytes: float = 0.0  # or in bytes, whatever the weights' width (8-bit moments)
    foreach_on_cuda: bool = False  # its step's temporaries on CUDA: one copy of every trained tensor at once
    step_largest: float = 0.0  # else: copies of the largest trained tensor (one tensor at a time)
    needs_cuda: bool = False


OPTIMIZERS = {s.name: s for s in (
    OptimizerSpec("adamw", "torch's (fused where it can)", state_widths=2, foreach_on_cuda=True, step_largest=2),
    OptimizerSpec("adafactor", "transformers' (factored second moments: far less memory, fixed learning rate here)",
                  state_widths=0.1, step_largest=3),
    OptimizerSpec("adamw_8bit", "bitsandbytes' 8-bit moments (1/4 of AdamW's state)", state_bytes=2),
    OptimizerSpec("paged_adamw_8bit", "bitsandbytes' 8-bit moments, paged: spills to host memory", state_bytes=2,
                  needs_cuda=True),
)}
