"""On-policy distillation's signal: the student samples, a teacher scores each sampled token, and the per-token
reverse KL is the reward (GKD, Agarwal et al. arXiv:2306.13649, with the reverse KL on the student's own samples;
Thinking Machines' "On-Policy Distillation", 2025: the advantage of token t is -(log pi_S(y_t) - log pi_T(y_t)),
undiscounted, each token on its own). Added to GRPO's advantages with a weight, or alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def reverse_kl_advantages(teacher: torch.Tensor, student: torch.Tensor, sampled: torch.Tensor, weight: float) -> torch.Tensor:
    """[n, T] lambda (log pi_T(y_t) - log pi_S(y_t)) on the sampled tokens, 0 elsewhere. `teacher`, `student`: [n, T]
    the two models' log-probs of the sampled tokens (no grad); `sampled` [n, T] the tokens the policy sampled."""
    return weight * (teacher - student) * sampled.to(teacher.dtype)


def with_reverse_kl(adv: torch.Tensor, teacher: torch.Tensor, student: torch.Tensor, sampled: torch.Tensor,
                    weight: float) -> torch.Tensor:
    """`adv` ([n] per completion or [n, T] per token) with `reverse_kl_advantages` added to each token: [n, T]."""
    per_token = reverse_kl_advantages(teacher, student, sampled, weight)
    adv = adv.to(per_token.device)
    return (adv[:, None] if adv.dim() == 1 else adv) + per_token


def reverse_kl_per_token(teacher: torch.Tensor, student: torch.Tensor, sampled: torch.Tensor) -> tuple[float, float]:
    """(sum over sampled tokens of log pi_S - log pi_T, number of sampled tokens): the Monte Carlo estimate of
    KL(pi_S || pi_T) per token on the student's own samples, summed here and divided once every process's sums are
    in (trainer/teacher.py)."""
    m = sampled.to(teacher.dtype)
    return float(((student - teacher) * m).sum()), float(m.sum())


@dataclass
class TeacherTerm:
    """The teacher's part for an update that adds the per-token term itself, with the student's log-probs from its own
    forward of the old policy (one student forward fewer a step): `teacher` [n, T] log pi_T of the sampled tokens,
    `weight` lambda; the update fills `student` [n, T], the log pi_S it used."""

    teacher: torch.Tensor
    weight: float
    student: torch.Tensor | None = None
