"""An episode's record (its prompt, every token after it, the sampler's log-probs, its turns, where it was split)
and a batch of them as the trainer's Rollout; and back, for a batch in flight at an asynchronous run's checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_cli.agents.environments import EnvSpec
from grpo_cli.agents.observations import continued
from grpo_cli.datatypes import Rollout
from grpo_cli.rollout.common import left_pad


@dataclass
class Episode:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # after the prompt: sampled and observation tokens
    observed: list[int] = field(default_factory=list)  # 1 where tokens[i] is an observation token
    logps: list[float] = field(default_factory=list)  # the sampler's log-probs (0 at observations)
    turns: list[dict] = field(default_factory=list)  # {role, text, tokens}
    sampled: int = 0  # tokens the policy sampled
    done: bool = False
    truncated: bool = False
    failed: bool = False  # an environment call raised or timed out
    spec: EnvSpec | None = None  # its environment's class and contract
    # rollout.history_change: split: each later training sample's [start in tokens, the context it was sampled in]
    segments: list[list] = field(default_factory=list)
    messages: list[dict] | None = None  # the conversation so far (where the template may change its history)
    tools: list[dict] | None = None  # the tools its template is given

    def context(self) -> list[int]:
        return continued(self.prompt, self.tokens, self.segments)


class EpisodeRecords:
    """Episodes to the trainer's Rollout and back to JSON (a batch in flight at an asynchronous run's checkpoint).
    Needs `tok`, `generator` and `_sampler_logps` (whether the backend reported log-probs)."""

    def saved(self, rollout: Rollout) -> dict[str, Any]:
        """A rollout of `run` as JSON (an asynchronous run's batch in flight at a checkpoint), for `restored`."""
        pm, cm = rollout.prompt_mask.bool(), rollout.completion_mask.bool()
        rows = lambda t, m: [row[k].tolist() for row, k in zip(t, m)]  # noqa: E731
        return {"prompts": rows(rollout.prompt_ids, pm), "texts": list(rollout.prompts),
                "tokens": rows(rollout.completion_ids, cm), "observed": rows(rollout.observation_mask, cm),
                "logps": None if rollout.sampling_logps is None else rows(rollout.sampling_logps, cm),
                "turns": rollout.turns, "truncated": rollout.truncated.tolist(), "segments": rollout.segments}

    def restored(self, saved: dict[str, Any]) -> Rollout:
        """The rollout `saved` describes, token for token."""
        logps = saved["logps"] or [[0.0] * len(t) for t in saved["tokens"]]
        segments = saved.get("segments") or [[] for _ in saved["tokens"]]
        episodes = [Episode(prompt=p, tokens=t, observed=o, logps=lp, turns=turns, truncated=tr, segments=sg)
                    for p, t, o, lp, turns, tr, sg in zip(saved["prompts"], saved["tokens"], saved["observed"], logps,
                                                         saved["turns"], saved["truncated"], segments)]
        self._sampler_logps = saved["logps"] is not None
        return self._rollout(episodes, saved["texts"])

    def _rollout(self, episodes: list[Episode], texts: list[str]) -> Rollout:
        return episodes_rollout(episodes, texts, self.tok, self.generator.pad_id, self._sampler_logps)


def episodes_rollout(episodes: list[Episode], texts: list[str], tokenizer, pad: int, sampler_logps: bool) -> Rollout:
    """Episodes -> the Rollout the trainer reads: each prompt (left-padded), everything after it as the completion,
    its observation mask, its sampler log-probs (where `sampler_logps`), its turns, where it was split."""
    prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], pad)
    T = max(1, max(len(e.tokens) for e in episodes))
    ids = torch.full((len(episodes), T), pad, dtype=torch.long)
    mask = torch.zeros((len(episodes), T), dtype=torch.long)
    observed = torch.zeros((len(episodes), T), dtype=torch.long)
    logps = torch.zeros((len(episodes), T), dtype=torch.float32)
    for r, e in enumerate(episodes):
        n = len(e.tokens)
        ids[r, :n] = torch.tensor(e.tokens, dtype=torch.long)
        mask[r, :n] = 1
        observed[r, :n] = torch.tensor(e.observed, dtype=torch.long)
        logps[r, :n] = torch.tensor(e.logps, dtype=torch.float32)
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
        truncated=torch.tensor([e.truncated for e in episodes]), prompts=texts,
        completions=[tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes],
        sampling_logps=logps if sampler_logps else None, observation_mask=observed,
        turns=[e.turns for e in episodes], segments=[e.segments for e in episodes],
    )
