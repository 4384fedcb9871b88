"""The teacher of on-policy distillation (recipe `distillation`): a frozen model that scores each token the policy
sampled, in this process (`distillation.teacher`) or behind a vLLM server (`distillation.served`: its prompt
log-probs); its per-token reverse KL is added to the step's advantages (grpo_cli/algo/distillation.py). The teacher's
log-probs are of its own distribution (temperature 1), the student's of the one it sampled from (the rollout's
temperature). Without a teacher, `Teacher(None, ...)` gives the advantages back unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from grpo_cli.algo.advantages import Advantages
from grpo_cli.algo.distillation import TeacherTerm, reverse_kl_per_token, with_reverse_kl
from grpo_cli.datatypes import Rollout
from grpo_cli.errors import SetupError, VLLMServerError
from grpo_cli.rewards.remote import JsonEndpoint, RequestFailed
from grpo_cli.trainer.setup import forward_choices

LogProbs = Callable[[Rollout], torch.Tensor]  # rollout -> [n, T] log-probs of its completion tokens, no grad


class Teacher:
    """`teacher` and `student`: their log-probs of a rollout's tokens (None: no distillation); `weight` is lambda."""

    def __init__(self, teacher: LogProbs | None, student: LogProbs, weight: float = 1.0) -> None:
        self.teacher, self.student, self.weight = teacher, student, weight
        self.sums: tuple[float, float] = (0.0, 0.0)

    def advise(self, adv: Advantages, rollout: Rollout, sampled: torch.Tensor) -> Advantages:
        """The advantages with lambda (log pi_T - log pi_S) added to each sampled token ([n] become [n, T]), the
        student's log-probs from a forward of their own."""
        if self.teacher is None:
            return adv
        mine = self.student(rollout)
        return self._added(adv, self.teacher(rollout).to(mine.device, mine.dtype), mine, sampled)

    def before_update(self, adv: Advantages, rollout: Rollout, sampled: torch.Tensor,
                      inline: bool) -> tuple[Advantages, TeacherTerm | None]:
        """`inline` (the update trains the rows as given: `PolicyUpdate.keeps_layout`): the advantages unchanged and the
        teacher's log-probs, for the update to add the term with the student's from its own forward (one forward
        fewer); else the advantages with the term added here (`advise`), and None."""
        if self.teacher is not None and inline:
            return adv, TeacherTerm(self.teacher(rollout), self.weight)
        return self.advise(adv, rollout, sampled), None

    def advised(self, adv: Advantages, term: TeacherTerm | None, sampled: torch.Tensor) -> Advantages:
        """After an update that added `term` itself: the advantages as it trained on them (for the logs), and the KL."""
        if term is None:
            return adv
        return self._added(adv, term.teacher.to(term.student.device, term.student.dtype), term.student, sampled)

    def _added(self, adv: Advantages, teacher: torch.Tensor, mine: torch.Tensor, sampled: torch.Tensor) -> Advantages:
        self.sums = reverse_kl_per_token(teacher, mine, sampled.to(mine.device))
        return replace(adv, local=with_reverse_kl(adv.local, teacher, mine, sampled.to(mine.device), self.weight))

    def metrics(self, procs: Any) -> dict[str, float]:
        if self.teacher is None:
            return {}
        total, tokens = procs.reduce_sum(torch.tensor(self.sums, dtype=torch.float64)).tolist()
        return {"distillation/reverse_kl": total / max(tokens, 1.0)}


class ServedTeacher:
    """A teacher behind vLLM's OpenAI-compatible server: one POST /completions a micro-batch with each row's tokens
    as the prompt and `prompt_logprobs: 0`, which returns the log-prob of every token given the ones before it (of
    the model's own distribution, temperature 1). Token ids in, so no text is tokenized twice."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None, timeout_s: float, batch: int) -> None:
        self.endpoint = JsonEndpoint(base_url, api_key_env=api_key_env, timeout_s=timeout_s, retries=2)
        self.model, self.batch = model, batch

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        n, width = rollout.completion_ids.shape
        out = torch.zeros(n, width)
        for start in range(0, n, self.batch):
            rows = range(start, min(n, start + self.batch))
            prompts, lengths = [], []
            for i in rows:
                prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
                length = int(rollout.completion_mask[i].sum())
                prompts.append(prompt + rollout.completion_ids[i, :length].tolist())
                lengths.append((len(prompt), length))
            try:
                answer = self.endpoint.post("/completions", {"model": self.model, "prompt": prompts, "max_tokens": 1,
                                                             "prompt_logprobs": 0, "temperature": 1.0})
            except RequestFailed as e:
                raise VLLMServerError(f"distillation.served: the teacher did not answer: {e}") from None
            for i, choice, (p, length) in zip(rows, answer["choices"], lengths):
                scored = choice["prompt_logprobs"][p : p + length]
                ids = rollout.completion_ids[i, :length].tolist()
                out[i, :length] = torch.tensor([step[str(t)]["logprob"] for step, t in zip(scored, ids)])
        return out

    def check_tokenizer(self, tokenizer: Any) -> None:
        """SetupError unless the server's tokenizer gives the policy's ids (vLLM's /tokenize, at the server's root)."""
        probe = "The answer is 42, ½ of 84: naïve café 東京 — ok?\n<|im_start|>"
        root = self.endpoint.url.removesuffix("/v1")
        try:
            theirs = JsonEndpoint(root, api_key_env=self.endpoint.api_key_env, timeout_s=self.endpoint.timeout_s).post(
                "/tokenize", {"model": self.model, "prompt": probe, "add_special_tokens": False})["tokens"]
        except (RequestFailed, KeyError, TypeError) as e:
            raise SetupError(f"distillation.served: could not read the teacher's tokenizer at {root}/tokenize ({e})") \
                from None
        mine = tokenizer(probe, add_special_tokens=False)["input_ids"]
        if list(theirs) != list(mine):
            raise SetupError(f"distillation.served: the teacher's tokenizer is not the policy's ({probe!r} is "
                             f"{theirs} there, {mine} here); the teacher scores the policy's tokens by id")


def build_teacher(recipe: Any, policy: Any, update: Any, device_type: str) -> Teacher:
    """The run's teacher (recipe `distillation`) beside the student's log-probs as the update takes them:
    `policy` the trainer/setup.Policy (its local teacher, its tokenizer), `update` the PolicyUpdate."""
    d = recipe.distillation

    def student(r: Rollout) -> torch.Tensor:
        return update.logps(update.model, r)

    if d is None:
        return Teacher(None, student)
    if d.served is not None:
        served = ServedTeacher(d.served.base_url, d.served.model, d.served.api_key_env, d.served.timeout_s,
                               recipe.train.micro_batch_size)
        served.check_tokenizer(policy.tokenizer)
        return Teacher(served, student, d.weight)
    forward = forward_choices(recipe, device_type, policy.teacher.config)  # it may be of another model type
    return Teacher(lambda r: update.logps(policy.teacher, r, forward, temperature=1.0), student, d.weight)
