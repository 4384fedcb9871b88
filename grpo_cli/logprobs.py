"""Per-token log-probs of completion tokens under a causal LM.

Only completion positions get logits (`logits_to_keep`), and the fp32 log-softmax runs over small
row chunks under activation checkpointing, so a [b, T, V] fp32 tensor never exists, not even for
the backward pass (the bf16/fp32 logits of the micro-batch are the only full-vocabulary tensor).
Logits are divided by the sampling temperature: the policy that sampled is pi(. | T), and the
ratio pi/pi_old must compare the same distribution (TRL does the same).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, L] 0/1 mask with left padding -> positions counting from the first real token (as generate does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _chunk_logps(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float() / temperature  # [c, T, V] fp32, one chunk only
    return torch.gather(x, -1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


@torch.no_grad()
def _chunk_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    x = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(x.exp() * x).sum(-1)


def token_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [b, P]
    prompt_mask: torch.Tensor,  # [b, P]
    completion_ids: torch.Tensor,  # [b, T]
    completion_mask: torch.Tensor,  # [b, T]
    *,
    temperature: float = 1.0,
    chunk_rows: int = 1,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> logps [b, T] (fp32) and, if asked, per-token entropy [b, T] (no grad)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    T = completion_ids.shape[1]
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1]  # [b, T, V]: position t predicts completion token t
    logps = logps_from_logits(logits, completion_ids, temperature, chunk_rows)
    entropy = None
    if with_entropy:
        entropy = torch.cat([_chunk_entropy(lg, temperature) for lg in logits.detach().split(chunk_rows)])
    return logps, entropy


def logps_from_logits(logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_rows: int = 1) -> torch.Tensor:
    """[b, T, V] logits (any dtype), [b, T] ids -> [b, T] fp32 log-probs, fp32 one chunk of rows at a time.

    `split` (not slicing) lets autograd assemble the logits gradient once, instead of a full-size
    zero tensor per chunk; under grad the fp32 chunk is recomputed in backward instead of kept."""
    grad = torch.is_grad_enabled() and logits.requires_grad
    out = []
    for lg, tok in zip(logits.split(chunk_rows), ids.split(chunk_rows)):
        if grad:
            out.append(checkpoint(_chunk_logps, lg, tok, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logps(lg, tok, temperature))
    return torch.cat(out)
