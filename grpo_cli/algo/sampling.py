"""The policy that samples: temperature, then min-p, top-k and top-p (vLLM's order), and its log-probs.

With truncation the sampling policy is pi(. | T) kept to a set K of tokens and renormalised,
pi_K(t) = pi(t | T) / S with S the mass of K. vLLM's processed log-probs are log pi_K; the hf backend samples
through `TruncatedSampling`, which applies the same rule; and the trainer replays K on its own logits before the
log-softmax (`truncated_logps`). So every log-prob the loss compares (policy, old policy, reference, sampler) is of
pi_K: without the replay, pi_train / pi_sampler carries a factor S on every token (trl#6789).

The kept set of one position, from temperature-scaled logits x (ties at a boundary are kept, as in vLLM):
  min_p: drop the tokens with softmax(x) < min_p * max softmax(x);
  top_k: drop the tokens below the k-th largest logit;
  top_p: of what is left, sorted by probability, drop the smallest whose cumulative mass is <= 1 - top_p (the most
         probable token always stays).
The trainer also keeps the token that was sampled: a token at the boundary that the sampler kept stays kept when
the trainer's logits differ from the sampler's by float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Truncation:
    """rollout.top_k / top_p / min_p: None, 1 and None (or 0) switch each off."""

    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None

    @property
    def active(self) -> bool:
        return self.top_k is not None or self.top_p < 1.0 or bool(self.min_p)


@torch.no_grad()
def kept_mask(x: torch.Tensor, t: Truncation, keep: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] temperature-scaled logits -> bool [..., V]: True for the tokens truncated sampling can draw.
    `keep` [...] (token ids): kept whatever the rule says."""
    x = x.float()
    removed = torch.zeros_like(x, dtype=torch.bool)
    if t.min_p:
        probs = x.softmax(-1)
        removed |= probs < probs.amax(-1, keepdim=True) * t.min_p
    if t.top_k is not None and t.top_k < x.shape[-1]:
        removed |= x < x.topk(t.top_k, dim=-1).values[..., -1:]
    if t.top_p < 1.0:
        ranked, order = x.masked_fill(removed, float("-inf")).sort(dim=-1)  # ascending
        drop = ranked.softmax(-1).cumsum(-1) <= 1 - t.top_p
        drop[..., -1] = False  # the most probable token
        removed |= torch.zeros_like(removed).scatter(-1, order, drop)
    if keep is not None:
        removed.scatter_(-1, keep.unsqueeze(-1), False)
    return ~removed


def truncated_logps(logits: torch.Tensor, ids: torch.Tensor, temperature: float, t: Truncation | None) -> torch.Tensor:
    """[..., V] logits, [...] token ids -> [...] fp32 log pi_K(id | T); with `t` None or inactive, of pi(. | T)."""
    x = logits.float() / temperature
    if t is not None and t.active:
        x = x.masked_fill(~kept_mask(x.detach(), t, keep=ids), float("-inf"))
    return torch.gather(x, -1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


class TruncatedSampling:
    """A transformers logits processor that turns scores into pi_K's logits: / temperature, then -inf outside K.
    `generate` runs it with its own temperature and truncation switched off, so it samples pi_K exactly."""

    def __init__(self, temperature: float, t: Truncation) -> None:
        self.temperature, self.t = temperature, t

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        x = scores.float() / self.temperature
        return x.masked_fill(~kept_mask(x, self.t), float("-inf"))


class InverseCDFDraw:
    """A transformers logits processor that draws the next token itself, from softmax(scores / temperature), with one
    uniform per row against the running sum of the probabilities, and leaves that token the only finite score, so
    that `generate`, told to decode greedily, takes it.

    The tokens drawn have the distribution `torch.multinomial` draws from (inverse transform sampling: token i when
    u * total falls in [cdf_{i-1}, cdf_i), a token of probability 0 never), but the draw costs one pass over the
    vocabulary (the running sum) and one random number a row, where `multinomial` draws an exponential for every
    entry of the vocabulary (9% of float32 sampling's time on the CPU: bench/RESULTS.md). It runs last: the
    processors before it (penalties, truncation, the sampler's log-probs) see the scores `multinomial` would."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        cdf = probs.cumsum_(dim=-1)
        total = cdf[:, -1:].contiguous()
        if not torch.isfinite(total).all():  # the message torch.multinomial gives, which the generator names
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        u = torch.rand(total.shape, device=scores.device, dtype=cdf.dtype) * total
        # u * total can round up to total: the last token with mass is then the one drawn
        drawn = torch.minimum(torch.searchsorted(cdf, u, right=True), torch.searchsorted(cdf, total))
        return torch.full_like(scores, float("-inf")).scatter_(-1, drawn, 0.0)
