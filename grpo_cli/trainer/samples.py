"""The update's rows: an episode split into its training samples where the chat template changed its history.

With `rollout.history_change: split`, an episode whose template renders the next turn's history differently from
the tokens so far (Qwen3's drops earlier <think> blocks once a user turn follows) continues from the template's
rendering, as a deployed model would, and its rollout row records where (`Rollout.segments`). The row's completion
holds every sampled token once; here it becomes one row per sample: the context it was sampled in as the prompt,
its own tokens (and the observations between them) as the completion, the episode's advantage broadcast to it
(per token: its own span of the row's). No token is trained twice, and the tokens trained on are the row's.

With several processes the rows are padded to the same count (rows with no trained token), so that every process
runs as many micro-batches, and as many collectives, as the others.

With train.mini_batches = k > 1 and several processes, the rows are dealt again (`dealt`): mini-batch j of every
process together is block j of the whole batch, the rows a single process trains in its j-th optimizer step, so the
weights do not depend on the process count.
"""

from __future__ import annotations

import torch

from grpo_cli.datatypes import Processes, Rollout
from grpo_cli.rollout.common import left_pad


def training_rows(rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor,
                  procs: Processes) -> tuple[Rollout, torch.Tensor, torch.Tensor]:
    """(rollout [n], adv [n] or [n, T], mask [n, T]) -> the same for the training samples [m >= n]; unchanged where
    no episode was split (and on a single process)."""
    if rollout.segments is None:  # not episodes: every process has its n rows
        return rollout, adv, mask
    if any(rollout.segments):
        rollout, adv, mask = _split(rollout, adv, mask)
    if procs.count > 1:
        most = int(procs.gather(torch.tensor([len(rollout)])).max())
        if most > len(rollout):
            rollout, adv, mask = _padded(rollout, adv, mask, most)
    return rollout, adv, mask


def keeps_rows(rollout: Rollout, procs: Processes, mini_batches: int) -> bool:
    """Whether `training_rows` and `dealt` give the rows back as they are, one to one and in order: no episode split
    into samples, no padding to another process's count, no rows dealt across processes by mini-batch."""
    unsplit = rollout.segments is None or procs.count == 1 and not any(rollout.segments)
    return unsplit and (procs.count == 1 or mini_batches == 1)


def dealt(rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor, procs: Processes,
          mini_batches: int) -> tuple[Rollout, torch.Tensor, torch.Tensor]:
    """The rows this process trains, in order, when its `mini_batches` mini-batches are its share of each block of
    the whole batch (every process's rows in process order, as many on each: `training_rows`' output); unchanged on
    one process or with one mini-batch."""
    if procs.count == 1 or mini_batches == 1:
        return rollout, adv, mask
    device = mask.device
    parts = procs.gather_rows([(rollout.to("cpu"), adv.cpu(), mask.cpu())])
    T = max(r.completion_ids.shape[1] for r, _, _ in parts)

    def right(x: torch.Tensor) -> torch.Tensor:  # [n, T'] -> [n, T], zeros after
        return torch.nn.functional.pad(x, (0, T - x.shape[1])) if x.dim() == 2 else x

    every = Rollout.cat([r for r, _, _ in parts], _pad_value(rollout))
    every.segments = None
    block = len(every) // mini_batches
    share = block // procs.count
    mine = [j * block + procs.index * share + i for j in range(mini_batches) for i in range(share)]
    index = torch.tensor(mine)
    return (every.select(mine).to(device), torch.cat([right(a) for _, a, _ in parts])[index].to(device),
            torch.cat([right(m) for _, _, m in parts])[index].to(device))


def _spans(rollout: Rollout) -> list[tuple[int, int, int, list[int] | None]]:
    """Every sample as (row, start, end, context): context None for an episode's first (its prompt); later samples
    with no token (the episode ended where it was split) are left out."""
    out = []
    for r, later in enumerate(rollout.segments):
        n = int(rollout.completion_mask[r].sum())
        starts = [0, *(int(s) for s, _ in later)]
        contexts = [None, *(list(c) for _, c in later)]
        for k, (a, context) in enumerate(zip(starts, contexts)):
            b = starts[k + 1] if k + 1 < len(starts) else n
            if k == 0 or b > a:
                out.append((r, a, b, context))
    return out


def _split(rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor) -> tuple[Rollout, torch.Tensor, torch.Tensor]:
    spans = _spans(rollout)
    pad = _pad_value(rollout)
    prompts = [rollout.prompt_ids[r][rollout.prompt_mask[r].bool()].tolist() if c is None else c for r, _, _, c in spans]
    prompt_ids, prompt_mask = left_pad(prompts, pad, rollout.prompt_ids.device)
    T = max(1, max(b - a for _, a, b, _ in spans))

    def cut(x: torch.Tensor, value) -> torch.Tensor:  # [n, T'] -> [m, T], each sample's own span
        out = torch.full((len(spans), T), value, dtype=x.dtype, device=x.device)
        for i, (r, a, b, _) in enumerate(spans):
            out[i, : b - a] = x[r, a:b]
        return out

    rows = [r for r, _, _, _ in spans]
    last = [k + 1 == len(spans) or spans[k + 1][0] != r for k, r in enumerate(rows)]  # an episode's last sample
    split = Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=cut(rollout.completion_ids, pad),
        completion_mask=cut(rollout.completion_mask, 0),
        truncated=rollout.truncated[rows] & torch.tensor(last, device=rollout.truncated.device),
        prompts=[rollout.prompts[r] for r in rows], completions=[rollout.completions[r] for r in rows],
        sampling_logps=cut(rollout.sampling_logps, 0.0) if rollout.sampling_logps is not None else None,
        weight_step=rollout.weight_step,
        observation_mask=cut(rollout.observation_mask, 0) if rollout.observation_mask is not None else None,
        turns=[rollout.turns[r] for r in rows] if rollout.turns is not None else None,
    )
    index = torch.tensor(rows, dtype=torch.long, device=adv.device)
    return split, (adv[index] if adv.dim() == 1 else cut(adv, 0.0)), cut(mask, 0)


def _padded(rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor,
            count: int) -> tuple[Rollout, torch.Tensor, torch.Tensor]:
    """`count` rows: the last row repeated with nothing trained (no completion token, advantage 0)."""
    extra = count - len(rollout)
    more = rollout.select([len(rollout) - 1] * extra)
    more.completion_mask = torch.zeros_like(more.completion_mask)
    more.truncated = torch.zeros_like(more.truncated)
    joined = Rollout.cat([rollout, more], _pad_value(rollout))
    joined.segments = None
    return (joined, torch.cat([adv, torch.zeros_like(adv[:1]).expand(extra, *adv.shape[1:])]),
            torch.cat([mask, torch.zeros_like(mask[:1]).expand(extra, *mask.shape[1:])]))


def _pad_value(rollout: Rollout) -> int:
    """The id the rollout pads with (any id would do under a zero mask; this one keeps padding uniform)."""
    padding = rollout.prompt_ids[rollout.prompt_mask == 0]
    return int(padding[0]) if len(padding) else 0
