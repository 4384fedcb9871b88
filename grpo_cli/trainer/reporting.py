"""What a training step reports: its metrics (TRL's names where they exist), reduced over processes; its
completions (rollouts.jsonl, the console's tables); its time, region by region; and the run's logs, trackers and
console (a progress bar with ETA and a compact line every few steps). The step's clock is grpo_cli/process/clock.py's."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from grpo_cli.algo.advantages import Advantages, group_std
from grpo_cli.datatypes import Processes, StepBatch, group_of
from grpo_cli.process.clock import Clock
from grpo_cli.process.memory import peak_memory_gib
from grpo_cli.recipe.files import flat_config, recipe_to_yaml
from grpo_cli.run.folder import record_resume, report_changes
from grpo_cli.run.logs import JsonlLog, METRICS, ROLLOUTS
from grpo_cli.run.trackers import start_trackers
from grpo_cli.trainer.nonfinite import NonFiniteSteps, largest
from grpo_cli.views.summary import live_bar_works


def start_line(model_summary: str, recipe, mixed_precision: str, ref_copy: bool, sampling_copy, device,
               threads=None, sampler: str | None = None, allocator: str | None = None) -> str:
    """The line a run starts with: the policy, the precision of its forwards and sampling, the reference, the CPU
    threads (`threads`: grpo_cli/process/cpus.py's choice, on the CPU), what the sampler readied for the run (`sampler`:
    rollout.compile's compiled decoding and how long it took, or how a server gets LoRA weights), the C allocator's
    setting (`allocator`: grpo_cli/process/allocator.py's words, where it changed)."""
    ref = "none (beta = 0)" if recipe.algorithm.beta == 0 else (
        "a second copy" if ref_copy else "the base with adapters disabled (no copy)")
    forwards = f"{mixed_precision} autocast" if mixed_precision != "no" else recipe.model.dtype
    sampling = f", sampling in {str(sampling_copy.dtype).removeprefix('torch.')}" if sampling_copy is not None else ""
    cpu = f"; {threads}" if threads is not None and device.type == "cpu" else ""
    cpu += f"; {allocator}" if allocator else ""
    sampling += f"; sampling: {sampler}" if sampler else ""
    return (f"policy: {model_summary}; forwards in {forwards}{sampling}; reference: {ref}{cpu}; "
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

    def means(self, procs: Processes) -> dict[str, float]:
        """Every mean over all micro-batches and processes; each extreme over all of them (finite ones only)."""
        keys = sorted(self.sums)
        t = procs.reduce_sum(torch.tensor([[self.sums[k] for k in keys], [self.counts[k] for k in keys]],
                                          dtype=torch.float64))
        out = {k: (t[0, i] / t[1, i]).item() if t[1, i] > 0 else float("nan") for i, k in enumerate(keys)}
        for k in sorted(self.extremes):
            v = procs.gather(torch.tensor([self.extremes[k]], dtype=torch.float64))
            out[k] = (v.min() if self.low[k] else v.max()).item()
        return {k: v for k, v in out.items() if math.isfinite(v)}


class StepReport:
    """What a step reports: `__call__` assembles its metrics and writes its completions (rollouts.jsonl, the
    console's table of the first few)."""

    def __init__(self, recipe, procs: Processes, device: torch.device, stream, rollout_log: JsonlLog | None,
                 console: Console, nonfinite: NonFiniteSteps) -> None:
        self.recipe, self.procs, self.device, self.stream = recipe, procs, device, stream
        self.rollout_log, self.console, self.nonfinite = rollout_log, console, nonfinite
        self.G = recipe.algorithm.num_generations
        self.optimizer_steps = recipe.algorithm.num_iterations * recipe.train.mini_batches  # a step's

    def __call__(self, step: int, s: StepBatch, adv: Advantages, sums: MetricSums, clock: Clock,
                 extra: dict[str, float]) -> dict[str, Any]:
        """The metrics of step `step`; `extra`: what the step's other parts measured (reward models, reference)."""
        times = clock.times()
        m = step_metrics(s, adv, sums, times, G=self.G, procs=self.procs)
        m["epoch"] = self.stream.state_dict()["epoch"]
        m |= self.stream.metrics()  # data.curriculum: rows passed over, rows marked
        m |= adv.stats | s.metrics | extra
        m["memory/peak_gib"] = peak_memory_gib(self.device)  # this process's
        m |= self.nonfinite.end_step(step)  # optimizer steps skipped for a NaN or infinite loss or gradient
        if warning := self.nonfinite.warning(step, self.optimizer_steps, largest(s, adv.outcome)):
            self.console.print(warning)
        logging = self.recipe.logging
        if logging.rollouts or logging.num_completions_to_print:  # every process gathers; the main one writes
            records = rollout_records(step, s, adv, self.G, self.procs)
            if self.rollout_log is not None and logging.rollouts:
                self.rollout_log.write_many(records)
            self.console.completions(step, records[: logging.num_completions_to_print])
        return m


def _nan_stats(x: torch.Tensor) -> tuple[float, float]:
    v = x[~torch.isnan(x)]
    if v.numel() == 0:
        return float("nan"), float("nan")
    return v.mean().item(), (v.std().item() if v.numel() > 1 else 0.0)


def shown_rewards(s: StepBatch) -> torch.Tensor:
    """[N] each completion's reward as logged: the weighted outcome rewards (`total`, what the outcome advantages
    are computed from) plus each step-level reward's weighted mean step reward; NaN where nothing scored it."""
    if not s.steps:
        return s.total
    stepwise = [k for k, name in enumerate(s.rewards.per_function) if name in s.steps]
    w = torch.tensor([s.weights[k] for k in stepwise], dtype=torch.float32)
    parts = torch.cat([s.total[:, None], s.per_function[:, stepwise] * w], dim=1)  # [N, 1 + steps]
    return torch.where(torch.isnan(parts).all(dim=1), torch.full_like(s.total, math.nan), parts.nansum(dim=1))


def step_metrics(s: StepBatch, adv: Advantages, sums: MetricSums, times: dict[str, float], *, G: int,
                 procs: Processes) -> dict[str, Any]:
    """Reward, length and update statistics of a step; `adv`: the advantages the update trained with."""
    rollout, rewards, shown = s.rollout, s.rewards, shown_rewards(s)
    m: dict[str, Any] = {}
    m["reward"], _ = _nan_stats(shown)
    m["reward_std"] = group_std(shown, G).mean().item()
    m["frac_reward_zero_std"] = 1 - adv.signal.float().mean().item()
    for k, name in enumerate(rewards.per_function):
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = _nan_stats(s.per_function[:, k])
    for kind, counts in (("errors", rewards.errors), ("timeouts", rewards.timeouts), ("nonfinite", rewards.nonfinite),
                         ("failed", rewards.failed)):
        for name in rewards.per_function:
            c = procs.total(counts.get(name, 0))
            if c:
                m[f"rewards/{name}/{kind}"] = c
    lengths = procs.gather(rollout.trained_mask().sum(1).float().cpu())  # sampled tokens: observations do not count
    truncated = procs.gather(rollout.truncated.float().cpu())
    if rollout.turns is not None:  # multi-turn episodes: assistant turns each
        turns = procs.gather(torch.tensor([float(sum(t["role"] == "assistant" for t in ts)) for ts in rollout.turns]))
        m["turns/mean"], m["turns/max"] = turns.mean().item(), turns.max().item()
    terminated = lengths[truncated == 0]
    m["completions/mean_length"] = lengths.mean().item()
    m["completions/min_length"] = lengths.min().item()
    m["completions/max_length"] = lengths.max().item()
    m["completions/clipped_ratio"] = truncated.mean().item()
    m["completions/mean_terminated_length"] = terminated.mean().item() if terminated.numel() else 0.0
    m["advantages/abs_mean"] = procs.gather(adv.per_completion(rollout.trained_mask())[1].cpu()).mean().item()
    m.update(_finite(sums.means(procs)))
    m.update(times)
    if "time/generate" in times:  # (a replayed step samples nothing)
        m["throughput/gen_tokens_per_s"] = lengths.sum().item() / max(times["time/generate"], 1e-9)
    return m


def _finite(means: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in means.items() if not (isinstance(v, float) and math.isnan(v))}


def rollout_records(step: int, s: StepBatch, adv: Advantages, G: int, procs: Processes) -> list[dict[str, Any]]:
    """One JSON record per completion (input of `grpo inspect-rollouts`), every process's, in row order: its
    reward as logged (`shown_rewards`) and its advantage as trained (`Advantages.per_completion`)."""
    batch, rollout, rewards, total, rows = s.prompts, s.rollout, s.rewards, shown_rewards(s), s.rows
    lengths = rollout.trained_mask().sum(1).tolist()
    advantages = adv.per_completion(rollout.trained_mask())[0].tolist()
    records = []
    for j, i in enumerate(rows):
        b = group_of(i, G)
        records.append({
            "step": step, "group": b, "sample": i % G, "data_index": batch.indices[b],
            "prompt": rollout.prompts[j], "answer": batch.columns.get("answer", [None] * len(batch))[b],
            "completion": rollout.completions[j],
            "rewards": {name: col[j] for name, col in rewards.per_function.items()},
            "reward": total[i].item(), "advantage": advantages[j],
            "length": int(lengths[j]), "truncated": bool(rollout.truncated[j]),
            **({"steps": {name: [list(x) for x in col[j] or []] for name, col in rewards.steps.items()}}
               if rewards.steps else {}),
            **({"turns": rollout.turns[j]} if rollout.turns is not None else {}),
        })
    return procs.gather_rows(records)


# (metric key, label, format) shown in the one-line step summary, when present
CONSOLE_FIELDS = [
    ("reward", "reward", "{:.3f}"),
    ("reward_std", "±", "{:.3f}"),
    ("frac_reward_zero_std", "zero-std", "{:.2f}"),
    ("kl", "kl", "{:.4f}"),
    ("entropy", "ent", "{:.2f}"),
    ("clip_ratio/region_mean", "clip", "{:.3f}"),
    ("completions/mean_length", "len", "{:.1f}"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("time/step", "s/step", "{:.1f}"),
    ("eval/accuracy", "eval acc", "{:.3f}"),
]


def format_step_line(step: int, max_steps: int, m: dict[str, Any]) -> str:
    parts = [f"step {step}/{max_steps}"]
    parts += [f"{label} {fmt.format(m[k])}" for k, label, fmt in CONSOLE_FIELDS if isinstance(m.get(k), (int, float))]
    parts += [f"{k.split('/')[1]} {m[k]:.3f}" for k in m if k.startswith("rewards/") and k.endswith("/mean")]
    return " | ".join(parts)


class Console:
    """Live progress bar with ETA plus a compact line every `every` steps (main process only)."""

    def __init__(self, max_steps: int, start_step: int, every: int, enabled: bool) -> None:
        self.enabled, self.every, self.max_steps = enabled, every, max_steps
        if not enabled:
            return
        from rich.console import Console as RichConsole
        from rich.progress import (
            BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
        )

        self.console = RichConsole(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True,
        )
        self.task = self.progress.add_task("train", total=max_steps, completed=start_step)
        self.live = live_bar_works(self.console)
        if self.live:
            self.progress.start()

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False, soft_wrap=True)

    def completions(self, step: int, records: list[dict[str, Any]]) -> None:
        """A table of a step's first completions (logging.num_completions_to_print, TRL's log_completions)."""
        if not self.enabled or not records or step % self.every:
            return
        from rich.table import Table

        table = Table(title=f"step {step}: {len(records)} completions", show_lines=True)
        for column in ("prompt", "completion", "reward", "advantage"):
            table.add_column(column, overflow="fold")
        for r in records:
            prompt = r["prompt"] if len(r["prompt"]) <= 200 else "..." + r["prompt"][-197:]
            table.add_row(prompt, r["completion"], f"{r['reward']:.3f}", f"{r['advantage']:+.3f}")
        self.console.print(table)

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.progress.update(self.task, completed=step)
        if step % self.every == 0 or step == self.max_steps:
            self.console.print(format_step_line(step, self.max_steps, metrics), highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.enabled and self.live:
            self.progress.stop()


def open_run_logs(run_dir: Path, recipe, start_step: int, checkpoint_path: Path | None, changes: dict, accelerator):
    """The run's recipe.yaml, metrics.jsonl and rollouts.jsonl (main process; lines after `start_step` written by
    an interrupted run are dropped and counted), its trackers, and its console -> (metrics, rollouts, console)."""
    main = accelerator.is_main_process
    metrics_log = rollout_log = None
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "recipe.yaml").write_text(recipe_to_yaml(recipe))
        if checkpoint_path is not None:
            record_resume(run_dir, checkpoint_path, start_step + 1, changes)
        if changes:
            report_changes(run_dir, checkpoint_path, start_step + 1, changes)
        metrics_log = JsonlLog(run_dir / METRICS, start_step)
        if recipe.logging.rollouts:
            rollout_log = JsonlLog(run_dir / ROLLOUTS, start_step)
        for log in (metrics_log, rollout_log):
            if log is not None and log.dropped:  # written after the checkpoint by the run that was interrupted
                print(f"{log.path.name}: dropped {log.dropped} lines of steps after {start_step}, "
                      f"logged after the checkpoint {checkpoint_path} was saved")
    if recipe.logging.trackers:  # the same tracker runs as before a resume (grpo_cli/run/trackers.py)
        start_trackers(accelerator, recipe.name, flat_config(recipe.model_dump(mode="json")), run_dir, start_step,
                       recipe.logging.trackers)
    return metrics_log, rollout_log, Console(recipe.train.max_steps, start_step, recipe.logging.every_steps, main)
