"""Each step's batch recorded exactly, for `grpo replay` (grpo_cli/trainer/replay.py): what the update consumed, so
that the update can run again without generating.

    RUN/replay/step-N/process-I.safetensors   the rollout's tensors as the update saw them (token ids, masks,
                                              sampler log-probs, observation mask; integers in the smallest
                                              dtype that holds them) and every row's rewards
    RUN/replay/step-N/process-I.json          the rest: texts, turns and where episodes were split, rewards per
                                              function, step rewards, the prompts' columns, which rows this
                                              process holds, sampling's metrics

One pair per process (each holds its own rows). Tensors keep their dtypes, so a replayed update is the same
computation. A step is written to a temporary folder and renamed into place; a folder without its pairs is not a
record. Records are pruned with the checkpoints: a step can be replayed from the checkpoint before it, so the
records of steps up to the oldest kept checkpoint are deleted when a checkpoint is saved
(`logging.replay: false` records nothing).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout, StepBatch
from grpo_cli.run.checkpoint_io import make_readable

FOLDER = "replay"
TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "sampling_logps",
           "observation_mask")


def step_folder(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step-{step}"


def record_step(run_dir: str | Path, step: int, s: StepBatch, process: int, processes: int) -> int:
    """Write this process's part of step `step`'s batch; -> the bytes written."""
    final = step_folder(run_dir, step)
    tmp = final.with_name(f".{final.name}.process-{process}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    r = s.rollout
    tensors = {k: getattr(r, k).detach().contiguous().cpu() for k in TENSORS if getattr(r, k) is not None}
    tensors |= {"total": s.total.contiguous().cpu(), "per_function": s.per_function.contiguous().cpu()}
    dtypes = {k: str(t.dtype).removeprefix("torch.") for k, t in tensors.items()}
    save_file({k: smallest_int(t) for k, t in tensors.items()}, str(tmp / f"process-{process}.safetensors"))
    make_readable(tmp)  # safetensors writes 0600; the run's other outputs are readable
    rest = {"step": step, "process": process, "processes": processes, "dtypes": dtypes, "rows": [s.rows.start, s.rows.stop],
            "weights": s.weights, "steps": s.steps, "metrics": s.metrics,
            "rollout": {"prompts": r.prompts, "completions": r.completions, "weight_step": r.weight_step, "turns": r.turns,
                        "segments": r.segments},
            "rewards": {"total": s.rewards.total, "per_function": s.rewards.per_function, "errors": s.rewards.errors,
                        "timeouts": s.rewards.timeouts, "nonfinite": s.rewards.nonfinite, "steps": s.rewards.steps},
            "prompts": {"texts": s.prompts.texts, "input_ids": s.prompts.input_ids, "columns": s.prompts.columns,
                        "indices": s.prompts.indices}}
    (tmp / f"process-{process}.json").write_text(json.dumps(rest, default=str))
    final.mkdir(parents=True, exist_ok=True)
    written = 0
    for f in tmp.iterdir():  # several processes fill one step folder: each moves its own pair in
        written += f.stat().st_size
        os.replace(f, final / f.name)
    tmp.rmdir()
    return written


def smallest_int(t: torch.Tensor) -> torch.Tensor:
    """Integer tensors (token ids, masks) in the smallest dtype that holds their values: a lossless 2-8x saving;
    `load_step` casts them back."""
    if t.dtype not in (torch.int64, torch.int32) or t.numel() == 0:
        return t
    low, high = t.min().item(), t.max().item()
    if low >= 0 and high <= 255:
        return t.to(torch.uint8)
    if -2**31 <= low and high < 2**31:
        return t.to(torch.int32)
    return t


def recorded_steps(run_dir: str | Path) -> list[int]:
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    return sorted(int(p.name.split("-", 1)[1]) for p in folder.glob("step-*") if p.name.split("-", 1)[1].isdigit()
                  and (p / "process-0.json").is_file())


def load_step(run_dir: str | Path, step: int, process: int, device: torch.device) -> StepBatch:
    """Step `step`'s batch as this process's update saw it."""
    folder = step_folder(run_dir, step)
    rest: dict[str, Any] = json.loads((folder / f"process-{process}.json").read_text())
    tensors = {k: t.to(getattr(torch, rest["dtypes"][k])) for k, t in
               load_file(str(folder / f"process-{process}.safetensors")).items()}
    ro = rest["rollout"]
    rollout = Rollout(**{k: tensors[k].to(device) if k in tensors else None for k in TENSORS},
                      prompts=ro["prompts"], completions=ro["completions"], weight_step=ro["weight_step"], turns=ro["turns"],
                      segments=ro.get("segments"))
    rw = rest["rewards"]
    rewards = RewardResult(total=rw["total"], per_function=rw["per_function"], errors=rw["errors"], timeouts=rw["timeouts"],
                           nonfinite=rw["nonfinite"], steps=_step_rewards(rw["steps"]))
    pb = rest["prompts"]
    return StepBatch(prompts=PromptBatch(texts=pb["texts"], input_ids=pb["input_ids"], columns=pb["columns"],
                                         indices=pb["indices"]),
                     rollout=rollout, rewards=rewards, rows=range(*rest["rows"]), total=tensors["total"],
                     per_function=tensors["per_function"], weights=rest["weights"], steps=_step_rewards(rest["steps"]),
                     metrics=rest["metrics"])


def _step_rewards(saved: dict) -> dict:
    """Step rewards as JSON saved them ([token_index, reward] lists) -> (token_index, reward) tuples again."""
    return {k: [[tuple(x) for x in row] if row is not None else None for row in v] for k, v in saved.items()}


def processes_of(run_dir: str | Path, step: int) -> int:
    return int(json.loads((step_folder(run_dir, step) / "process-0.json").read_text())["processes"])


def prune(run_dir: str | Path, up_to: int) -> None:
    """Delete the records of steps <= `up_to` (no kept checkpoint precedes them any more)."""
    for step in recorded_steps(run_dir):
        if step <= up_to:
            shutil.rmtree(step_folder(run_dir, step), ignore_errors=True)
