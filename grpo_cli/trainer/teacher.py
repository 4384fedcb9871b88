"""The teacher of on-policy distillation (recipe `distillation`): a frozen model that scores each token the policy
sampled; its per-token reverse KL is added to the step's advantages (grpo_cli/algo/distillation.py). Without a
teacher, `Teacher(None)` gives the advantages back unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from grpo_cli.algo.advantages import Advantages
from grpo_cli.algo.distillation import reverse_kl_advantages, reverse_kl_per_token
from grpo_cli.datatypes import Rollout


class Teacher:
    """`model` (None: no distillation) in eval mode, frozen, on the trainer's device; `weight` is lambda; `forward`:
    how its forwards run (trainer/setup.forward_choices of its own config: it may be of another model type)."""

    def __init__(self, model: torch.nn.Module | None, weight: float = 1.0, forward: Any = None) -> None:
        self.model, self.weight, self.forward = model, weight, forward
        self.sums: tuple[float, float] = (0.0, 0.0)

    def advise(self, adv: Advantages, rollout: Rollout, sampled: torch.Tensor, student: torch.nn.Module,
               logps: Callable[..., torch.Tensor]) -> Advantages:
        """The advantages with lambda (log pi_T - log pi_S) added to each sampled token ([n] become [n, T]);
        `logps(model, rollout, forward)` -> [n, T] a model's log-probs of the sampled tokens without grad, as the
        update takes them (micro-batches, temperature, packing; PolicyUpdate.logps)."""
        if self.model is None:
            return adv
        teacher, mine = logps(self.model, rollout, self.forward), logps(student, rollout)
        per_token = reverse_kl_advantages(teacher, mine, sampled.to(teacher.device), self.weight)
        self.sums = reverse_kl_per_token(teacher, mine, sampled.to(teacher.device))
        local = adv.local.to(per_token.device)
        return replace(adv, local=(local[:, None] if local.dim() == 1 else local) + per_token)

    def metrics(self, procs: Any) -> dict[str, float]:
        if self.model is None:
            return {}
        total, tokens = procs.reduce_sum(torch.tensor(self.sums, dtype=torch.float64)).tolist()
        return {"distillation/reverse_kl": total / max(tokens, 1.0)}
