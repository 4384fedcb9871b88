"""The recipe's `algorithm` section: the group, the loss and its variants, the reference, the entropy bonus.
Never imports torch (grpo validate stays fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_cli.recipe.specs import CISPO_CAP, ESTIMATORS, LOSSES
from grpo_cli.recipe.section import Section

LossType = Literal[tuple(LOSSES)]  # type: ignore[valid-type]  (recipe/specs.py's table)
ScaleMode = Literal["group", "batch", "none"]
Estimator = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]  (recipe/specs.py's table)


class DynamicSamplingConfig(Section):
    enabled: bool = Field(
        False, description="DAPO dynamic sampling: groups whose G rewards are all equal (zero advantages: no signal) "
        "are dropped, and whole new generation batches are sampled until B groups with signal are collected.",
    )
    max_rounds: int = Field(
        4, ge=1, description="Most generation batches per step. When they hold fewer than B groups with signal, the "
        "batch is completed with groups without (earliest first) and frac_reward_zero_std says how many.",
    )


class AlgorithmConfig(Section):
    num_generations: int = Field(8, ge=2, description="G: completions sampled per prompt (a group).")
    beta: float = Field(0.0, ge=0, description="KL coefficient (k3 estimator); 0 loads no reference model.")
    epsilon: float = Field(0.2, ge=0, description="Lower clip range: ratios below 1 - epsilon are clipped.")
    epsilon_high: float | None = Field(
        None, ge=0, description="Upper clip range (DAPO clip-higher: 0.28). For " + ", ".join(
            s.name for s in LOSSES.values() if s.weight_cap) + f" the cap on the importance weight itself, >= 1 "
        f"(default {CISPO_CAP}, as TRL suggests). Default: epsilon.",
    )
    delta: float | None = Field(None, description="Two-sided clipping bound on the ratio (INTELLECT-2); > 1 + epsilon_high.")
    loss_type: LossType = Field("dapo", description="The per-token objective and its aggregation: " + "; ".join(
        f"`{s.name}`: {s.what}" for s in LOSSES.values()) + ".")
    scale_rewards: ScaleMode = Field("group", description="Divide advantages by the std of the group, the batch, or none (Dr. GRPO).")
    advantage_estimator: Estimator = Field("grpo", description="What each completion's reward is compared with: "
                                           + "; ".join(f"`{s.name}`: {s.baseline} ({s.paper})"
                                                       for s in ESTIMATORS.values()) + ".")
    importance_sampling_level: Literal["token", "sequence"] = Field("token", description="`sequence` is GSPO.")
    num_iterations: int = Field(1, ge=1, description="mu: policy updates per generation batch.")
    mask_truncated_completions: bool = Field(False, description="Drop completions that hit max length from the loss (DAPO).")
    top_entropy_quantile: float = Field(1.0, gt=0, le=1, description="Train only on the top-q highest-entropy tokens.")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="sapo: gate temperature for positive advantages.")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="sapo: gate temperature for negative advantages.")
    vespo_k_pos: float = Field(2.0, ge=0, description="vespo: power k of the Gamma weight for advantages >= 0 (how "
                               "hard a sequence ratio w < 1 is down-weighted).")
    vespo_lambda_pos: float = Field(3.0, ge=0, description="vespo: decay lambda of the Gamma weight for advantages >= 0 "
                                    "(how hard w > 1 is down-weighted; below 1e-4 counts as 1e-4, as TRL).")
    vespo_k_neg: float = Field(3.0, ge=0, description="vespo: power k for negative advantages.")
    vespo_lambda_neg: float = Field(2.0, ge=0, description="vespo: decay lambda for negative advantages.")
    entropy_coef: float = Field(
        0.0, description="Entropy bonus: the loss minus entropy_coef times the mean entropy of the trained tokens (the "
        "same meaning for every loss_type). With use_adaptive_entropy, the starting coefficient.",
    )
    use_adaptive_entropy: bool = Field(
        False, description="Skywork-OR1's adaptive entropy control (arXiv:2505.22312): after every optimizer step the "
        "coefficient moves by entropy_coef_delta, up while the entropy is at or below entropy_target, down above it; "
        "the bonus only applies while the last step's entropy was at or below the target.",
    )
    entropy_coef_min: float = Field(0.0, description="Adaptive entropy: lower bound of the coefficient.")
    entropy_coef_max: float = Field(1.0, description="Adaptive entropy: upper bound of the coefficient.")
    entropy_coef_delta: float = Field(0.005, ge=0, description="Adaptive entropy: change of the coefficient per optimizer step.")
    entropy_target: float = Field(
        0.2, ge=0, description="Adaptive entropy: target mean entropy per trained token (nats); set it near the "
        "`entropy` logged early in training so the bonus engages before the policy collapses.",
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig, description="DAPO's dynamic sampling (arXiv:2503.14476 sec. 3.2).")
    sync_ref_model: bool = Field(
        False, description="Refresh the reference model from the policy every ref_model_sync_steps steps (TR-DPO "
        "arXiv:2404.09656; alpha 1 is DeepSeekMath Algorithm 1's reset pi_ref <- pi_theta). Needs beta > 0 and full fine-tuning.",
    )
    ref_model_mixup_alpha: float = Field(0.6, ge=0, le=1, description="The refresh: pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (weights).")
    ref_model_sync_steps: int = Field(512, ge=1, description="Steps between reference refreshes (after the step's update).")
    use_bias_correction_kl: bool = Field(
        False, description="Multiply each token's k3 KL by its importance ratio pi/pi_old, gradient included "
        "(DeepSeek-V3.2's unbiased KL estimate; TRL's default is true). false: plain k3 as in DeepSeekMath. Needs beta > 0 to matter.",
    )
    off_policy_mask_threshold: float | None = Field(
        None, ge=0, description="DeepSeek-V3.2 off-policy sequence masking: a completion with a negative advantage whose "
        "mean per-token log(pi_sampler / pi) exceeds this is left out of the policy loss (sampler log-probs from vLLM "
        "or rollout.dtype, else the old policy's). None: no mask.",
    )
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize", description="Several rewards: `sum_then_normalize` sums the weighted rewards, then "
        "normalises per group (scale_rewards); `normalize_then_sum` (GDPO arXiv:2601.05242, as TRL) normalises each "
        "reward within its group, sums them weighted, then normalises the sums over the batch.",
    )

    @property
    def entropy_bonus(self) -> bool:
        """Whether the loss has an entropy term (adaptive control keeps it even at coefficient 0, as TRL)."""
        return self.entropy_coef != 0 or self.use_adaptive_entropy

    @property
    def epsilon_high_value(self) -> float:
        if self.epsilon_high is None:
            return LOSSES[self.loss_type].weight_cap or self.epsilon
        return self.epsilon_high

    @model_validator(mode="after")
    def _clip_ranges(self) -> AlgorithmConfig:
        loss = LOSSES[self.loss_type]
        if loss.weight_cap is None and self.epsilon_high_value < self.epsilon:
            raise ValueError(f"algorithm.epsilon_high ({self.epsilon_high}) must be >= algorithm.epsilon ({self.epsilon})")
        if loss.weight_cap is not None and self.epsilon_high_value < 1:
            raise ValueError(
                f"algorithm.epsilon_high ({self.epsilon_high}) is below 1: for loss_type {loss.name} it is the cap on "
                "the importance weight itself (not 1 + epsilon_high as in the clipped losses), so every token would be "
                f"clipped; use a value >= 1, usually {loss.weight_cap} (TRL's suggestion; unset means "
                f"{loss.weight_cap})"
            )
        if self.sync_ref_model and self.beta == 0:
            raise ValueError("algorithm.sync_ref_model refreshes the reference model, and beta = 0 loads none: set "
                             "algorithm.beta > 0 (e.g. 0.04) or leave sync_ref_model off")
        if self.multi_objective_aggregation == "normalize_then_sum" and self.scale_rewards != "group":
            raise ValueError(
                f"algorithm.scale_rewards ({self.scale_rewards}) does not apply with multi_objective_aggregation "
                "normalize_then_sum, which divides each reward by its group's std and the sums by the batch's std "
                "(as TRL, which ignores scale_rewards there): leave scale_rewards at group"
            )
        spec = ESTIMATORS[self.advantage_estimator]
        if spec.scale is not None and self.scale_rewards != spec.scale:
            raise ValueError(f"algorithm.scale_rewards ({self.scale_rewards}): advantage_estimator "
                             f"{spec.name} normalises over the {spec.scale} by its definition: set scale_rewards "
                             f"{spec.scale}")
        if not spec.aggregates and self.multi_objective_aggregation == "normalize_then_sum":
            raise ValueError(f"algorithm.multi_objective_aggregation normalize_then_sum is GDPO's per-function "
                             f"normalisation, a grpo estimator of its own: with advantage_estimator {spec.name}, "
                             "use sum_then_normalize")
        if loss.level is not None and self.importance_sampling_level != loss.level:
            raise ValueError(f"algorithm.loss_type {loss.name} is defined on importance_sampling_level {loss.level}: "
                             f"{loss.level_reason}; set algorithm.importance_sampling_level: {loss.level}")
        if self.use_adaptive_entropy and self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(f"algorithm.entropy_coef_min ({self.entropy_coef_min}) must be <= entropy_coef_max "
                             f"({self.entropy_coef_max})")
        if self.delta is not None and self.delta <= 1 + self.epsilon_high_value:
            raise ValueError(f"algorithm.delta ({self.delta}) must be > 1 + epsilon_high ({1 + self.epsilon_high_value})")
        return self
