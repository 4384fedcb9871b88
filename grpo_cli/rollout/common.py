"""What every rollout backend shares: padding, EOS handling, per-request seeds, the Rollout they return."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_cli.datatypes import Rollout, completion_lists


@dataclass
class Samples:
    """What `Generator.sample` returns: each sequence's new tokens (multi-turn episodes continue from them)."""

    tokens: list[list[int]]  # up to and including the EOS, at most the row's budget
    logps: list[list[float]] | None  # the sampler's log-probs of `tokens`, where it reports them
    finished: list[bool]  # ended with EOS within its budget


def samples_from(tokens: list[list[int]], logps: list[list[float]] | None, budgets: list[int],
                 eos_ids: list[int]) -> Samples:
    """Sampled token lists (and log-probs) -> Samples: each row up to and including its first EOS, at most its
    budget; finished where that EOS came within the budget."""
    eos, out_tokens, out_logps, finished = set(eos_ids), [], [] if logps is not None else None, []
    for r, (toks, budget) in enumerate(zip(tokens, budgets, strict=True)):
        end = next((k + 1 for k, t in enumerate(toks) if t in eos), None)
        keep = min(end if end is not None else len(toks), budget)
        out_tokens.append(list(toks[:keep]))
        finished.append(end is not None and end <= budget)
        if out_logps is not None:
            row = list(logps[r][:keep]) if logps[r] else []
            out_logps.append(row + [0.0] * (keep - len(row)))
    return Samples(out_tokens, out_logps, finished)


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged token lists -> [n, L] ids and 0/1 mask, padded on the left."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, L - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, L - len(s) :] = 1
    return ids.to(device), mask.to(device)


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, T] -> mask [n, T] (1 up to and including the first EOS) and truncated [n] (no EOS at all)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    T = completion_ids.shape[1]
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], T, dtype=torch.long))
    mask = (torch.arange(T, device=completion_ids.device)[None] <= first[:, None]).long()
    return mask, ~is_eos.any(1)


def build_rollout(
    prompt_ids: list[list[int]], prompts: list[str], n: int, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
    truncated: torch.Tensor, tokenizer, pad_id: int, sampling_logps: torch.Tensor | None = None,
) -> Rollout:
    """Every backend's last step: left-padded prompts repeated n times, decoded completions, one Rollout."""
    ids, mask = left_pad([p for p in prompt_ids for _ in range(n)], pad_id, completion_ids.device)
    texts = tokenizer.batch_decode(completion_lists(completion_ids, completion_mask), skip_special_tokens=True)
    return Rollout(
        prompt_ids=ids, prompt_mask=mask, completion_ids=completion_ids, completion_mask=completion_mask,
        truncated=truncated, prompts=[p for p in prompts for _ in range(n)], completions=texts,
        sampling_logps=sampling_logps,
    )


def eos_token_ids(model, tokenizer) -> list[int]:
    """EOS ids of the generation config (chat models often list several) plus the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def pad_id_of(tokenizer, eos_ids: list[int]) -> int:
    """The tokenizer's pad id, else the first EOS id."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


def pad_completions(tokens: list[list[int]], logps: list[list[float]] | None, pad_id: int, eos_ids: list[int],
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled token lists (and their log-probs) -> ids [N, T] (pad after the first EOS), mask [N, T] (1 up to and
    including it), log-probs [N, T] float32 (0 where masked, or where the sampler gave none)."""
    T = max(1, max(len(t) for t in tokens))
    ids = torch.full((len(tokens), T), pad_id, dtype=torch.long)
    out = torch.zeros((len(tokens), T), dtype=torch.float32)
    for r, toks in enumerate(tokens):
        ids[r, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        if logps is not None and logps[r]:
            out[r, : len(logps[r])] = torch.tensor(logps[r], dtype=torch.float32)
    mask, _ = completion_mask_from_eos(ids, eos_ids)
    return ids.masked_fill(mask == 0, pad_id), mask, out * mask


def request_seed(seed: int, calls: int, offset: int = 0) -> int:
    """The sampling seed of a request: a function of (run seed, generate calls so far, prompt offset) only,
    so a rerun, or a resumed run that restored `calls`, samples the same tokens."""
    return (seed * 1_000_003 + calls * 100_003 + offset) % 2**31


class GenerationConfigOf:
    """Just enough of a model for `eos_token_ids`: a folder's generation_config.json, if it has one."""

    def __init__(self, model_dir: str) -> None:
        from transformers import GenerationConfig

        try:
            self.generation_config = GenerationConfig.from_pretrained(model_dir)
        except (OSError, ValueError):  # none there (a hub id offline, a folder without one): the tokenizer's EOS
            self.generation_config = None
