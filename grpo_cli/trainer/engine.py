"""The training loop: DeepSeekMath's Algorithm 1 (arXiv:2402.03300) on accelerate-managed devices.

`train_step` is one iteration of its inner loop: B prompts -> B*G completions -> rewards -> group-relative
advantages -> mu clipped policy updates, then the outer loop's reference refresh and the last line's reward-model
update. Every choice a recipe makes lives behind a name the loop calls: the rollouts (backends, episodes, batches
sampled ahead, dynamic sampling, a replay's records), the advantage estimator, the loss, the reference, the reward
models, the step's report. The generation batch (rows of a group contiguous) is split evenly over processes.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate import Accelerator

from grpo_cli.algo.advantages import step_advantages
from grpo_cli.algo.losses import trained_mask
from grpo_cli.data.epochs import with_epoch_steps
from grpo_cli.datatypes import StepBatch
from grpo_cli.eval.evaluate import evaluate_during_training
from grpo_cli.models.loading import quiet_libraries, resolve_mixed_precision
from grpo_cli.process.allocator import keep_freed_memory
from grpo_cli.process.clock import Clock
from grpo_cli.process.cpus import SlowSteps, apply_threads
from grpo_cli.process.watchdog import Watchdog, phase
from grpo_cli.recipe.schema import Recipe
from grpo_cli.rewards.rm_update import RewardModelUpdates
from grpo_cli.rollout.protocol import Rollouts
from grpo_cli.rollout.rollouts import build_rollouts
from grpo_cli.run.checkpoints import list_checkpoints, step_of
from grpo_cli.run.replays import prune, record_step
from grpo_cli.run.statefiles import seed_process
from grpo_cli.run.trackers import tracker_folders
from grpo_cli.trainer.distributed import Collectives, process_rows
from grpo_cli.trainer.nonfinite import check_weights
from grpo_cli.trainer.reporting import StepReport, open_run_logs, start_line
from grpo_cli.trainer.setup import build_policy, build_stream, start_from
from grpo_cli.trainer.teacher import build_teacher
from grpo_cli.trainer.state import OptimizerState, ProcessRNG, RunState, restore_run, save_run
from grpo_cli.trainer.update import PolicyUpdate, Reference


class Engine:
    """One training run: its policy, rollouts, update, logs and checkpoints."""

    def __init__(self, recipe: Recipe, run_dir: str | Path, resume: str | None = None, *, start_over: bool = False,
                 allow_recipe_change: bool = False, rewind: bool = False,
                 rollouts: Callable[..., Rollouts] = build_rollouts, record: bool = True,
                 own_process: bool = False) -> None:
        """`start_over`, `allow_recipe_change`, `rewind`: the CLI's --start-over, --allow-recipe-change and --rewind
        (grpo_cli/run/folder.py). `rollouts`: what builds the run's rollouts, called with `build_rollouts`'s
        keywords once the policy exists (`grpo replay`: the recorded ones); `record`: False leaves logging.replay's
        records unwritten (a replay's steps are the run's records already); `own_process`: the process is `grpo
        train`'s own, whose allocator train.keep_freed_memory may set (grpo_cli/process/allocator.py). The caller
        holds the run folder: `grpo train` and `grpo_cli.train` take its lock in grpo_cli/preflight/prepare.py's
        prepare_run, before anything loads."""
        recipe = with_epoch_steps(recipe)  # train.epochs: steps from the data (done by prepare_run for a command)
        self.recipe, self.run_dir, self._records = recipe, Path(run_dir), record and recipe.logging.replay
        self._setup(resume, start_over, allow_recipe_change, rewind, rollouts, own_process)

    def _setup(self, resume: str | None, start_over: bool, allow_recipe_change: bool, rewind: bool,
               build_rollouts: Callable[..., Rollouts], own_process: bool) -> None:
        """Everything a step needs, in the order that fixes what every RNG draws (grpo_cli/trainer/setup.py)."""

        quiet_libraries()
        r, t = self.recipe, self.recipe.train
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # the run's processes on this machine share its cores
        self.threads = apply_threads(t.threads, local) if t.threads is not None else None
        self.mixed_precision = resolve_mixed_precision(t.mixed_precision, r.model.dtype)
        self.accelerator = acc = Accelerator(mixed_precision=self.mixed_precision, log_with=r.logging.trackers or None,
                                             project_config=tracker_folders(self.run_dir))
        self.allocator = keep_freed_memory(t.keep_freed_memory, acc.device.type, own_process)  # before the model
        self.procs = Collectives(acc)
        self.rows = process_rows(acc, r)  # this process's slice of the B*G completion rows
        self.checkpoint_path, self.recipe_changes = start_from(self.run_dir, resume, start_over, allow_recipe_change,
                                                                r, acc, rewind)
        torch.manual_seed(t.seed)  # fresh LoRA adapters (peft draws lora_A at random): same on every run and rank
        p = build_policy(r, acc, self.checkpoint_path)
        self.policy, self.optimizer, self.scheduler, self.tokenizer = p.model, p.optimizer, p.scheduler, p.tokenizer
        self.model_summary, self.sharded = p.summary, p.sharded
        self.reference = Reference(p.reference, r.algorithm)
        self.stream = build_stream(r, p.tokenizer, acc)
        self.rollouts = build_rollouts(
            r, policy=acc.unwrap_model(p.model), tokenizer=p.tokenizer, stream=self.stream, procs=self.procs,
            rows=self.rows, device=acc.device, sharded=p.sharded, model_cfg=p.model_cfg,
            resumed_adapters=self.checkpoint_path is not None and bool(r.model.lora.r))
        self.update = PolicyUpdate(r, acc, self.procs, p.model, p.optimizer, p.scheduler, self.reference,
                                   p.forward)
        self.teacher = build_teacher(r, p, self.update, acc.device.type)  # distillation
        self.reward_models = RewardModelUpdates(r, self.procs)  # rewards[].update
        self.state = self._run_state()
        if self.checkpoint_path:
            self.start_step = restore_run(self.checkpoint_path, self.procs, self.state,
                                          changes=set(self.recipe_changes), train=t)
        else:  # every process samples its own completions; the data stream is seeded apart, the same everywhere
            seed_process(t.seed + self.procs.index)
            self.start_step = 0
        self.metrics_log, rollout_log, self.console = open_run_logs(
            self.run_dir, r, self.start_step, self.checkpoint_path, self.recipe_changes, acc)
        self.report = StepReport(r, self.procs, acc.device, self.stream, rollout_log, self.console,
                                 self.update.nonfinite)
        self._logs = (self.metrics_log, rollout_log)
        self.stop_requested, self.stop_signal = False, None
        self._eval_cache: dict = {}  # the eval problems, loaded by the first eval

    def _run_state(self):
        """Every stateful part of the run, by the name it is saved under."""
        shared, per_process = self.rollouts.checkpoint_parts()  # e.g. batches sampled ahead, the sampler's seeds
        parts: dict[str, Any] = {"optimizer": OptimizerState(self.accelerator, self.policy, self.optimizer),
                                 "scheduler": self.scheduler, "data": self.stream, "nonfinite": self.update.nonfinite,
                                 **shared}
        if self.recipe.algorithm.sync_ref_model:
            parts["ref_model"] = self.reference
        if self.recipe.algorithm.use_adaptive_entropy:
            parts["entropy_control"] = self.update.entropy  # the coefficient and the last step's entropy
        if self.reward_models:
            parts["reward_models"] = self.reward_models
        return RunState(parts, per_process={"rng_per_rank": ProcessRNG(), **per_process})

    # ----- the loop ---------------------------------------------------------------------------
    def fit(self, *, raise_on_stall: bool = False) -> int:
        """Train to train.max_steps; returns the last completed step. SIGINT/SIGTERM stop after a checkpoint; a
        phase without progress for train.stall_timeout_s stops the process with its stacks written
        (grpo_cli/process/watchdog.py), or with `raise_on_stall` (a run started from Python) raises StallInterrupt."""

        main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
        step, completed = self.start_step, False
        limit = self.recipe.train.stall_timeout_s
        dog = Watchdog(self.run_dir, limit, process=self.procs.index, processes=self.procs.count,
                       interrupt=raise_on_stall) if limit else None
        if dog is not None:
            dog.step = step
            dog.arm()
        if self.checkpoint_path:
            self.console.print(f"resumed from {self.checkpoint_path} at step {step}")
        with phase("prepare"):  # once: rollout.compile's compiled decoding; a server's LoRA sync choice
            readied = self.rollouts.prepare()
        self.console.print(start_line(self.model_summary, self.recipe, self.mixed_precision,
                                      self.reference.model is not None, self.rollouts.sampling_copy(),
                                      self.accelerator.device, self.threads, readied, self.allocator))
        slow = SlowSteps(torch.get_num_threads(), self.accelerator.device.type)
        self.rollouts.start(step)
        try:
            while step < self.recipe.train.max_steps:
                step += 1
                if dog is not None:
                    dog.step = step
                metrics = self.train_step(step)
                if self._should_eval(step):
                    with phase("eval"):
                        metrics.update(self.evaluate())
                self.log(step, metrics)
                self.update.nonfinite.stop_if_over(step, self.run_dir)  # train.max_nonfinite_steps in a row: an error
                if (warning := slow(step, metrics["time/step"])) and self.procs.is_main:
                    self.console.print(warning)
                self.stop_requested = self.procs.any(self.stop_requested)  # a signal may reach one process: all stop
                if self._should_save(step):
                    with phase("checkpoint"):
                        self.save(step)
                if self.stop_requested:
                    self.console.print(f"stopped by signal after step {step}; resume with --resume auto")
                    break
            completed = True
        finally:
            if dog is not None:
                dog.disarm()
            for s, h in previous.items():
                signal.signal(s, h)
            self.close(end_distributed=completed)
        return step

    def train_step(self, step: int) -> dict[str, Any]:
        """DeepSeekMath Algorithm 1, one iteration: B prompts -> B*G completions -> rewards -> advantages -> mu updates."""
        a, policy = self.recipe.algorithm, self.accelerator.unwrap_model(self.policy)
        clock = Clock(self.accelerator.device)
        s = self.rollouts.next(step, clock)  # StepBatch: this process's rows, every row's rewards (time/generate, /score)
        self.record(step, s)  # the batch exactly as the update sees it, for `grpo replay` (logging.replay)
        with clock("train"):
            adv = step_advantages(s, a.num_generations, a.scale_rewards, a.multi_objective_aggregation,
                                  a.advantage_estimator)  # [n], or [n, T] with step rewards
            mask = trained_mask(s.rollout, a.mask_truncated_completions)  # [n, T]: the tokens the policy sampled
            # on-policy distillation: + lambda log(pi_T / pi_S) a token, in the update's own forward where it can
            adv, term = self.teacher.before_update(adv, s.rollout, mask, self.update.keeps_layout(s.rollout))
            stats = self.update(s.rollout, adv.local, mask, clock.memory, term)  # mu clipped policy updates
            adv = self.teacher.advised(adv, term, mask)  # the advantages as trained, for the logs
            self.reference.after_update(step, policy)  # the outer loop: pi_ref <- pi_theta every M steps
            measured = self.reward_models.observe(step, s)  # the last line: the reward model learns from this step
        with clock("sync"):
            synced = self.rollouts.after_update(policy, step)  # the next rollouts see the new weights (sync/bytes)
        return self.report(step, s, adv, stats, clock,
                           measured | self.reference.metrics() | self.teacher.metrics(self.procs) | synced)

    # ----- logging, eval, checkpoints, signals -----------------------------------------------
    def record(self, step: int, s: StepBatch) -> None:
        if self._records:
            with phase("record for replay"):
                record_step(self.run_dir, step, s, self.procs.index, self.procs.count)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.metrics_log is not None:
            self.metrics_log.write({"step": step, **metrics})
        if self.recipe.logging.trackers:
            self.accelerator.log(metrics, step=step)
        self.console.step(step, metrics)

    def _should_eval(self, step: int) -> bool:
        ev = self.recipe.eval
        if ev is None:
            return False
        return step == self.recipe.train.max_steps or (ev.every_steps > 0 and step % ev.every_steps == 0)

    def evaluate(self) -> dict[str, float]:
        """The recipe's eval on the main process (its own RNG: training's random stream is untouched)."""

        return evaluate_during_training(self.accelerator, self.accelerator.unwrap_model(self.policy), self.tokenizer,
                                        self.recipe, self.rollouts.eval_generator(self.sharded), self._eval_cache,
                                        self.sharded, self.console.print)

    def _should_save(self, step: int) -> bool:
        every = self.recipe.checkpoint.every_steps
        return step == self.recipe.train.max_steps or self.stop_requested or (every > 0 and step % every == 0)

    def save(self, step: int) -> None:

        check_weights(self.accelerator.unwrap_model(self.policy), self.procs, step)  # never NaN or infinite weights
        save_run(self.run_dir, step, self.procs, self.accelerator, policy=self.policy, tokenizer=self.tokenizer,
                 recipe=self.recipe, state=self.state, sharded=self.sharded, say=self.console.print)
        if self._records and self.recipe.checkpoint.keep_last is not None and self.procs.is_main:

            kept = list_checkpoints(self.run_dir)  # a step replays from a checkpoint before it: none precedes these
            prune(self.run_dir, step_of(kept[0]) if kept else 0)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_requested:  # second signal: leave now, the last checkpoint is intact
            raise KeyboardInterrupt
        self.stop_requested, self.stop_signal = True, signum
        self.console.print(f"got {signal.Signals(signum).name}: finishing this step, saving a checkpoint, then exiting "
                           "(send it again to exit at once)")

    def close(self, end_distributed: bool = False) -> None:
        """Logs, rollouts, the data stream and trackers; `end_distributed` (a run every process finished) also destroys
        the process group: left to interpreter exit, gloo's worker threads can abort the process."""
        self.console.close()
        for log in self._logs:
            if log is not None:
                log.close()
        if getattr(self, "rollouts", None) is not None:
            self.rollouts.close()
        if getattr(self, "stream", None) is not None:
            self.stream.close()
        if end_distributed:  # not after an error: a process still inside a collective would hang the others
            self.accelerator.end_training()  # trackers finish; the process group is destroyed
        elif self.recipe.logging.trackers:
            for tracker in self.accelerator.trackers:
                tracker.finish()
