"""The table of advantage estimators, torch-free: the schema's `algorithm.advantage_estimator` choices, the rule
each puts on `algorithm.scale_rewards`, and what the docs say of each, all read from here; the math is
algo/advantages.py's `ESTIMATORS` entry of the same name. Adding an estimator is one `EstimatorSpec` here and one
function there (docs/development.md)."""

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
    EstimatorSpec("grpo", "the mean reward of its group, divided by scale_rewards' std", "DeepSeekMath arXiv:2402.03300"),
    EstimatorSpec("rloo", "the mean reward of the other completions of its group (leave-one-out), divided by "
                  "scale_rewards' std (none: the paper's)", "RLOO, Ahmadian et al. arXiv:2402.14740", aggregates=False),
    EstimatorSpec("reinforce_plus_plus_baseline", "the mean reward of its group, then whitened over the batch (the "
                  "batch's mean and std of those differences)", "REINFORCE++, Hu et al. arXiv:2501.03262",
                  scale="batch", aggregates=False),
)}
