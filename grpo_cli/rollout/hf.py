"""Rollouts with transformers `generate`: one call for all B*G sequences of a generation batch."""

from __future__ import annotations

import torch

from grpo_cli.datatypes import Rollout, completion_lists
from grpo_cli.recipe import RolloutConfig


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


class HFGenerator:
    """Sampling with the policy itself; nothing to sync after an optimizer step."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig, synced: bool = False) -> None:
        # synced: the weights are sharded over processes (FSDP, ZeRO-3); a process whose sequences are done
        # keeps running forwards until every process is done, or the others would wait forever
        self.model, self.tokenizer, self.cfg, self.synced = model, tokenizer, cfg, synced
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def sleep(self) -> None:
        """Only the colocated vLLM engine frees memory during the update."""

    def wake_up(self) -> None:
        pass

    def sync_weights(self, model) -> float:
        """Nothing to do: this backend samples with the trained model itself."""
        return 0.0

    def close(self) -> None:
        pass

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
        temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
    ) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows.

        The engine passes rows already repeated G times (n=1) when the rows of a group are split
        over processes; n > 1 repeats here. `greedy` and the other keywords are for evaluation."""
        from transformers import GenerationConfig

        rows = [p for p in prompt_ids for _ in range(n)]
        device = next(self.model.parameters()).device
        ids, mask = left_pad(rows, self.pad_id, device)
        c = self.cfg
        sampling = {} if greedy else dict(
            temperature=temperature or c.temperature, top_p=top_p or c.top_p, top_k=c.top_k or 0, min_p=c.min_p,
        )
        gen_cfg = GenerationConfig(
            do_sample=not greedy, **sampling, repetition_penalty=c.repetition_penalty,
            max_new_tokens=max_new_tokens or c.max_completion_length,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True,
        )
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg, synced_gpus=self.synced)
        self.model.train(was_training)
        completion_ids = out[:, ids.shape[1] :]
        cmask, truncated = completion_mask_from_eos(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(cmask == 0, self.pad_id)
        return build_rollout(prompt_ids, prompts, n, completion_ids, cmask, truncated, self.tokenizer, self.pad_id)
