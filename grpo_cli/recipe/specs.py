"""The tables of loss types, advantage estimators and optimizers, torch-free: the schema's choices
(`algorithm.loss_type`, `algorithm.advantage_estimator`, `train.optimizer`), their rules, the losses, the doctor's
memory plan and the docs read them from here; the math is algo/losses.py's `OBJECTIVES` and `AGGREGATIONS` entries a
loss names and algo/advantages.py's `ESTIMATORS` entry of an estimator's name, an optimizer's builder
trainer/setup.py's `OPTIMIZER_BUILDERS` entry. Adding one is a spec here and a function there (docs/development.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossSpec:
    """A loss type: the per-token objective and the aggregation it is made of, and what follows from them."""

    name: str
    objective: str  # algo/losses.py's OBJECTIVES entry: clipped, cispo, sapo, vespo
    aggregation: str  # algo/losses.py's AGGREGATIONS entry
    what: str  # in words, with its paper
    takes_sampler_weights: bool = False  # folds the sampler's per-token correction in (else it multiplies the loss)
    level: str | None = None  # the algorithm.importance_sampling_level it is defined on (None: either)
    level_reason: str = ""  # why, for the recipe's error
    weight_cap: float | None = None  # epsilon_high caps the importance weight itself (>= 1; this is the default)
    clips: bool = True  # reports clip_ratio/* (an objective without a trust region clips nothing)

    @property
    def global_token_mean(self) -> bool:
        """Every token of the whole generation batch weighs the same: the update counts the batch's active tokens over
        every process and micro-batch first."""
        return self.aggregation == "global_token_mean"


CISPO_CAP = 5.0  # TRL's suggested epsilon_high for cispo; MiniMax-M1 (arXiv:2506.13585) caps the IS weight itself
LOSSES = {s.name: s for s in (
    LossSpec("grpo", "clipped", "sequence_mean", "PPO's clip, the mean over sequences of each one's token mean "
             "(DeepSeekMath arXiv:2402.03300)"),
    LossSpec("bnpo", "clipped", "batch_token_mean", "PPO's clip, the token mean of the micro-batch"),
    LossSpec("dr_grpo", "clipped", "constant_length", "PPO's clip, the token sum over N x max_completion_length "
             "(Dr. GRPO arXiv:2503.20783)"),
    LossSpec("dapo", "clipped", "global_token_mean", "PPO's clip with clip-higher, the token mean of the whole "
             "generation batch (DAPO arXiv:2503.14476)"),
    LossSpec("cispo", "cispo", "global_token_mean", "the capped, detached importance weight times A log pi, as dapo's "
             "aggregation (MiniMax-M1 arXiv:2506.13585)", weight_cap=CISPO_CAP),
    LossSpec("sapo", "sapo", "sequence_mean", "a soft sigmoid gate instead of a clip, as grpo's aggregation (SAPO)"),
    LossSpec("luspo", "clipped", "sequence_sum_mean", "PPO's clip on GSPO's sequence ratio, each sequence's loss "
             "times its length (arXiv:2602.05261)", level="sequence",
             level_reason="GSPO's sequence-level objective with each sequence's loss scaled by its length "
             "(arXiv:2602.05261): TRL only warns and then trains a token-level ratio the paper does not describe"),
    LossSpec("vespo", "vespo", "global_token_mean", "a Gamma weight of the sequence ratio times A log pi, as dapo's "
             "aggregation (arXiv:2602.10693)", takes_sampler_weights=True, level="token",
             level_reason="it builds its own sequence-level weight from the token ratios", clips=False),
)}


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
    fusable: bool = False  # torch has a fused kernel of it (used where the device and the sharding allow)
    host_step: bool = False  # steps on the host's kernels: train.offload_optimizer can take it (trainer/offload.py)


OPTIMIZERS = {s.name: s for s in (
    OptimizerSpec("adamw", "torch's (fused where it can)", state_widths=2, foreach_on_cuda=True, step_largest=2,
                  fusable=True, host_step=True),
    OptimizerSpec("adafactor", "transformers' (factored second moments: far less memory, fixed learning rate here)",
                  state_widths=0.1, step_largest=3, host_step=True),
    OptimizerSpec("adamw_8bit", "bitsandbytes' 8-bit moments (1/4 of AdamW's state)", state_bytes=2),
    OptimizerSpec("paged_adamw_8bit", "bitsandbytes' 8-bit moments, paged: spills to host memory", state_bytes=2,
                  needs_cuda=True),
)}
