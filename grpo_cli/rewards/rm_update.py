"""Reward-model updates with replay: DeepSeekMath (arXiv:2402.03300) Algorithm 1, last line, "update r_phi
through continuous training using a replay mechanism" (sec. 4.1.4: the old reward model keeps training on the
policy's new samples with a replay of 10% historical data).

A `model:` reward with `update: {every_steps: N, ...}` keeps learning while the policy trains. Every step the
updater records the step's groups: each completion as the reward model reads it (policy prompt, user prompt,
completion) with the value the `label` reward (a verifiable one, e.g. accuracy) gave it. After every N steps:

  1. `accuracy_before`: the model's accuracy on all the period's groups, none of which it has trained on;
  2. `holdout_fraction` of the period's groups are held back (seeded choice) and never trained on;
  3. the other groups plus n x f / (1 - f) groups drawn from the replay buffer (earlier periods' trained groups,
     f = replay_fraction: f of the training groups are historical) make the training set: `epochs` passes in a
     seeded order, AdamW from fresh moments at a constant `learning_rate`, gradient norm clipped at 1;
  4. `accuracy`: on the held-back groups after the update; the trained groups join the buffer (newest kept).

Objectives. pointwise: binary cross-entropy of the score (a logit) against the label, which must lie in [0, 1]
(a 0/1 correctness reward: P(correct) = sigmoid(score)); accuracy: sign(score) agrees with label >= 0.5.
pairwise: Bradley-Terry, -log sigmoid(s_i - s_j) averaged over every pair of completions of the same prompt with
label_i > label_j (groups whose labels are all equal give no pair); accuracy: the share of such pairs ordered
correctly. A step of `batch_size` completions (pairwise: whole groups until batch_size completions).

The model stays in eval mode (no dropout) so every process, given the same gathered samples in the same order,
ends with the same weights; checkpoints hold the buffer, the period's pending groups (trainer_state.json's
`reward_models`) and the weights once trained (trainer/reward_model_<i>.safetensors), so a resumed run continues
exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from grpo_cli.data.prompts import user_prompts
from grpo_cli.errors import RewardError
from grpo_cli.recipe.checks import update_label
from grpo_cli.recipe.names import unique_log_names
from grpo_cli.rewards import reward_model as rm
from grpo_cli.run.statefiles import TensorFile

Group = list[dict[str, Any]]  # one prompt's completions: {"prompt", "user", "completion", "label"}


# ---------------------------------------------------------------- the arithmetic, on plain tensors


def ordered_pairs(labels: list[float]) -> list[tuple[int, int]]:
    """(i, j) for every i, j of one group with label_i > label_j: i should score higher."""
    return [(i, j) for i in range(len(labels)) for j in range(len(labels)) if labels[i] > labels[j]]


def pointwise_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of logits [n] against targets in [0, 1] [n]."""
    return F.binary_cross_entropy_with_logits(scores, labels, reduction="mean")


def pairwise_loss(scores: torch.Tensor, groups: list[list[float]]) -> torch.Tensor | None:
    """Mean -log sigmoid(s_i - s_j) over the ordered pairs of every group; scores [sum of group sizes] in group
    order. None when no group has two different labels."""
    winners, losers, start = [], [], 0
    for labels in groups:
        for i, j in ordered_pairs(labels):
            winners.append(start + i)
            losers.append(start + j)
        start += len(labels)
    if not winners:
        return None
    return -F.logsigmoid(scores[winners] - scores[losers]).mean()


def correct_count(objective: str, scores: list[float], groups: list[list[float]]) -> tuple[int, int]:
    """(right, judged): pointwise, completions whose score's sign agrees with label >= 0.5; pairwise, ordered
    pairs scored in the labels' order (a tie counts wrong)."""
    if objective == "pointwise":
        labels = [x for g in groups for x in g]
        return sum((s > 0) == (y >= 0.5) for s, y in zip(scores, labels, strict=True)), len(labels)
    right = judged = start = 0
    for labels in groups:
        for i, j in ordered_pairs(labels):
            right += scores[start + i] > scores[start + j]
            judged += 1
        start += len(labels)
    return right, judged


def replay_count(new_groups: int, fraction: float, available: int) -> int:
    """Historical groups to mix into an update of `new_groups`, so they make `fraction` of its training set."""
    return min(available, round(new_groups * fraction / (1 - fraction)))


def holdout_count(groups: int, fraction: float) -> int:
    """Groups held back from a period's `groups`: ceil(fraction x groups), at least one trained when any."""
    return 0 if fraction <= 0 or groups < 2 else min(groups - 1, math.ceil(groups * fraction))


# ---------------------------------------------------------------- the updater


class RewardModelUpdater:
    """rewards[index].update of one run: records each step's labelled groups, trains every `every_steps`."""

    def __init__(self, index: int, spec, label_index: int, log_name: str, seed: int) -> None:
        self.index, self.spec, self.cfg = index, spec, spec.update
        self.label_index, self.log_name, self.seed = label_index, log_name, seed
        self.batch_size = spec.kwargs.get("batch_size", rm.DEFAULTS["batch_size"])  # scoring batches
        self.max_length = spec.kwargs.get("max_length", rm.DEFAULTS["max_length"])
        self.pending: list[Group] = []  # the groups of the period so far
        self.buffer: list[Group] = []  # earlier periods' trained groups, oldest first
        self.updates = 0

    @property
    def key(self) -> str:
        """Name of its weights in a checkpoint's trainer folder and of its state in trainer_state.json."""
        return f"reward_model_{self.index}"

    def record(self, groups: list[Group]) -> None:
        """A step's groups (every process's rows, in row order); completions without a label are left out."""
        for g in groups:
            kept = [s for s in g if s["label"] is not None]
            if self.cfg.objective == "pointwise":
                bad = [s["label"] for s in kept if not 0.0 <= s["label"] <= 1.0]
                if bad:
                    raise RewardError(
                        f"rewards[{self.index}].update: objective pointwise needs labels in [0, 1] (a correctness "
                        f"reward); the label reward gave {bad[0]!r}. Use objective: pairwise, which needs only an order")
            if kept:
                self.pending.append(kept)

    def due(self, step: int) -> bool:
        return step % self.cfg.every_steps == 0 and bool(self.pending)

    def update(self, step: int) -> dict[str, float]:
        """Train on the period's groups plus a replay of earlier ones; -> metrics reward_model/<name>/..."""
        c, groups = self.cfg, self.pending
        tok, model = rm.loaded(self.spec.name)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 101 + self.index)
        order = torch.randperm(len(groups), generator=gen).tolist()
        k = holdout_count(len(groups), c.holdout_fraction)
        held = [groups[i] for i in sorted(order[:k])]
        train = [groups[i] for i in sorted(order[k:])]
        n_replay = replay_count(len(train), c.replay_fraction, len(self.buffer))
        replayed = [self.buffer[i] for i in sorted(torch.randperm(len(self.buffer), generator=gen)[:n_replay].tolist())]
        before = self._accuracy(tok, model, groups)
        losses = self._train(tok, model, train + replayed, gen)
        after = self._accuracy(tok, model, held) if held else None
        self.buffer = (self.buffer + train)[-c.buffer_groups :]
        self.pending = []
        self.updates += 1
        p = f"reward_model/{self.log_name}/"
        out = {p + "trained_groups": float(len(train)), p + "replayed_groups": float(n_replay),
               p + "held_out_groups": float(len(held)), p + "buffer_groups": float(len(self.buffer))}
        if losses:
            out[p + "loss"] = sum(losses) / len(losses)
        if before is not None:
            out[p + "accuracy_before"] = before
        if after is not None:
            out[p + "accuracy"] = after
        return out

    # ----- model work
    def _scores(self, tok, model, samples: list[dict]) -> torch.Tensor:
        """[n] fp32 scores of `samples`, exactly as the reward scores them (same text, same tokenization)."""
        users = [s["user"] for s in samples]
        texts = rm.texts_for(tok, [s["prompt"] for s in samples], None if None in users else users,
                             [s["completion"] for s in samples])
        out = [model(**rm.encode(tok, texts[i : i + self.batch_size], self.max_length, model.device)).logits[:, 0].float()
               for i in range(0, len(texts), self.batch_size)]
        return torch.cat(out)

    @torch.no_grad()
    def _accuracy(self, tok, model, groups: list[Group]) -> float | None:
        scores = self._scores(tok, model, [s for g in groups for s in g]).tolist()
        right, judged = correct_count(self.cfg.objective, scores, [[s["label"] for s in g] for g in groups])
        return right / judged if judged else None

    def _batches(self, data: list[Group], gen: torch.Generator) -> list[list[Group]]:
        """One epoch's optimizer steps: pointwise, `batch_size` completions (each a group of one) in a seeded order;
        pairwise, whole groups in a seeded order until a step holds `batch_size` completions."""
        units = [[s] for g in data for s in g] if self.cfg.objective == "pointwise" else data
        steps, current, size = [], [], 0
        for i in torch.randperm(len(units), generator=gen).tolist():
            current.append(units[i])
            size += len(units[i])
            if size >= self.cfg.batch_size:
                steps.append(current)
                current, size = [], 0
        return steps + ([current] if current else [])

    def _train(self, tok, model, data: list[Group], gen: torch.Generator) -> list[float]:
        c, losses = self.cfg, []
        params = list(model.parameters())
        model.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=c.learning_rate, weight_decay=0.0)
        try:
            with torch.enable_grad():
                for _ in range(c.epochs):
                    for batch in self._batches(data, gen):
                        samples = [s for g in batch for s in g]
                        scores = self._scores(tok, model, samples)
                        if c.objective == "pointwise":
                            labels = torch.tensor([s["label"] for s in samples], dtype=torch.float32, device=scores.device)
                            loss = pointwise_loss(scores, labels)
                        else:
                            loss = pairwise_loss(scores, [[s["label"] for s in g] for g in batch])
                            if loss is None:  # no pair in this step's groups
                                continue
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(params, 1.0)
                        opt.step()
                        losses.append(loss.item())
        finally:
            model.requires_grad_(False)
            model.zero_grad(set_to_none=True)
        return losses

    # ----- checkpoints
    def state_dict(self) -> dict:
        return {"pending": self.pending, "buffer": self.buffer, "updates": self.updates}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The trained weights (only once an update ran: before, they are the recipe's model)."""
        _, model = rm.loaded(self.spec.name)
        return {name: p.detach() for name, p in model.named_parameters()}

    def load_state_dict(self, state: dict, tensors: dict[str, torch.Tensor] | None) -> None:
        self.pending, self.buffer, self.updates = state["pending"], state["buffer"], int(state["updates"])
        if tensors is not None:
            _, model = rm.loaded(self.spec.name)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(tensors[name])


def build_updaters(recipe, log_names: list[str]) -> list[RewardModelUpdater]:
    """One updater per reward with `update` (recipe validation has checked its label)."""
    return [RewardModelUpdater(i, spec, update_label(recipe.rewards, i), log_names[i], recipe.train.seed)
            for i, spec in enumerate(recipe.rewards) if spec.update is not None]


def step_groups(prompts: list[str], users: list[str] | None, completions: list[str], labels: list[float | None],
                group_size: int) -> list[Group]:
    """A step's rows (all processes', row order) -> its groups of labelled samples."""
    rows = [{"prompt": p, "user": users[i] if users is not None else None, "completion": c, "label": y}
            for i, (p, c, y) in enumerate(zip(prompts, completions, labels, strict=True))]
    return [rows[s : s + group_size] for s in range(0, len(rows), group_size)]


class RewardModelUpdates:
    """Every reward model with `update` in one run: each step's labelled groups (every process's rows) go to each
    updater, which trains when its period ends. Falsy when the recipe updates none."""

    def __init__(self, recipe, procs) -> None:
        self.recipe, self.procs = recipe, procs
        self.updaters = build_updaters(recipe, unique_log_names([s.name for s in recipe.rewards]))

    def __bool__(self) -> bool:
        return bool(self.updaters)

    def observe(self, step: int, s) -> dict[str, float]:
        """Algorithm 1's last line for step `step`'s batch `s` (a StepBatch) -> reward_model/* metrics and
        time/reward_model ({} without updaters)."""
        if not self.updaters:
            return {}
        import time

        t0 = time.perf_counter()
        G = self.recipe.algorithm.num_generations
        users = user_prompts(self.recipe.data, s.prompts.per_row(s.rows, G).columns)
        values, out = list(s.rewards.per_function.values()), {}
        rollout = s.rollout
        for u in self.updaters:
            rows = self.procs.gather_rows(list(zip(rollout.prompts, users or [None] * len(rollout), rollout.completions,
                                                   values[u.label_index], strict=True)))
            prompts, us, completions, labels = (list(x) for x in zip(*rows))
            u.record(step_groups(prompts, None if None in us else us, completions, labels, G))
            if u.due(step):
                out |= u.update(step)
            out[f"reward_model/{u.log_name}/updates"] = float(u.updates)
        return out | {"time/reward_model": time.perf_counter() - t0}

    def state_dict(self) -> dict:
        """Each updater's buffer and period so far, and its weights once it trained (reward_model_<i>.safetensors)."""
        return {u.key: {**u.state_dict(), **({"weights": TensorFile(u.key, u.tensors())} if u.updates else {})}
                for u in self.updaters}

    def load_state_dict(self, state: dict) -> None:
        for u in self.updaters:
            if u.key in state:
                saved = dict(state[u.key])
                u.load_state_dict(saved, saved.pop("weights", None))
