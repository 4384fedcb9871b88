"""The policy update of one step: DeepSeekMath Algorithm 1's inner loop, "for GRPO iteration = 1, ..., mu:
update the policy model by maximizing the GRPO objective", each iteration one optimizer step over every
micro-batch of the step's rows (gradient accumulation), or train.mini_batches optimizer steps over its mini-batches
in order, and the reference it is regularised towards.

mu > 1: the old policy is the one of iteration 0, whose forwards run before any optimizer step, so their
detached log-probs are the old log-probs and need no forward of their own; with dropout every forward differs,
and the old policy gets a separate one (as TRL computes it), as it does with mini-batches (the second one's forwards
follow an optimizer step).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_cli.algo.distillation import TeacherTerm, with_reverse_kl
from grpo_cli.algo.entropy import EntropyControl
from grpo_cli.algo.logprobs import logps_no_grad, token_logprobs
from grpo_cli.algo.losses import LossConfig, SEQUENCE_METRICS, compute_loss, entropy_mask, sampler_correction
from grpo_cli.algo.reference import mix_into
from grpo_cli.algo.sampling import Truncation
from grpo_cli.datatypes import Processes, Rollout
from grpo_cli.models.loading import has_dropout
from grpo_cli.run.statefiles import TensorFile
from grpo_cli.trainer.nonfinite import NonFiniteSteps
from grpo_cli.trainer.reporting import MetricSums
from grpo_cli.trainer.samples import dealt, keeps_rows, training_rows
from grpo_cli.trainer.setup import ForwardChoices


def loss_config(recipe) -> LossConfig:
    """The recipe's loss, read once."""
    a = recipe.algorithm
    return LossConfig(
        a.loss_type, epsilon_low=a.epsilon, epsilon_high=a.epsilon_high_value, delta=a.delta,
        importance_sampling_level=a.importance_sampling_level, beta=a.beta,
        max_completion_length=recipe.rollout.max_completion_length, sapo_temperature_pos=a.sapo_temperature_pos,
        sapo_temperature_neg=a.sapo_temperature_neg, use_bias_correction_kl=a.use_bias_correction_kl,
        off_policy_mask_threshold=a.off_policy_mask_threshold,
        vespo=(a.vespo_k_pos, a.vespo_lambda_pos, a.vespo_k_neg, a.vespo_lambda_neg),
    )


class Reference:
    """pi_ref of the KL term (beta > 0): a frozen copy of the starting policy, or with LoRA the base with its
    adapters disabled (no copy). With algorithm.sync_ref_model it is refreshed from the policy every M steps,
    pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (TR-DPO; alpha = 1 is Algorithm 1's outer loop, "reference
    model pi_ref <- pi_theta"); the refreshed weights are then part of the run's state."""

    def __init__(self, model: torch.nn.Module | None, algorithm) -> None:
        self.model, self.algo = model, algorithm
        self.syncs = 0

    def after_update(self, step: int, policy: torch.nn.Module) -> None:
        if self.algo.sync_ref_model and step % self.algo.ref_model_sync_steps == 0:
            mix_into(self.model, policy, self.algo.ref_model_mixup_alpha)
            self.syncs += 1

    def metrics(self) -> dict[str, float]:
        return {"ref_model/syncs": self.syncs} if self.algo.sync_ref_model else {}

    def state_dict(self) -> dict[str, Any]:
        """The refresh count, and the weights once they are no longer the starting policy's (ref_model.safetensors)."""
        weights = {"weights": TensorFile("ref_model", dict(self.model.named_parameters()))} if self.syncs else {}
        return {"syncs": self.syncs, **weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.syncs = int(state.get("syncs", 0))
        if self.syncs:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(state["weights"][name])


@dataclass
class Window:
    """One step's rows as the update sees them (its mu accumulation windows all go over these)."""

    rollout: Rollout
    adv: torch.Tensor  # [n] or [n, T]
    mask: torch.Tensor  # [n, T] the tokens trained on
    old: torch.Tensor | None = None  # [n, T] the old policy's log-probs, once known (mu > 1)
    ref: torch.Tensor | None = None  # [n, T] the reference's log-probs (beta > 0)
    teacher: TeacherTerm | None = None  # on-policy distillation, the term added here (student: the old log-probs)
    num_active: float | None = None  # active tokens of the whole generation batch (dapo, cispo, vespo)
    loss_scale: float = 1.0  # what each micro-batch's loss is multiplied by before backward
    micro_batches: int = 1  # per optimizer step
    entropy_sums: list[float] = field(default_factory=lambda: [0.0, 0.0])  # this optimizer step's entropy, tokens
    nonfinite_loss: str | None = None  # this optimizer step's first non-finite loss, on this process


def mini_batches(rows: int, count: int, micro_batch_size: int) -> list[list[slice]]:
    """`rows` in order as `count` mini-batches (train.mini_batches; equal where `count` divides `rows`), each as its
    micro-batches of at most `micro_batch_size` rows."""
    bounds = [round(i * rows / count) for i in range(count + 1)]
    return [[slice(s, min(s + micro_batch_size, end)) for s in range(start, end, micro_batch_size)]
            for start, end in zip(bounds, bounds[1:]) if end > start]


def _unmeasured(phase: str) -> nullcontext:
    return nullcontext()


class PolicyUpdate:
    """mu optimizer steps over one step's rows; -> the sums its metrics are made of."""

    def __init__(self, recipe, accelerator, procs: Processes, model, optimizer, scheduler, reference: Reference,
                 forward: ForwardChoices) -> None:
        self.recipe, self.accelerator, self.procs = recipe, accelerator, procs
        self.model, self.optimizer, self.scheduler, self.reference = model, optimizer, scheduler, reference
        self.loss = loss_config(recipe)
        # a group's prompt once per forward, the LM head inside the log-prob row chunks (grpo_cli/algo/logprobs.py),
        # the rows packed (grpo_cli/algo/packing.py)
        f = forward
        self.forward_kw = dict(shared_prompts=f.shared_prompts, chunked_head=f.chunked_head, packing=f.packing)
        ro = recipe.rollout  # top-k / top-p / min-p: every log-prob is of the truncated policy that sampled
        truncation = Truncation(ro.top_k, ro.top_p, ro.min_p)
        self.truncation = truncation if truncation.active else None
        a = recipe.algorithm  # the entropy bonus: its coefficient is run state (adaptive control moves it)
        self.entropy = EntropyControl.from_recipe(a) if a.entropy_bonus else None
        # a NaN or infinite loss or gradient skips the optimizer step on every process (grpo_cli/trainer/nonfinite.py);
        # fp16's scaled gradients overflow by design (the scaler skips those) and DeepSpeed's live in its engine
        unscaled = accelerator.scaler is None and accelerator.distributed_type.name != "DEEPSPEED"
        self.nonfinite = NonFiniteSteps(recipe.train.max_nonfinite_steps, procs, check_grads=unscaled)
        self.named = [(n, p) for n, p in accelerator.unwrap_model(model).named_parameters() if p.requires_grad]

    def __call__(self, rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor, memory=None,
                 teacher: TeacherTerm | None = None) -> MetricSums:
        """`adv`: [n] per completion or [n, T] per token; `mask` [n, T]: the tokens trained on (an episode split where
        its history changed trains as several rows, grpo_cli/trainer/samples.py). `memory`: a
        grpo_cli.process.memory.PhasePeaks, which records the peak memory of the reference's forwards, of forward and
        backward, and of the optimizer step. `teacher`: on-policy distillation's term, added to each micro-batch's
        advantages with the old policy's log-probs as the student's (filled into `teacher.student`); only where the
        rows are trained as given (`keeps_layout`)."""
        a, t = self.recipe.algorithm, self.recipe.train
        phase = memory if memory is not None else _unmeasured
        if teacher is not None and not self.keeps_layout(rollout):
            raise ValueError("a teacher term needs the rows trained as given (keeps_layout)")
        rollout, adv, mask = training_rows(rollout, adv, mask, self.procs)  # a split episode: a row per sample
        rollout, adv, mask = dealt(rollout, adv, mask, self.procs, t.mini_batches)  # the same steps on any count
        minis = mini_batches(len(rollout), t.mini_batches, t.micro_batch_size)
        slices = [sl for mini in minis for sl in mini]
        # the old policy's forwards run before any optimizer step: iteration 0's own, unless a mini-batch after the
        # first (its forwards follow a step) or dropout (every forward differs) asks for a forward of their own
        separate_old = (a.num_iterations > 1 and has_dropout(self.accelerator.unwrap_model(self.model))
                        or len(minis) > 1)
        with phase("reference") if separate_old or self.loss.beta > 0 else nullcontext():
            w = self.window(rollout, adv.to(mask.device), mask, len(minis[0]), mini_batches=len(minis),
                            old=self._logps_no_grad(self.model, rollout, slices) if separate_old else None,
                            ref=self._ref_logps(rollout, slices) if self.loss.beta > 0 else None)
        if teacher is not None:
            w.teacher = teacher
            # log-probs are float32 (algo/logprobs.py), whatever the autocast
            teacher.teacher = teacher.teacher.to(mask.device)
            teacher.student = torch.zeros(mask.shape, device=mask.device)
        sums = MetricSums()
        sums.add_scalar("learning_rate", self.scheduler.get_last_lr()[0])
        self.nonfinite.new_step()
        self.model.train()
        first_logps: list[torch.Tensor] = []
        for it in range(a.num_iterations):
            for mini in minis:  # one optimizer step each
                self.accumulate_over(w, len(mini))
                for k, sl in enumerate(mini):
                    last = k == len(mini) - 1
                    # DDP/FSDP all-reduce only on the window's last backward; DeepSpeed steps its engine only then
                    self.accelerator.sync_gradients = last
                    with nullcontext() if last else self.accelerator.no_sync(self.model), phase("forward_backward"):
                        logps = self._micro_step(w, sl, sums, first=it == 0)
                    if it == 0 and a.num_iterations > 1 and not separate_old:
                        first_logps.append(logps)
                if first_logps:
                    w.old, first_logps = torch.cat(first_logps), []  # [N, T]: the old policy of iterations 1 .. mu-1
                with phase("optimizer"):
                    norm = self._optimizer_step(w)
                if norm is not None:  # (a skipped step has no norm to average)
                    sums.add_scalar("grad_norm", norm)
                if self.entropy is not None:  # the controller sees the window's entropy over every process's tokens
                    total, tokens = self.procs.reduce_sum(torch.tensor(w.entropy_sums, dtype=torch.float64)).tolist()
                    if norm is not None:
                        self.entropy.step(total / max(tokens, 1.0))
                    sums.add_scalar("entropy_coef", self.entropy.coef)
                    w.entropy_sums = [0.0, 0.0]
        return sums

    def keeps_layout(self, rollout: Rollout) -> bool:
        """Whether the rows are trained as given, one to one and in order (grpo_cli/trainer/samples.py)."""
        return keeps_rows(rollout, self.procs, self.recipe.train.mini_batches)

    def window(self, rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor, micro_batches: int,
               old: torch.Tensor | None = None, ref: torch.Tensor | None = None, mini_batches: int = 1) -> Window:
        """This process's rows as `mini_batches` optimizer steps of `micro_batches` micro-batches each (a collective
        with several processes): the normaliser every micro-batch's loss shares. Per-sequence and constant-length
        losses are each micro-batch's mean / micro_batches (TRL's gradient accumulation); a global token mean divides
        by the active tokens of every process's rows over the mini-batch count (TRL's num_items_in_batch x
        gradient_accumulation_steps / steps_per_generation: every mini-batch the same normaliser), times the process
        count that DDP's gradient average divides by."""
        w = Window(rollout, adv, mask, old=old, ref=ref)
        if self.loss.global_token_mean:
            w.num_active = self.procs.gather(mask.sum().reshape(1).float().cpu()).sum().item() / mini_batches
        self.accumulate_over(w, micro_batches)
        return w

    def accumulate_over(self, w: Window, micro_batches: int) -> None:
        """The next optimizer step of `w` accumulates `micro_batches` micro-batches."""
        w.micro_batches = micro_batches
        w.loss_scale = float(self.procs.count) if self.loss.global_token_mean else 1.0 / micro_batches

    def _micro_step(self, w: Window, sl: slice, sums: MetricSums, first: bool) -> torch.Tensor:
        """One forward/backward of micro-batch `sl` of the window; -> its detached log-probs [b, T]."""
        q, rollout = self.recipe.algorithm.top_entropy_quantile, w.rollout
        with self.accelerator.autocast():
            logps, entropy = token_logprobs(
                self.model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl],
                rollout.completion_mask[sl], temperature=self.recipe.rollout.temperature,
                with_entropy=first or q < 1, entropy_grad=self.entropy is not None, truncation=self.truncation,
                **self.forward_kw,
            )
        m = w.mask[sl]
        if first:
            sums.add_tokens("entropy", entropy.detach(), m)
        old_sl = w.old[sl] if w.old is not None else logps.detach()
        adv = w.adv[sl]
        if w.teacher is not None:  # on-policy distillation: + lambda (log pi_T - log pi_S) a token, pi_S the old policy
            if first:
                w.teacher.student[sl] = old_sl
            adv = with_reverse_kl(adv, w.teacher.teacher[sl].to(old_sl.dtype), old_sl, m, w.teacher.weight)
        weights = self._sampler_weights(rollout, sl, old_sl, m, sums if first else None)
        # the tokens the policy term trains on: the threshold over this micro-batch of every process (as TRL's)
        high = entropy_mask(entropy.detach(), m, q, self.procs.gather_ragged(entropy.detach()[m.bool()].float().cpu())
                            ) if q < 1 else None
        loss, lm = compute_loss(
            self.loss, logps, old_sl, adv, m, ref_logps=w.ref[sl] if w.ref is not None else None,
            num_active_tokens=w.num_active, token_weights=weights, policy_mask=high,
            sampling_logps=rollout.sampling_logps[sl] if rollout.sampling_logps is not None else None,
        )
        total = loss * w.loss_scale
        if self.entropy is not None:  # minus c times the mean entropy of the tokens the policy term trains on
            e = m if high is None else high
            coef, mean_entropy = self.entropy.applied(), (entropy * e).sum() / e.sum().clamp(min=1)
            total = total - coef * mean_entropy / w.micro_batches
            w.entropy_sums[0] += (entropy.detach() * e).sum().item()
            w.entropy_sums[1] += e.sum().item()
            sums.add_scalar("policy_loss", loss.item() * w.loss_scale * w.micro_batches)
        self.accelerator.backward(total)
        n_tok, n_seq = m.sum().item(), float(m.shape[0])
        for key, value in lm.items():  # exact over micro-batches and processes, as TRL's global masked means
            sums.add_weighted(key, value.item(), n_seq if key in SEQUENCE_METRICS else n_tok)
        # logged: the window's objective, what TRL logs: the backpropagated losses summed over its micro-batches,
        # averaged over processes (the mean of micro_batches x each); a global token mean is not divided again
        value = total.item()
        sums.add_scalar("loss", value * w.micro_batches)
        if w.nonfinite_loss is None and not math.isfinite(value):
            w.nonfinite_loss = f"the loss is {value} (rows {sl.start}-{sl.stop - 1} of this process)"
        return logps.detach()

    def _sampler_weights(self, rollout, sl, old, mask, sums) -> torch.Tensor | None:
        """Train/inference mismatch: log it, and return the importance weights rollout.importance_sampling asks for."""
        if rollout.sampling_logps is None:
            return None
        ro = self.recipe.rollout
        samp = rollout.sampling_logps[sl].to(old.device)
        weights, rho = sampler_correction(old, samp, mask, ro.importance_sampling, ro.importance_sampling_cap,
                                          ro.importance_sampling_min)
        if sums is not None:
            if ro.importance_sampling_min is not None:  # clamped or dropped by the lower bound
                sums.add_tokens("sampling/importance_sampling_below_min", (rho < ro.importance_sampling_min).float(),
                                mask)
            diff = (old - samp).abs()
            sums.add_tokens("sampling/sampling_logp_difference/mean", diff, mask)
            sums.add_extremes("sampling/sampling_logp_difference/max", diff, mask)
            sums.add_tokens("sampling/importance_sampling_ratio/mean", rho, mask)
            sums.add_extremes("sampling/importance_sampling_ratio/min", rho, mask, low=True)
            sums.add_extremes("sampling/importance_sampling_ratio/max", rho, mask)
        return weights

    def logps(self, model, rollout: Rollout, forward: ForwardChoices | None = None,
              temperature: float | None = None) -> torch.Tensor:
        """[n, T] `model`'s log-probs of the rollout's tokens without grad, micro-batch by micro-batch, as the update
        takes them (`forward`: another model's choices, e.g. a teacher of another type; `temperature`: another than
        the rollout's)."""
        slices = [slice(i, i + self.recipe.train.micro_batch_size) for i in range(0, len(rollout),
                                                                               self.recipe.train.micro_batch_size)]
        kw = self.forward_kw if forward is None else dict(shared_prompts=forward.shared_prompts,
                                                          chunked_head=forward.chunked_head, packing=forward.packing)
        own = temperature is None
        return logps_no_grad(model, rollout, slices, temperature=self.recipe.rollout.temperature if own else temperature,
                             autocast=self.accelerator.autocast, truncation=self.truncation if own else None, **kw)

    def _ref_logps(self, rollout: Rollout, slices: list[slice]) -> torch.Tensor:
        if self.reference.model is not None:
            return self._logps_no_grad(self.reference.model, rollout, slices)
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # LoRA: the frozen base is the reference
            return self._logps_no_grad(self.model, rollout, slices)

    def _logps_no_grad(self, model, rollout: Rollout, slices: list[slice]) -> torch.Tensor:
        """Old-policy (mu > 1) or reference (beta > 0) log-probs, micro-batch by micro-batch."""
        return logps_no_grad(model, rollout, slices, temperature=self.recipe.rollout.temperature,
                             autocast=self.accelerator.autocast, truncation=self.truncation, **self.forward_kw)

    def _optimizer_step(self, w: Window) -> float | None:
        """Clip and step; -> the gradient norm before clipping, or None where the step was skipped (a NaN or infinite
        loss or gradient on any process: nothing moves, not even the schedule)."""
        loss, w.nonfinite_loss = w.nonfinite_loss, None
        if self.nonfinite.skip(loss, self.named):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        # accelerate computes the global norm for DDP, FSDP (sharded grads) and DeepSpeed; inf: measure only
        max_norm = self.recipe.train.max_grad_norm or math.inf
        norm = self.accelerator.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], max_norm)
        norm = float(norm) if norm is not None else math.nan  # DeepSpeed reports no norm before its first step
        if self.nonfinite.check_grads and self.nonfinite.overflowed(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        if not getattr(self.optimizer, "step_was_skipped", False):  # fp16: the loss scaler skipped an overflow
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm
