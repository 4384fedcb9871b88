"""Policy losses: a per-token objective plus an aggregation over active tokens (pure tensor functions).

Shapes: N completions (rows), T completion positions; `mask` [N, T] marks active tokens.
The importance ratio w = exp(logps - old_logps) is per token, or per sequence (GSPO arXiv:2507.18071:
exp of the masked mean log-ratio, broadcast over the sequence's tokens).

Objectives (the loss is the negative of the surrogate that is maximised):
  clipped  -min(w' A, clip(w, 1-eps_low, 1+eps_high) A); w' = min(w, delta) when delta is set
           (PPO/GRPO arXiv:2402.03300; two-sided clipping from INTELLECT-2 arXiv:2505.07291)
  cispo    -sg(min(w, eps_high)) A log pi   (MiniMax-M1 arXiv:2506.13585: clip the IS weight, keep every token's gradient)
  sapo     -(sigmoid(tau (w - 1)) 4 / tau) A, tau by the sign of A (soft adaptive policy optimization arXiv:2511.20347)
  vespo    -sg(phi(W)) A log pi, W the sequence ratio prod_t w_t (times the sampler's per-token weights, which
           vespo takes in instead of multiplying the loss by them), phi(W) = e^lambda W^k e^(-lambda W) (a Gamma
           density scaled so phi(1) = 1), k and lambda by the sign of A (VESPO arXiv:2602.10693; TRL 1.16's
           get_gamma_weights: log-ratios clamped to [-20, 20] per token, log W to [log 1e-8, 20])
plus beta * k3 KL to the reference: exp(ref - logp) - (ref - logp) - 1 (Schulman's k3, as in DeepSeekMath eq. 4);
with `use_bias_correction_kl` the k3 of each token is multiplied by its importance ratio w, gradient included
(DeepSeek-V3.2 arXiv:2512.02556, "unbiased KL estimate"; TRL's use_bias_correction_kl).
`off_policy_mask_threshold` (DeepSeek-V3.2 "off-policy sequence masking") drops from the policy term every
completion with a negative advantage whose mean per-token log(pi_sampler / pi) exceeds the threshold.

Aggregations (what a loss_type name adds on top of its objective):
  grpo, sapo   mean over sequences of the per-sequence token mean (DeepSeekMath eq. 3)
  luspo        mean over sequences of the per-sequence token sum (LUSPO arXiv:2602.05261: GSPO's sequence loss
               scaled by the sequence's length; sequence-level ratios only)
  bnpo         masked token sum / active tokens of this (micro-)batch
  dr_grpo      masked token sum / (N * max_completion_length)   (Dr. GRPO arXiv:2503.20783: no length bias)
  dapo, cispo, vespo
               masked token sum / num_active_tokens of the whole generation batch (DAPO arXiv:2503.14476
               token-level loss): with gradient accumulation and several processes every token weighs the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_cli.recipe.specs import LOSSES, LossSpec
from grpo_cli.datatypes import Rollout
from grpo_cli.registry import Registry


OBJECTIVES: Registry[Callable[..., torch.Tensor]] = Registry("policy objective")
AGGREGATIONS: Registry[Callable[..., torch.Tensor]] = Registry("loss aggregation")
POLICY_LOSSES: Registry[LossSpec] = Registry("loss_type")  # recipe/specs.py's LOSSES: an objective and an aggregation


# Each objective: (w, adv, logps, **what it reads of: epsilon_low, epsilon_high, delta, sapo temperatures, vespo's
# (k_pos, lambda_pos, k_neg, lambda_neg), log_ratio [N, T], mask [N, T], sampler_weights [N, T] or None)
# -> per-token loss [N, T], or (per-token loss, metrics).
@OBJECTIVES.register("clipped")
def clipped_objective(w, adv, logps, *, epsilon_low, epsilon_high, delta, **_) -> torch.Tensor:
    # w, logps [N, T]; adv [N, 1] (per completion) or [N, T] (per token) -> per-token loss [N, T]
    w_unclipped = torch.clamp(w, max=delta) if delta is not None else w
    w_clipped = torch.clamp(w, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(w_unclipped * adv, w_clipped * adv)


@OBJECTIVES.register("cispo")
def cispo_objective(w, adv, logps, *, epsilon_high, **_) -> torch.Tensor:
    # The gradient flows through log pi only; the capped ratio is a constant weight.
    return -(torch.clamp(w, max=epsilon_high).detach() * adv * logps)


@OBJECTIVES.register("sapo")
def sapo_objective(w, adv, logps, *, sapo_temperature_pos, sapo_temperature_neg, **_) -> torch.Tensor:
    tau = torch.where(adv > 0, sapo_temperature_pos, sapo_temperature_neg).to(w.dtype)  # [N, 1]
    return -(torch.sigmoid(tau * (w - 1)) * 4 / tau) * adv


@torch.no_grad()
def vespo_weights(adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, sampler_weights: torch.Tensor | None,
                  k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float) -> torch.Tensor:
    """VESPO's Gamma weight phi(W) of each sequence ([N, 1]; [N, T] with per-token advantages), a constant:
    log phi = lambda + k log W - lambda W, W = exp(sum_t clamp(log w_t) + sum_t log rho_t) (rho: sampler weights)."""
    low = math.log(1e-8)
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    if sampler_weights is not None:
        log_w = log_w + torch.clamp(torch.log(sampler_weights), low, 20.0).sum(-1, keepdim=True)
    log_w = torch.clamp(log_w, low, 20.0)
    positive = adv >= 0
    k = torch.where(positive, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(positive, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# metrics that are a mean over sequences (the rest are means over active tokens): what the update weights them by
SEQUENCE_METRICS = frozenset({"vespo/phi_seq_mean"})


@OBJECTIVES.register("vespo")
def vespo_objective(w, adv, logps, *, vespo, log_ratio, mask, sampler_weights, **_):
    phi = vespo_weights(adv, log_ratio, mask, sampler_weights, *vespo)  # no gradient: it scales A grad log pi
    phi_mean = phi.mean() if phi.shape[-1] == 1 else _masked_mean(phi.expand_as(mask), mask)
    return -(phi * adv * logps), {"vespo/phi_seq_mean": phi_mean}


@AGGREGATIONS.register("sequence_mean")
def sequence_mean(per_token, mask, **_) -> torch.Tensor:
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@AGGREGATIONS.register("sequence_sum_mean")
def sequence_sum_mean(per_token, mask, **_) -> torch.Tensor:
    return (per_token * mask).sum(-1).mean()


@AGGREGATIONS.register("batch_token_mean")
def batch_token_mean(per_token, mask, **_) -> torch.Tensor:
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


@AGGREGATIONS.register("constant_length")
def constant_length(per_token, mask, *, max_completion_length, **_) -> torch.Tensor:
    length = max_completion_length if max_completion_length is not None else mask.shape[1]
    return (per_token * mask).sum() / (mask.shape[0] * length)


@AGGREGATIONS.register("global_token_mean")
def global_token_mean(per_token, mask, *, num_active_tokens, **_) -> torch.Tensor:
    denom = mask.sum() if num_active_tokens is None else torch.as_tensor(num_active_tokens, dtype=per_token.dtype)
    return (per_token * mask).sum() / denom.clamp(min=1)


for _spec in LOSSES.values():
    POLICY_LOSSES.register(_spec.name)(_spec)


def importance_weights(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """[N, T] -> [N, T] ratio pi/pi_old per token, or GSPO's per-sequence geometric mean broadcast."""
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
        return torch.exp(seq).expand_as(logps)
    raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {level!r}")


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased, always-positive KL(pi || ref) estimator k3 = exp(d) - d - 1, d = ref - logp."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def off_policy_sequence_mask(adv: torch.Tensor, logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                             threshold: float) -> torch.Tensor:
    """[N, 1]: 1 keeps a completion in the policy loss, 0 drops it: kept when its advantage is >= 0 or the mean
    over its tokens of log pi_sampler - log pi (how far the policy has moved from what sampled it) is <= threshold.
    Tokens without a sampler log-prob (NaN) count as 0, as in TRL."""
    drift = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0) * mask
    mean_drift = drift.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return ((adv >= 0) | (mean_drift <= threshold)).to(mask.dtype)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class LossConfig:
    """Everything that picks and shapes the policy loss (the recipe's algorithm section, read once)."""

    loss_type: str  # a POLICY_LOSSES name
    epsilon_low: float
    epsilon_high: float
    delta: float | None = None  # two-sided clipping bound on the ratio (INTELLECT-2)
    importance_sampling_level: str = "token"  # `sequence`: GSPO
    beta: float = 0.0  # KL coefficient; > 0 needs the reference's log-probs
    max_completion_length: int | None = None  # dr_grpo's constant denominator
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)  # k_pos, lambda_pos, k_neg, lambda_neg
    use_bias_correction_kl: bool = False
    off_policy_mask_threshold: float | None = None

    @property
    def global_token_mean(self) -> bool:
        """Whether every token of the whole generation batch weighs the same (dapo, cispo, vespo): the update counts
        the batch's active tokens over all processes first."""
        return POLICY_LOSSES.get(self.loss_type).global_token_mean


def compute_loss(
    cfg: LossConfig,
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    num_active_tokens: int | float | torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    sampling_logps: torch.Tensor | None = None,
    policy_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss (to minimise) and detached metrics; see the module docstring for the formulas.

    `token_weights` [N, T] (constants) multiply the policy term per token: the importance-sampling
    correction for rollouts sampled by another engine (see `SAMPLER_CORRECTIONS`); vespo folds them into its
    sequence weight instead. `policy_mask` [N, T] (0/1: top_entropy_quantile's high-entropy tokens) multiplies the
    policy term only: the aggregation, the KL term and the metrics still count every token of `mask`, as TRL and
    arXiv:2506.01939 (the indicator inside the sum, the normaliser unchanged). The off-policy mask
    measures drift from `sampling_logps` (the sampler's log-probs), or from `old_logps` when there are none."""
    spec = POLICY_LOSSES.get(cfg.loss_type)
    mask = mask.to(logps.dtype)
    w = importance_weights(logps, old_logps.detach(), mask, cfg.importance_sampling_level)  # [N, T]
    # [N] per completion (outcome supervision) -> [N, 1]; [N, T] per token (process supervision) as it is
    adv = advantages.to(logps.dtype).unsqueeze(-1) if advantages.dim() == 1 else advantages.to(logps.dtype)
    weights = token_weights.detach().to(logps.dtype) if token_weights is not None else None
    out = OBJECTIVES.get(spec.objective)(
        w, adv, logps, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, delta=cfg.delta,
        sapo_temperature_pos=cfg.sapo_temperature_pos, sapo_temperature_neg=cfg.sapo_temperature_neg,
        vespo=cfg.vespo, log_ratio=logps.detach() - old_logps.detach(), mask=mask, sampler_weights=weights,
    )
    per_token, metrics = out if isinstance(out, tuple) else (out, {})
    if cfg.off_policy_mask_threshold is not None:
        drift_from = sampling_logps if sampling_logps is not None else old_logps
        keep = off_policy_sequence_mask(adv, logps, drift_from.to(logps.dtype), mask, cfg.off_policy_mask_threshold)
        per_token = per_token * keep
        metrics["off_policy_mask/masked_token_fraction"] = _masked_mean((1 - keep).expand_as(mask), mask).detach()
    if policy_mask is not None:
        per_token = per_token * policy_mask.to(per_token.dtype)
    if weights is not None and not spec.takes_sampler_weights:
        per_token = per_token * weights
    if cfg.beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps")
        kl = k3_kl(logps, ref_logps.detach())
        if cfg.use_bias_correction_kl:  # samples come from pi_old: w makes k3 an unbiased estimate of KL(pi || ref)
            kl = kl * w  # not detached: the ratio's gradient is part of the estimator's
        per_token = per_token + cfg.beta * kl
        metrics["kl"] = _masked_mean(kl, mask).detach()
    loss = AGGREGATIONS.get(spec.aggregation)(
        per_token, mask, max_completion_length=cfg.max_completion_length, num_active_tokens=num_active_tokens
    )
    if spec.clips:  # vespo clips nothing: its weight is vespo/phi_seq_mean
        metrics.update(clip_metrics(w.detach(), adv, mask, spec.weight_cap is not None, cfg.epsilon_low,
                                    cfg.epsilon_high))
    return loss, metrics


def clip_metrics(w, adv, mask, capped: bool, epsilon_low: float, epsilon_high: float) -> dict[str, torch.Tensor]:
    """Fraction of active tokens whose ratio left the trust region in the direction the advantage pushes.

    `capped` (cispo): the ratio is capped at epsilon_high itself (and never clipped below)."""
    if capped:
        low = torch.zeros_like(w, dtype=torch.bool)
        high = w > epsilon_high
    else:
        low = (w < 1 - epsilon_low) & (adv < 0)
        high = (w > 1 + epsilon_high) & (adv > 0)
    return {
        "clip_ratio/low_mean": _masked_mean(low.to(mask.dtype), mask),
        "clip_ratio/high_mean": _masked_mean(high.to(mask.dtype), mask),
        "clip_ratio/region_mean": _masked_mean((low | high).to(mask.dtype), mask),
    }


# rollout.importance_sampling -> fn(log_rho [N, T] masked, mask, cap) -> (weights [N, T] or None, rho [N, T])
SAMPLER_CORRECTIONS: Registry[Callable[..., tuple[torch.Tensor | None, torch.Tensor]]] = Registry("importance_sampling")


def _level(log_rho: torch.Tensor, level: str) -> torch.Tensor:
    """Per token as it is; per sequence the product over its tokens (the sum of log-ratios), broadcast."""
    return log_rho.sum(-1, keepdim=True).expand_as(log_rho) if level == "sequence" else log_rho


def _register_correction(level: str, action: str) -> None:
    def correction(log_rho: torch.Tensor, mask: torch.Tensor, cap: float,
                   floor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        rho = torch.exp(_level(log_rho, level))
        if action == "truncate":
            weights = torch.clamp(rho, min=floor, max=cap)
        else:
            kept = (rho <= cap) & (rho >= floor) if floor is not None else rho <= cap
            weights = torch.where(kept, rho, torch.zeros_like(rho))
        return weights.detach(), rho.detach()

    SAMPLER_CORRECTIONS.register(f"{level}_{action}")(correction)


for _level_name in ("token", "sequence"):
    for _action in ("truncate", "mask"):
        _register_correction(_level_name, _action)


@SAMPLER_CORRECTIONS.register("none")
def _no_correction(log_rho: torch.Tensor, mask: torch.Tensor, cap: float,
                   floor: float | None = None) -> tuple[None, torch.Tensor]:
    """No weights; the per-token ratio is still measured (the sampling/* metrics)."""
    return None, torch.exp(log_rho).detach()


def sampler_correction(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str, cap: float,
    floor: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Importance weights for rollouts whose sampler (vLLM, a bf16 copy) differs numerically from the trainer.

    rho = pi_train_old / pi_sampler per token, or per sequence (product over its tokens, i.e. the
    exp of the summed log-ratio). `*_truncate` caps rho at `cap` (truncated IS, as TRL's
    vllm_importance_sampling_cap) and raises it to `floor`; `*_mask` zeroes the tokens / sequences whose rho is
    above `cap` or below `floor` (IcePop's band; TRL's vllm_importance_sampling_clip_min); `none` weighs
    nothing. -> weights [N, T] to pass as compute_loss(token_weights=...) (None for `none`), and rho [N, T]."""
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"importance sampling mode must be token|sequence _ truncate|mask, or none; got {mode!r}")
    return SAMPLER_CORRECTIONS.get(mode)((old_logps - sampling_logps) * mask, mask, cap, floor)


def trained_mask(rollout: Rollout, mask_truncated_completions: bool) -> torch.Tensor:
    """[N, T] the tokens the loss trains on: those the policy sampled (not observations), without the completions
    that hit the length limit when `mask_truncated_completions` (DAPO's overlong filtering)."""
    mask = rollout.trained_mask().clone()
    if mask_truncated_completions:
        mask[rollout.truncated] = 0
    return mask


def entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float,
                 pooled: torch.Tensor | None = None) -> torch.Tensor:
    """Keep the top-`quantile` highest-entropy active tokens (arXiv:2506.01939, "80/20 rule"): 1 where a token's
    entropy is at or above the (1 - quantile) quantile of `pooled` [K], the active tokens' entropies the threshold
    is taken over (default: this mask's; the trainer pools the micro-batch of every process, as TRL 1.16's
    get_high_entropy_mask gathers them)."""
    pooled = entropy[mask.bool()] if pooled is None else pooled
    if quantile >= 1.0 or pooled.numel() == 0:
        return mask
    threshold = torch.quantile(pooled.float(), 1.0 - quantile).to(entropy.device)
    return mask * (entropy >= threshold).to(mask.dtype)
