"""Step metrics (TRL's names where they exist) and rollout records, reduced over processes."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable

import torch

from grpo_cli.algo.advantages import group_std
from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout, group_of


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocator peak on a GPU, peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def settle(device: torch.device) -> None:
    """Wait for the kernels queued on a GPU, so that the timer read next counts them (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_line(model_summary: str, recipe, mixed_precision: str, ref_copy: bool, sampling_copy, device) -> str:
    """The line a run starts with: the policy, the precision of its forwards and sampling, the reference."""
    ref = "none (beta = 0)" if recipe.algorithm.beta == 0 else (
        "a second copy" if ref_copy else "the base with adapters disabled (no copy)")
    forwards = f"{mixed_precision} autocast" if mixed_precision != "no" else recipe.model.dtype
    sampling = f", sampling in {str(sampling_copy.dtype).removeprefix('torch.')}" if sampling_copy is not None else ""
    return (f"policy: {model_summary}; forwards in {forwards}{sampling}; reference: {ref}; "
            f"peak memory {peak_memory_gib(device):.2f} GiB")


class MetricSums:
    """Running sums for means that must be exact over micro-batches and processes."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}
        self.low: dict[str, bool] = {}

    def add_tokens(self, key: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        m = mask.to(values.dtype)
        self.sums[key] += (values * m).sum().item()
        self.counts[key] += m.sum().item()

    def add_weighted(self, key: str, mean: float, weight: float) -> None:
        self.sums[key] += mean * weight
        self.counts[key] += weight

    def add_scalar(self, key: str, value: float) -> None:
        self.add_weighted(key, value, 1.0)

    def add_extremes(self, key: str, values: torch.Tensor, mask: torch.Tensor, low: bool = False) -> None:
        """Running max (or min, `low`) over active tokens."""
        active = values[mask.bool()]
        # every process must hold every key (the reduction gathers them): +-inf where nothing was active
        v = (active.min() if low else active.max()).item() if active.numel() else (math.inf if low else -math.inf)
        old = self.extremes.get(key)
        self.extremes[key] = v if old is None else (min(old, v) if low else max(old, v))
        self.low[key] = low

    def means(self, accelerator) -> dict[str, float]:
        keys = sorted(self.sums)
        t = torch.tensor([[self.sums[k] for k in keys], [self.counts[k] for k in keys]], dtype=torch.float64)
        if accelerator.num_processes > 1:
            t = accelerator.reduce(t.to(accelerator.device), reduction="sum").cpu()
        out = {k: (t[0, i] / t[1, i]).item() if t[1, i] > 0 else float("nan") for i, k in enumerate(keys)}
        for k in sorted(self.extremes):
            v = torch.tensor([self.extremes[k]], dtype=torch.float64)
            if accelerator.num_processes > 1:
                v = accelerator.gather(v.to(accelerator.device)).cpu()
            out[k] = (v.min() if self.low[k] else v.max()).item()
        return {k: v for k, v in out.items() if math.isfinite(v)}


def _nan_stats(x: torch.Tensor) -> tuple[float, float]:
    v = x[~torch.isnan(x)]
    if v.numel() == 0:
        return float("nan"), float("nan")
    return v.mean().item(), (v.std().item() if v.numel() > 1 else 0.0)


def _column(values: list[float | None]) -> torch.Tensor:
    return torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)


def step_metrics(
    rollout: Rollout, rewards: RewardResult, total: torch.Tensor, advantages: torch.Tensor, sums: MetricSums,
    times: dict[str, float], *, G: int, gather: Callable[[torch.Tensor], torch.Tensor], accelerator, epoch: int,
) -> dict[str, Any]:
    """Everything logged for a step; `total` and `advantages` are already global [N]; `rollout` and `rewards`
    are this process's rows, `gather` concatenates a tensor over processes."""
    stds = group_std(total, G)
    m: dict[str, Any] = {}
    m["reward"], _ = _nan_stats(total)
    m["reward_std"] = stds.mean().item()
    m["frac_reward_zero_std"] = (stds < 1e-6).float().mean().item()
    for name, col in rewards.per_function.items():
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = _nan_stats(gather(_column(col)))
    for kind, counts in (("errors", rewards.errors), ("timeouts", rewards.timeouts), ("nonfinite", rewards.nonfinite)):
        for name in rewards.per_function:
            c = gather(torch.tensor([float(counts.get(name, 0))])).sum().item()
            if c:
                m[f"rewards/{name}/{kind}"] = c
    lengths = gather(rollout.trained_mask().sum(1).float().cpu())  # sampled tokens: observations do not count
    truncated = gather(rollout.truncated.float().cpu())
    if rollout.turns is not None:  # multi-turn episodes: assistant turns each
        turns = gather(torch.tensor([float(sum(t["role"] == "assistant" for t in ts)) for ts in rollout.turns]))
        m["turns/mean"], m["turns/max"] = turns.mean().item(), turns.max().item()
    terminated = lengths[truncated == 0]
    m["completions/mean_length"] = lengths.mean().item()
    m["completions/min_length"] = lengths.min().item()
    m["completions/max_length"] = lengths.max().item()
    m["completions/clipped_ratio"] = truncated.mean().item()
    m["completions/mean_terminated_length"] = terminated.mean().item() if terminated.numel() else 0.0
    m["advantages/abs_mean"] = advantages.abs().mean().item()
    m.update(_finite(sums.means(accelerator)))
    m.update(times)
    m["throughput/gen_tokens_per_s"] = lengths.sum().item() / max(times["time/generate"], 1e-9)
    m["epoch"] = epoch
    return m


def episode_metrics(counts: dict[str, int], rollout_cfg, total: Callable[[float], float]) -> dict[str, float]:
    """Multi-turn counters of this process (EpisodeRunner.take_counts) -> the step's metrics; `total` sums a
    number over processes. tools/call_frequency: tool calls per episode; tools/failure_frequency: the share of
    calls that failed (malformed, unknown tool, an exception, a timeout)."""
    m: dict[str, float] = {}
    if rollout_cfg.environment is not None:
        m["environment/errors"], m["environment/timeouts"] = total(counts["errors"]), total(counts["timeouts"])
    if rollout_cfg.tools:
        calls, episodes = total(counts["tool_calls"]), total(counts["episodes"])
        m["tools/call_frequency"] = calls / max(episodes, 1.0)
        m["tools/failure_frequency"] = total(counts["tool_failures"]) / calls if calls else 0.0
    return m


def _finite(means: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in means.items() if not (isinstance(v, float) and math.isnan(v))}


def rollout_records(
    step: int, batch: PromptBatch, rollout: Rollout, rewards: RewardResult, total: torch.Tensor,
    advantages: torch.Tensor, *, G: int, rows: range, num_processes: int,
) -> list[dict[str, Any]]:
    """One JSON record per completion (input of `grpo inspect-rollouts`), gathered to the main process;
    `rows`: this process's rows of the B*G, whose completions `rollout` holds."""
    from accelerate.utils import gather_object

    lengths = rollout.trained_mask().sum(1).tolist()
    records = []
    for j, i in enumerate(rows):
        b = group_of(i, G)
        records.append({
            "step": step, "group": b, "sample": i % G, "data_index": batch.indices[b],
            "prompt": rollout.prompts[j], "answer": batch.columns.get("answer", [None] * len(batch))[b],
            "completion": rollout.completions[j],
            "rewards": {name: col[j] for name, col in rewards.per_function.items()},
            "reward": total[i].item(), "advantage": advantages[i].item(),
            "length": int(lengths[j]), "truncated": bool(rollout.truncated[j]),
            **({"steps": {name: [list(x) for x in col[j] or []] for name, col in rewards.steps.items()}}
               if rewards.steps else {}),
            **({"turns": rollout.turns[j]} if rollout.turns is not None else {}),
        })
    if num_processes > 1:
        records = gather_object(records)
    return records
