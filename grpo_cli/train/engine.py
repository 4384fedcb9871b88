"""The training loop: generate -> score -> group-relative advantages -> mu clipped policy updates.

GRPO as in DeepSeekMath (arXiv:2402.03300, Algorithm 1), on accelerate-managed devices. The
generation batch (B prompts x G completions, rows of a group contiguous) is split evenly over
processes by rows; rewards are gathered so every group is normalised over all its G completions.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from grpo_cli.algo.advantages import compute_advantages, normalize_then_sum, process_advantages
from grpo_cli.datatypes import PromptBatch, RewardResult, Rollout
from grpo_cli.train.distributed import gather, is_deepspeed, is_fsdp, process_rows
from grpo_cli.errors import SetupError
from grpo_cli.algo.logprobs import logps_no_grad, token_logprobs
from grpo_cli.algo.losses import POLICY_LOSSES, compute_loss, entropy_mask, sampler_correction
from grpo_cli.run.statefiles import seed_process
from grpo_cli.run.logs import open_run_logs
from grpo_cli.models.loading import disable_dropout, has_dropout, mix_into
from grpo_cli.train.optim import build_optimizer, make_scheduler
from grpo_cli.recipe.schema import Recipe
from grpo_cli.run.state import restore_run, save_run
from grpo_cli.train.step_metrics import (
    MetricSums, episode_metrics, peak_memory_gib, rollout_records, settle, start_line, step_metrics,
)


class Engine:
    """Owns the model, optimizer, data stream, generator and logs of one run."""

    def __init__(self, recipe: Recipe, run_dir: str | Path, resume: str | None = None, *, start_over: bool = False,
                 allow_recipe_change: bool = False) -> None:
        """`start_over`, `allow_recipe_change`: the CLI's --start-over and --allow-recipe-change
        (grpo_cli/run/folder.py)."""
        import os

        from grpo_cli.run import lock as runlock
        self.recipe, self.run_dir = recipe, Path(run_dir)
        # one trainer per run folder, locked before anything is written or loaded (global rank 0, or the launcher)
        main = os.environ.get("RANK", "0") == "0"
        self._lock = runlock.acquire(self.run_dir) if main and not runlock.inherited(self.run_dir) else None
        try:
            self._setup(resume, start_over, allow_recipe_change)
        except BaseException:
            self._release_lock()
            raise

    def _setup(self, resume: str | None, start_over: bool, allow_recipe_change: bool) -> None:
        from accelerate import Accelerator

        from grpo_cli.models.loading import quiet_transformers, resolve_mixed_precision

        quiet_transformers()
        recipe = self.recipe
        t = recipe.train
        if t.threads:
            torch.set_num_threads(t.threads)
        self.mixed_precision = resolve_mixed_precision(t.mixed_precision, recipe.model.dtype)
        self.accelerator = Accelerator(
            mixed_precision=self.mixed_precision, log_with=recipe.logging.trackers or None, project_dir=str(self.run_dir)
        )
        self.G = recipe.algorithm.num_generations
        self.rows = process_rows(self.accelerator, recipe)  # this process's slice of the B*G completion rows
        self.checkpoint_path = self._resolve_resume(resume, start_over)
        self.recipe_changes = self._check_drift(allow_recipe_change)
        torch.manual_seed(t.seed)  # fresh LoRA adapters (peft draws lora_A at random): same on every run and rank
        self._build_model()
        self._build_data()
        self._restored_state: dict = {}  # the checkpoint's trainer state (its rollouts in flight, if any)
        if self.checkpoint_path:
            self.start_step, self._restored_state = restore_run(
                self.checkpoint_path, self.accelerator, self.model, self.optimizer, self.scheduler, self.stream,
                self.generator, changes=set(self.recipe_changes), train=t, ref_model=self.ref_model)
        else:  # every process samples its own completions; the data stream is seeded apart, the same everywhere
            seed_process(t.seed + self.accelerator.process_index)
            self.start_step = 0
        self.ref_syncs = int(self._restored_state.get("ref_model_syncs", 0))  # algorithm.sync_ref_model
        self.rm_updaters = self._build_reward_model_updates()  # rewards[].update
        self.metrics_log, self.rollout_log, self.console = open_run_logs(
            self.run_dir, recipe, self.start_step, self.checkpoint_path, self.recipe_changes, self.accelerator)
        self.stop_requested, self.stop_signal = False, None
        self.pipeline = None  # asynchronous rollouts (rollout.max_staleness), started by fit
        self._eval_cache: dict = {}  # the eval problems, loaded by the first eval

    # ----- set-up -----------------------------------------------------------------------------
    def _resolve_resume(self, resume: str | None, start_over: bool) -> Path | None:
        """The checkpoint to continue from, or None; refuses to rewind or overwrite the run folder silently."""
        from grpo_cli.run.folder import start_point

        acc = self.accelerator
        with acc.main_process_first():  # the main process carries out --start-over before the others look
            return start_point(self.run_dir, resume, start_over=start_over, delete=acc.is_main_process,
                               say=print if acc.is_main_process else lambda _: None)

    def _check_drift(self, allow: bool) -> dict[str, tuple[Any, Any]]:
        """Recipe fields that differ from the checkpoint's; RunFolderError for those a resume may not change."""
        if self.checkpoint_path is None:
            return {}
        from grpo_cli.run.folder import check_drift

        changes = check_drift(self.checkpoint_path, self.recipe.model_dump(mode="json"), allow)
        if "train.optimizer" in changes:
            from grpo_cli.errors import RunFolderError

            old, new = changes["train.optimizer"]
            raise RunFolderError(f"train.optimizer cannot change on resume ({old} -> {new}): the checkpoint holds {old}'s "
                                 f"state. Start a new run from its weights instead: model.name_or_path="
                                 f"{self.checkpoint_path}")
        return changes

    def _build_reward_model_updates(self) -> list:
        """An updater per reward model with `update` (rewards/rm_update.py), its weights, buffer and period so far
        taken from the checkpoint when resuming."""
        from grpo_cli.rewards import unique_log_names
        from grpo_cli.rewards.rm_update import build_updaters

        updaters = build_updaters(self.recipe, unique_log_names([s.name for s in self.recipe.rewards]))
        saved = self._restored_state.get("reward_models", {})
        for u in updaters:
            if u.key in saved:
                from grpo_cli.run.checkpoints import load_trainer_tensors

                state = saved[u.key]
                u.load_state_dict(state, load_trainer_tensors(self.checkpoint_path, u.key) if state["updates"] else None)
        return updaters

    def _build_model(self) -> None:
        from grpo_cli.models.lora import load_policy, parameter_summary
        from grpo_cli.models.loading import load_model, load_tokenizer

        r = self.recipe
        cfg = r.model
        if self.checkpoint_path is not None:  # weights and tokenizer come from the checkpoint
            cfg = cfg.model_copy(update={"name_or_path": str(self.checkpoint_path), "gguf_file": None, "revision": None})
        # each node's main process fills its model cache (GGUF conversion, builtin models) before the others
        # there read it; on a filesystem the nodes share, the caches are written atomically (models.py)
        with self.accelerator.local_main_process_first():
            self.tokenizer = load_tokenizer(cfg)
            model = load_policy(cfg, r.model, self.checkpoint_path, self.accelerator.device)
            self.ref_model = None
            if r.algorithm.beta > 0 and not r.model.lora.r:  # with LoRA the reference is the base: adapters disabled
                ref_cfg = r.model.model_copy(update={"gradient_checkpointing": False})
                self.ref_model = load_model(ref_cfg).to(self.accelerator.device).eval().requires_grad_(False)
        disable_dropout(model)
        self.model_summary = parameter_summary(model)
        params = [p for p in model.parameters() if p.requires_grad]
        a, t = r.algorithm, r.train
        acc = self.accelerator
        fused = not (is_fsdp(acc) or is_deepspeed(acc)) and acc.device.type in ("cpu", "cuda")
        optimizer = build_optimizer(params, t, fused=fused and t.optimizer == "adamw", device=acc.device)
        total_updates = t.max_steps * a.num_iterations
        self.scheduler = make_scheduler(optimizer, t.scheduler, t.warmup_steps, total_updates)
        if is_deepspeed(acc):  # no dataloader to infer these from; grpo accumulates itself
            acc.state.deepspeed_plugin.deepspeed_config.update(
                train_micro_batch_size_per_gpu=t.micro_batch_size, gradient_accumulation_steps=1)
        self.model, self.optimizer = acc.prepare(model, optimizer)
        # weights split over processes: every process must run every forward (generation included)
        self.sharded = is_fsdp(acc) or (is_deepspeed(acc) and acc.state.deepspeed_plugin.zero_stage == 3)
        if self.sharded and r.algorithm.sync_ref_model:
            raise SetupError("algorithm.sync_ref_model needs the policy's full weights on every process; with FSDP "
                             "or ZeRO-3 they are sharded: use DDP (or ZeRO-1/2) to refresh the reference")
        # a group's prompt runs once per micro-batch through the key/value cache, which gradient checkpointing turns
        # off. It pays where compute is the cost (CPU: train 7.9 -> 5.6 s/step); on a GPU the two forwards and the
        # cache gather made a micro-batch's forward + backward 2.2x slower (bench/step_phases.py, H100)
        self._shared_prompts = not cfg.gradient_checkpointing and acc.device.type == "cpu"
        self.generator = self._make_generator(cfg)
        from grpo_cli.agents.episodes import episode_runner

        # rollout.environment / rollout.tools: multi-turn episodes
        self.episodes = episode_runner(r, self.tokenizer, self.generator, self.accelerator.unwrap_model(self.model))

    def _make_generator(self, cfg):
        """The rollout backend (grpo_cli/rollout): the policy itself (hf), a vLLM engine in this process, or
        `grpo serve-vllm`; a vLLM engine starts from the model folder (LoRA: the base, merged weights synced)."""
        from grpo_cli.models.loading import resolve_model_source
        from grpo_cli.rollout import build_generator

        r, policy = self.recipe, self.accelerator.unwrap_model(self.model)
        colocate = r.rollout.backend == "vllm" and r.rollout.vllm.mode == "colocate"
        generator = build_generator(
            r.rollout, tokenizer=self.tokenizer, model=policy, synced=self.sharded,
            model_dir=resolve_model_source(r.model if r.model.lora.r else cfg) if colocate else None,
            seed=r.train.seed + self.accelerator.process_index,
        )
        # a server may hold other weights; a colocated engine holds the base, not the resumed adapters
        if r.rollout.backend == "vllm" and (not colocate or (self.checkpoint_path is not None and r.model.lora.r)):
            generator.sync_weights(policy)
        return generator

    def _build_data(self) -> None:
        from grpo_cli.data.prompts import PromptStream, load_rows

        d, seed = self.recipe.data, self.recipe.train.seed
        data_seed = d.seed if d.seed is not None else seed
        with self.accelerator.local_main_process_first():  # one download / cache write per node
            self.dataset = load_rows(d, data_seed)
        tools = None
        if self.recipe.rollout.tools:  # every prompt describes them
            from grpo_cli.agents.tools import schemas

            tools = schemas(self.recipe.rollout.tools)
        self.stream = PromptStream(self.dataset, d, self.tokenizer, self.recipe.train.prompts_per_step, data_seed,
                                   tools=tools)

    # ----- the loop ---------------------------------------------------------------------------
    def fit(self) -> int:
        """Train to train.max_steps; returns the last completed step. SIGINT/SIGTERM stop after a checkpoint."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        step, completed = self.start_step, False
        if self.checkpoint_path:
            self.console.print(f"resumed from {self.checkpoint_path} at step {step}")
        self.console.print(start_line(self.model_summary, self.recipe, self.mixed_precision, self.ref_model is not None,
                                      getattr(self.generator, "copy", None), self.accelerator.device))
        if self.recipe.rollout.max_staleness:  # asynchronous rollouts: the batches in flight, or the first k + 1
            from grpo_cli.rollout.pipeline import start_pipeline

            saved = self._restored_state.get("in_flight")
            self.pipeline = start_pipeline(self.generator, self.recipe, self.G, self.start_step, saved, self.stream)
        try:
            while step < self.recipe.train.max_steps:
                step += 1
                metrics = self.train_step(step)
                if self._should_eval(step):
                    metrics.update(self.evaluate())
                self._log(step, metrics)
                if self.accelerator.num_processes > 1:  # a signal may reach one process: all must stop (saving is collective)
                    self.stop_requested = bool(gather(self.accelerator, torch.tensor([float(self.stop_requested)])).max())
                if self._should_save(step):
                    self.save(step)
                if self.stop_requested:
                    self.console.print(f"stopped by signal after step {step}; resume with --resume auto")
                    break
            completed = True
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.close(end_distributed=completed)
        return step

    def train_step(self, step: int) -> dict[str, Any]:
        """One GRPO step: B prompts -> B*G completions -> rewards -> advantages -> mu updates."""
        r, G, rows = self.recipe, self.G, self.rows  # rows: this process's slice of the B*G completion rows
        t0 = time.perf_counter()
        times = {"time/generate": 0.0, "time/score": 0.0}
        batch, rollout, rewards, total, extra = self._collect(step, times)
        t_score = time.perf_counter()

        if r.algorithm.multi_objective_aggregation == "normalize_then_sum":
            per_function = [[math.nan if v is None else v for v in col] for col in rewards.per_function.values()]
            per_function = gather(self.accelerator, torch.tensor(per_function, dtype=torch.float32).T.contiguous())  # [N, K]
            advantages = normalize_then_sum(per_function, [w.weight for w in r.rewards], G)
        else:
            advantages = compute_advantages(total, G, r.algorithm.scale_rewards)  # [N]
        local_adv = advantages[rows.start : rows.stop]
        if rewards.steps:  # process supervision: + each step reward's per-token advantages, weighted
            step_adv, step_stats = self._step_advantages(rewards, rollout.completion_ids.shape[1])
            local_adv, extra = local_adv[:, None] + step_adv, extra | step_stats
        mask = rollout.trained_mask().clone()  # multi-turn: observation tokens are not trained
        if r.algorithm.mask_truncated_completions:
            mask[rollout.truncated] = 0
        sums = self._update(rollout, local_adv.to(mask.device), mask)
        if r.algorithm.sync_ref_model and step % r.algorithm.ref_model_sync_steps == 0:  # Algorithm 1's outer loop
            mix_into(self.ref_model, self.accelerator.unwrap_model(self.model), r.algorithm.ref_model_mixup_alpha)
            self.ref_syncs += 1
        if self.rm_updaters:  # Algorithm 1's last line: the reward model learns from this period's completions
            t_rm = time.perf_counter()
            extra = extra | self._update_reward_models(step, batch, rollout, rewards)
            times["time/reward_model"] = time.perf_counter() - t_rm
        settle(self.accelerator.device)
        t_train = time.perf_counter()
        if self.pipeline is not None:  # written now, loaded by the server after the batches sampled before it
            self.pipeline.submit_weights(self.accelerator.unwrap_model(self.model), step)
            if step + r.rollout.max_staleness + 1 <= r.train.max_steps:
                self.pipeline.submit_batch(self.stream.next_batch())
        else:
            self.generator.wake_up()
            self.generator.sync_weights(self.accelerator.unwrap_model(self.model))  # the next rollouts see the new policy
        t_end = time.perf_counter()

        times |= {"time/train": t_train - t_score, "time/sync": t_end - t_train, "time/step": t_end - t0}
        metrics = step_metrics(rollout, rewards, total, advantages, sums, times, G=G, gather=lambda x: gather(self.accelerator, x),
                               accelerator=self.accelerator, epoch=self.stream.state_dict()["epoch"]) | extra
        if rollout.weight_step is not None:  # steps between the weights that sampled and the ones being trained
            metrics["sampling/staleness/mean"] = metrics["sampling/staleness/max"] = float(step - 1 - rollout.weight_step)
        if self.episodes is not None:  # environment failures and tool calls this step, every process's
            metrics |= episode_metrics(self.episodes.take_counts(), self.recipe.rollout,
                                       lambda x: gather(self.accelerator, torch.tensor([float(x)])).sum().item())
        metrics["memory/peak_gib"] = peak_memory_gib(self.accelerator.device)  # this process's
        if r.algorithm.sync_ref_model:
            metrics["ref_model/syncs"] = self.ref_syncs
        if r.logging.rollouts or r.logging.num_completions_to_print:  # every process gathers; the main one writes
            records = rollout_records(step, batch, rollout, rewards, total, advantages, G=G, rows=rows,
                                      num_processes=self.accelerator.num_processes)
            if self.rollout_log is not None and r.logging.rollouts:
                self.rollout_log.write_many(records)
            self.console.completions(step, records[: r.logging.num_completions_to_print])
        return metrics

    def _update_reward_models(self, step: int, batch: PromptBatch, rollout: Rollout, rewards: RewardResult) -> dict[str, float]:
        """Give each updater the step's labelled groups (every process's rows); train those whose period ended."""
        from accelerate.utils import gather_object

        from grpo_cli.data.prompts import user_prompts
        from grpo_cli.rewards.rm_update import step_groups

        users = user_prompts(self.recipe.data, batch.per_row(self.rows, self.G).columns)
        values, out = list(rewards.per_function.values()), {}
        for u in self.rm_updaters:
            rows = list(zip(rollout.prompts, users or [None] * len(rollout), rollout.completions, values[u.label_index],
                            strict=True))
            if self.accelerator.num_processes > 1:
                rows = gather_object(rows)
            prompts, us, completions, labels = (list(x) for x in zip(*rows))
            u.record(step_groups(prompts, None if None in us else us, completions, labels, self.G))
            if u.due(step):
                out |= u.update(step)
            out[f"reward_model/{u.log_name}/updates"] = float(u.updates)
        return out

    def _step_advantages(self, rewards: RewardResult, length: int) -> tuple[torch.Tensor, dict[str, float]]:
        """[n, T] sum over step-level rewards of weight x their sec. 4.1.3 advantages, for this process's rows
        (a group's steps gathered from every process: they are normalised together), and per step reward
        rewards/<name>/steps_per_completion and /frac_zero_std (groups whose step rewards give no signal)."""
        from accelerate.utils import gather_object

        from grpo_cli.algo.advantages import step_signal

        weights = {name: spec.weight for name, spec in zip(rewards.per_function, self.recipe.rewards)}
        out, stats = torch.zeros(len(self.rows), length), {}
        for name, steps in rewards.steps.items():
            every = gather_object(steps) if self.accelerator.num_processes > 1 else steps
            every = [x or [] for x in every]
            out += weights[name] * process_advantages(every, self.G, length)[self.rows.start : self.rows.stop]
            signal = step_signal(every, self.G)
            stats[f"rewards/{name}/steps_per_completion"] = sum(map(len, every)) / len(every)
            stats[f"rewards/{name}/frac_zero_std"] = 1 - sum(signal) / len(signal)
        return out, stats

    def _sample(self, step: int, times: dict[str, float], wake: bool = False) -> tuple[PromptBatch, Rollout, RewardResult, torch.Tensor]:
        """B prompts -> this process's rows of their B*G completions, scored; -> also the weighted rewards of all
        rows (every process's), [N]. `wake`: a later round of the step, after the generator went to sleep."""
        from grpo_cli.data.prompts import user_prompts
        from grpo_cli.rewards import score_rollout
        from grpo_cli.rewards.reward_model import is_reward_model

        r, G, rows = self.recipe, self.G, self.rows
        t0 = time.perf_counter()
        episode_columns: dict[str, list] = {}
        if self.pipeline is not None:  # sampled ahead (rollout.max_staleness); the wait is what shows as generate
            batch, rollout = self.pipeline.next()
            mine = batch.per_row(rows, G)  # this process's rows: each its prompt's columns
        else:
            batch = self.stream.next_batch()  # the same B prompts on every process
            if wake:
                self.generator.wake_up()
            mine = batch.per_row(rows, G)
            if self.episodes is not None:  # multi-turn: the episodes' turns and environment rewards become columns
                with_reward = any(s.name == "environment" for s in r.rewards)
                rollout, episode_columns = self.episodes.run(mine, with_reward=with_reward)
            else:
                rollout = self.generator.generate(mine.input_ids, mine.texts)
            self.generator.sleep()  # colocated vLLM on GPU (sleep_mode): give the trainer (and reward models) its memory
        rollout = rollout.to(self.accelerator.device)
        t_gen = time.perf_counter()
        columns = mine.columns | episode_columns
        users = user_prompts(r.data, columns) if any(is_reward_model(s.name) for s in r.rewards) else None
        rewards = score_rollout(r.rewards, rollout, columns, max_completion_length=r.rollout.max_completion_length,
                                step=step, user_prompts=users, tokenizer=self.tokenizer)  # users: reward models' chat templates
        times["time/generate"] += t_gen - t0
        times["time/score"] += time.perf_counter() - t_gen
        return batch, rollout, rewards, gather(self.accelerator, torch.tensor(rewards.total, dtype=torch.float32))

    def _collect(self, step: int, times: dict[str, float]):
        """The step's generation batch: one round of `_sample`, or with dynamic sampling as many rounds as it
        takes to collect B groups with signal. -> batch, rollout, rewards, total as `_sample`'s, and metrics."""
        from grpo_cli.algo.dynamic_sampling import collect

        first, ds = self._sample(step, times), self.recipe.algorithm.dynamic_sampling
        if not ds.enabled:
            return *first, {}
        return collect(first, lambda: self._sample(step, times, wake=True), max_rounds=ds.max_rounds,
                       batch_size=self.recipe.train.prompts_per_step, group_size=self.G, rows=self.rows,
                       pad_id=self.generator.pad_id, accelerator=self.accelerator)

    def _update(self, rollout: Rollout, adv: torch.Tensor, mask: torch.Tensor) -> MetricSums:
        """mu optimizer steps over the same rollouts, each one accumulation window over all micro-batches."""
        a, t = self.recipe.algorithm, self.recipe.train
        n, mbs = len(rollout), t.micro_batch_size
        slices = [slice(s, s + mbs) for s in range(0, n, mbs)]
        # mu > 1: the old policy is the one of iteration 0, whose forwards run before any optimizer step, so
        # their detached log-probs are the old log-probs and need no forward of their own; with dropout
        # every forward differs, and the old policy gets a separate one (as TRL computes it)
        separate_old = a.num_iterations > 1 and has_dropout(self.accelerator.unwrap_model(self.model))
        old = self._logps_no_grad(self.model, rollout, slices) if separate_old else None
        first_logps: list[torch.Tensor] = []
        ref = self._ref_logps(rollout, slices) if a.beta > 0 else None
        global_tokens = POLICY_LOSSES.get(a.loss_type).aggregation == "global_token_mean"
        if global_tokens:  # every token of the global batch weighs the same; DDP averages over processes
            num_active = gather(self.accelerator, mask.sum().reshape(1).float().cpu()).sum().item()
            loss_scale = float(self.accelerator.num_processes)
        else:
            num_active, loss_scale = None, 1.0 / len(slices)
        sums = MetricSums()
        sums.add_scalar("learning_rate", self.scheduler.get_last_lr()[0])
        self.model.train()
        for it in range(a.num_iterations):
            for k, sl in enumerate(slices):
                last = k == len(slices) - 1
                # DDP/FSDP all-reduce only on the window's last backward; DeepSpeed steps its engine only then
                self.accelerator.sync_gradients = last
                with nullcontext() if last else self.accelerator.no_sync(self.model):
                    logps = self._micro_step(rollout, sl, adv, mask, old, ref, num_active, loss_scale, sums, first=it == 0)
                if it == 0 and a.num_iterations > 1 and not separate_old:
                    first_logps.append(logps)
            if first_logps:
                old, first_logps = torch.cat(first_logps), []  # [N, T]: the old policy of iterations 1 .. mu-1
            sums.add_scalar("grad_norm", self._optimizer_step())
        return sums

    def _micro_step(self, rollout, sl, adv, mask, old, ref, num_active, loss_scale, sums, first) -> torch.Tensor:
        """One forward/backward of micro-batch `sl`; -> its detached log-probs [b, T]."""
        a = self.recipe.algorithm
        with self.accelerator.autocast():
            logps, entropy = token_logprobs(
                self.model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl],
                rollout.completion_mask[sl], temperature=self.recipe.rollout.temperature,
                with_entropy=first or a.top_entropy_quantile < 1, shared_prompts=self._shared_prompts,
            )
        m = mask[sl]
        if first:
            sums.add_tokens("entropy", entropy, m)
        if a.top_entropy_quantile < 1:
            m = entropy_mask(entropy, m, a.top_entropy_quantile)
        old_sl = old[sl] if old is not None else logps.detach()
        weights = self._sampler_weights(rollout, sl, old_sl, m, sums if first else None)
        loss, lm = compute_loss(
            a.loss_type, logps, old_sl, adv[sl], m,
            epsilon_low=a.epsilon, epsilon_high=a.epsilon_high_value, delta=a.delta,
            importance_sampling_level=a.importance_sampling_level, beta=a.beta,
            ref_logps=ref[sl] if ref is not None else None,
            max_completion_length=self.recipe.rollout.max_completion_length, num_active_tokens=num_active,
            sapo_temperature_pos=a.sapo_temperature_pos, sapo_temperature_neg=a.sapo_temperature_neg,
            token_weights=weights, use_bias_correction_kl=a.use_bias_correction_kl,
            off_policy_mask_threshold=a.off_policy_mask_threshold,
            sampling_logps=rollout.sampling_logps[sl] if rollout.sampling_logps is not None else None,
        )
        self.accelerator.backward(loss * loss_scale)
        n_tok = m.sum().item()
        for key, value in lm.items():
            sums.add_weighted(key, value.item(), n_tok)
        sums.add_scalar("loss", loss.item())
        return logps.detach()

    def _sampler_weights(self, rollout, sl, old, mask, sums) -> torch.Tensor | None:
        """Train/inference mismatch: log it, and return the importance weights the recipe asks for."""
        if rollout.sampling_logps is None:
            return None
        ro = self.recipe.rollout
        samp = rollout.sampling_logps[sl].to(old.device)
        mode = ro.importance_sampling if ro.importance_sampling != "none" else "token_truncate"
        weights, rho = sampler_correction(old, samp, mask, mode, ro.importance_sampling_cap)
        if sums is not None:
            diff = (old - samp).abs()
            sums.add_tokens("sampling/sampling_logp_difference/mean", diff, mask)
            sums.add_extremes("sampling/sampling_logp_difference/max", diff, mask)
            sums.add_tokens("sampling/importance_sampling_ratio/mean", rho, mask)
            sums.add_extremes("sampling/importance_sampling_ratio/min", rho, mask, low=True)
            sums.add_extremes("sampling/importance_sampling_ratio/max", rho, mask)
        return weights if ro.importance_sampling != "none" else None

    def _ref_logps(self, rollout: Rollout, slices: list[slice]) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logps_no_grad(self.ref_model, rollout, slices)
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # LoRA: the frozen base is the reference
            return self._logps_no_grad(self.model, rollout, slices)

    def _logps_no_grad(self, model, rollout: Rollout, slices: list[slice]) -> torch.Tensor:
        """Old-policy (mu > 1) or reference (beta > 0) log-probs, micro-batch by micro-batch."""
        return logps_no_grad(model, rollout, slices, temperature=self.recipe.rollout.temperature,
                             shared_prompts=self._shared_prompts, autocast=self.accelerator.autocast)

    def _optimizer_step(self) -> float:
        # accelerate computes the global norm for DDP, FSDP (sharded grads) and DeepSpeed; inf: measure only
        max_norm = self.recipe.train.max_grad_norm or math.inf
        norm = self.accelerator.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm) if norm is not None else math.nan  # DeepSpeed reports no norm before its first step

    # ----- logging, checkpoints, signals ----------------------------------------------------
    def _log(self, step: int, metrics: dict[str, Any]) -> None:
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
        from grpo_cli.eval.evaluate import evaluate_during_training

        # a vLLM backend is reused (one vLLM engine per process), asynchronous rollouts go through their queue
        # (after the batches in flight, with this step's weights); hf generates with the policy itself
        generator = self.generator if self.recipe.rollout.backend == "vllm" or self.sharded else None
        if self.pipeline is not None:
            from grpo_cli.rollout.pipeline import Serialized

            generator = Serialized(self.pipeline)
        return evaluate_during_training(self.accelerator, self.accelerator.unwrap_model(self.model), self.tokenizer,
                                        self.recipe, generator, self._eval_cache, self.sharded, self.console.print)

    def _should_save(self, step: int) -> bool:
        every = self.recipe.checkpoint.every_steps
        return step == self.recipe.train.max_steps or self.stop_requested or (every > 0 and step % every == 0)

    def save(self, step: int) -> None:
        save_run(self.run_dir, step, self.accelerator, self.model, self.optimizer, self.scheduler, self.tokenizer,
                 self.recipe, self.stream, self.generator, self.pipeline, sharded=self.sharded, say=self.console.print,
                 ref_model=self.ref_model if self.ref_syncs else None, ref_syncs=self.ref_syncs,
                 reward_models=self.rm_updaters)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_requested:  # second signal: leave now, the last checkpoint is intact
            raise KeyboardInterrupt
        self.stop_requested, self.stop_signal = True, signum
        self.console.print(f"got {signal.Signals(signum).name}: finishing this step, saving a checkpoint, then exiting "
                           "(send it again to exit at once)")

    def close(self, end_distributed: bool = False) -> None:
        """Logs, generator, trackers and the run lock; `end_distributed` (a run every process finished) also
        destroys the process group: left to interpreter exit, gloo's worker threads can abort the process."""
        self.console.close()
        for log in (self.metrics_log, self.rollout_log):
            if log is not None:
                log.close()
        if getattr(self, "pipeline", None) is not None:
            self.pipeline.close()
        if getattr(self, "generator", None) is not None:
            self.generator.close()
        if end_distributed:  # not after an error: a process still inside a collective would hang the others
            self.accelerator.end_training()  # trackers finish; the process group is destroyed
        elif self.recipe.logging.trackers:
            for tracker in self.accelerator.trackers:
                tracker.finish()
        self._release_lock()

    def _release_lock(self) -> None:
        from grpo_cli.run import lock as runlock
        if self._lock is not None:
            runlock.release(self._lock)
            self._lock = None
