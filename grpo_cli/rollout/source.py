"""Where each step's batch comes from: DeepSeekMath Algorithm 1's "sample G outputs for each question", scored.

`RolloutSource.next(step)` draws B prompts from the stream, has the backend complete them B*G times (one turn
each, or multi-turn episodes; sampled now, or ahead of time by the pipeline with rollout.max_staleness), scores
this process's rows, and with DAPO's dynamic sampling samples whole new batches until B groups have signal
(grpo_cli/algo/dynamic_sampling.py picks them). `after_update` hands the new weights to whatever samples next.
The engine sees none of these choices: it gets a `StepBatch`.

The generation batch is split evenly over processes by rows; every process gets every row's rewards (a group
is normalised over all its G completions) and, with step rewards, every row's steps.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from grpo_cli.algo.advantages import groups_with_signal
from grpo_cli.algo.dynamic_sampling import Round, assemble, dynamic_sampling_metrics, pick_groups
from grpo_cli.datatypes import Processes, PromptBatch, RewardResult, Rollout, StepBatch
from grpo_cli.rollout.backends import Generator, backend_name, backend_of

Clock = Callable[[str], Any]  # clock("generate") -> a context manager that adds the time spent in it


class RolloutSource:
    """The step batches of one training run (this process's rows of each)."""

    def __init__(self, recipe, *, generator: Generator, episodes, stream, procs: Processes, rows: range, device,
                 tokenizer) -> None:
        self.recipe, self.generator, self.episodes, self.stream = recipe, generator, episodes, stream
        self.procs, self.rows, self.device, self.tokenizer = procs, rows, device, tokenizer
        self.G = recipe.algorithm.num_generations
        self.pipeline = None  # asynchronous rollouts (rollout.max_staleness), started by `start`
        self._in_flight: list[dict] | None = None  # batches in flight at the checkpoint resumed from

    # ------------------------------------------------------------------ the run
    def prepare(self) -> str | None:
        """Before step 1: what the generator readies once for the run (rollout.compile: the static cache and the
        compiled decode step; a grpo serve-vllm client: how LoRA weights travel); -> the start line's words about
        it, or None."""
        prepare = getattr(self.generator, "prepare", None)
        return prepare(len(self.rows), self.recipe.data.max_prompt_length) if prepare is not None else None

    def start(self, step: int) -> None:
        """Before the first step after `step`: with rollout.max_staleness, sample the first k + 1 batches (or take
        those in flight at the checkpoint)."""
        if self.recipe.rollout.max_staleness:
            from grpo_cli.rollout.pipeline import start_pipeline

            self.pipeline = start_pipeline(self.generator, self.recipe, self.G, step, self._in_flight, self.stream)

    def next(self, step: int, clock: Clock) -> StepBatch:
        """The batch of step `step`, scored (and with dynamic sampling, resampled until B groups have signal)."""
        batch, rollout, rewards, total = self._round(step, clock)
        metrics: dict[str, float] = {}
        ds = self.recipe.algorithm.dynamic_sampling
        if ds.enabled:
            batch, rollout, rewards, total, metrics = self._until_signal(
                (batch, rollout, rewards, total), lambda: self._round(step, clock, wake=True), ds.max_rounds)
        if rollout.weight_step is not None:  # steps between the weights that sampled and the ones being trained
            metrics["sampling/staleness/mean"] = metrics["sampling/staleness/max"] = float(step - 1 - rollout.weight_step)
        if self.episodes is not None:  # environment failures and tool calls this step, every process's
            metrics |= episode_metrics(self.episodes.take_counts(), self.recipe.rollout, self.procs.total)
        columns = [[math.nan if v is None else v for v in col] for col in rewards.per_function.values()]
        return StepBatch(
            prompts=batch, rollout=rollout, rewards=rewards, rows=self.rows, total=total,
            per_function=self.procs.gather(torch.tensor(columns, dtype=torch.float32).T.contiguous()),  # [N, K]
            weights=[spec.weight for spec in self.recipe.rewards],
            steps={name: self.procs.gather_rows(col) for name, col in rewards.steps.items()}, metrics=metrics,
        )

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        """The policy after step `step`'s update: what samples the next rollouts gets its weights. -> what the last
        sync handed over (`sync/bytes`; 0: the sampler is the policy itself)."""
        if self.pipeline is not None:  # written now, loaded by the server after the batches sampled before it
            self.pipeline.submit_weights(policy, step)
            if step + self.recipe.rollout.max_staleness + 1 <= self.recipe.train.max_steps:
                self.pipeline.submit_batch(self.stream.next_batch())
        else:
            self.generator.wake_up()
            self.generator.sync_weights(policy)
        return {"sync/bytes": int(getattr(self.generator, "sync_bytes", 0))}

    def eval_generator(self, sharded: bool) -> Generator | None:
        """What the run's eval samples with: a backend with its own weights is reused (one vLLM engine per process),
        the pipeline's generator goes through its queue (after the batches in flight, with this step's weights);
        None: generate with the policy itself."""
        if self.pipeline is not None:
            from grpo_cli.rollout.pipeline import Serialized

            return Serialized(self.pipeline)
        return self.generator if backend_of(self.recipe.rollout).own_weights or sharded else None

    # ------------------------------------------------------------------ the batches in flight, as run state
    def state_dict(self) -> list[dict]:
        """The batches in flight (rollout.max_staleness), waited for: their weights are gone after this step."""
        return self.pipeline.state() if self.pipeline is not None else []

    def load_state_dict(self, state: list[dict]) -> None:
        self._in_flight = state

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        self.generator.close()

    # ------------------------------------------------------------------ sampling and scoring
    def _round(self, step: int, clock: Clock, wake: bool = False) -> tuple[PromptBatch, Rollout, RewardResult, torch.Tensor]:
        """B prompts -> this process's rows of their B*G completions, scored; -> also the weighted rewards of all
        rows (every process's), [N]. `wake`: a later round of the step, after the generator went to sleep."""
        from grpo_cli.data.prompts import user_prompts
        from grpo_cli.rewards import score_rollout
        from grpo_cli.recipe.names import is_reward_model

        r = self.recipe
        episode_columns: dict[str, list] = {}
        with clock("generate"):
            if self.pipeline is not None:  # sampled ahead (rollout.max_staleness); the wait is what shows as generate
                batch, rollout = self.pipeline.next()
                mine = batch.per_row(self.rows, self.G)  # this process's rows: each its prompt's columns
            else:
                batch = self.stream.next_batch()  # the same B prompts on every process
                if wake:
                    self.generator.wake_up()
                mine = batch.per_row(self.rows, self.G)
                if self.episodes is not None:  # multi-turn: the episodes' turns and environment rewards become columns
                    with_reward = any(s.name == "environment" for s in r.rewards)
                    rollout, episode_columns = self.episodes.run(mine, with_reward=with_reward)
                else:
                    rollout = self.generator.generate(mine.input_ids, mine.texts)
                self.generator.sleep()  # colocated vLLM on GPU (sleep_mode): give the trainer its memory
            rollout = rollout.to(self.device)
        with clock("score"):
            columns = mine.columns | episode_columns
            users = user_prompts(r.data, columns) if any(is_reward_model(s.name) for s in r.rewards) else None
            rewards = score_rollout(r.rewards, rollout, columns, max_completion_length=r.rollout.max_completion_length,
                                    step=step, user_prompts=users, tokenizer=self.tokenizer)  # users: RMs' chat templates
        return batch, rollout, rewards, self.procs.gather(torch.tensor(rewards.total, dtype=torch.float32))

    def _until_signal(self, first: tuple, sample: Callable[[], tuple], max_rounds: int):
        """DAPO dynamic sampling: rounds — `first`, then more from `sample()` — until B groups have signal or
        `max_rounds` were sampled. -> the chosen batch as `_round` gives one (this process's rows, on the first
        rollout's device) and the dynamic_sampling/* metrics."""
        B, G = self.recipe.train.prompts_per_step, self.G
        device = first[1].completion_ids.device
        rounds = [self._whole(*first)]
        signal = [groups_with_signal(rounds[0].total, G)]
        while sum(map(sum, signal)) < B and len(rounds) < max_rounds:
            rounds.append(self._whole(*sample()))
            signal.append(groups_with_signal(rounds[-1].total, G))
        picks = pick_groups(signal, B)
        chosen = assemble(rounds, picks, G, self.generator.pad_id)
        local = list(self.rows)
        return (chosen.batch, chosen.rollout.select(local).to(device), chosen.rewards.select(local), chosen.total,
                dynamic_sampling_metrics(rounds, signal, picks, B))

    def _whole(self, batch: PromptBatch, rollout: Rollout, rewards: RewardResult, total: torch.Tensor) -> Round:
        """A round with every process's rows (each process scored only its own; its error counts stay its own)."""
        from dataclasses import replace

        rollout = rollout.to("cpu")
        if self.procs.count > 1:
            parts = self.procs.gather_rows([(rollout, rewards)])  # in process order: the rows' order
            rollout = Rollout.cat([p[0] for p in parts], self.generator.pad_id)
            rewards = replace(RewardResult.cat([p[1] for p in parts]), errors=rewards.errors, timeouts=rewards.timeouts,
                              nonfinite=rewards.nonfinite)
        return Round(batch=batch, rollout=rollout, rewards=rewards, total=total.cpu())


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


def build_rollout_source(recipe, *, policy, tokenizer, stream, procs: Processes, rows: range, device, sharded: bool,
                         model_cfg, resumed_adapters: bool) -> RolloutSource:
    """The run's backend and source. `policy`: the unwrapped model (hf samples with it); `model_cfg`: the model
    section it was loaded from (a checkpoint's folder when resuming): a colocated vLLM engine starts from that
    folder (LoRA: from the base, the merged weights are synced); `resumed_adapters`: LoRA adapters restored from a
    checkpoint, which such an engine does not hold yet."""
    from grpo_cli.agents.episodes import episode_runner
    from grpo_cli.models.loading import resolve_model_source

    ro, backend = recipe.rollout, backend_of(recipe.rollout)
    model_dir = resolve_model_source(recipe.model if recipe.model.lora.r else model_cfg) \
        if backend.loads_model_folder else None
    generator = build_generator(ro, tokenizer=tokenizer, model=policy, synced=sharded, model_dir=model_dir,
                                seed=recipe.train.seed + procs.index)
    # a server may hold other weights; a colocated engine holds the base, not the resumed adapters
    if backend.own_weights and (not backend.in_process or resumed_adapters):
        generator.sync_weights(policy)
    episodes = episode_runner(recipe, tokenizer, generator, policy)  # rollout.environment / rollout.tools
    return RolloutSource(recipe, generator=generator, episodes=episodes, stream=stream, procs=procs, rows=rows,
                         device=device, tokenizer=tokenizer)


def _hf(cfg, *, model, tokenizer, synced: bool = False, **_: Any) -> Generator:
    from grpo_cli.rollout.hf import HFGenerator

    return HFGenerator(model, tokenizer, cfg, synced=synced)


def _vllm_colocate(cfg, *, tokenizer, model_dir: str, seed: int, **_: Any) -> Generator:
    from grpo_cli.rollout.vllm_colocate import VLLMColocateGenerator

    return VLLMColocateGenerator(model_dir, tokenizer, cfg, seed)


def _vllm_server(cfg, *, tokenizer, seed: int, **_: Any) -> Generator:
    from grpo_cli.rollout.vllm_server import VLLMServerGenerator

    return VLLMServerGenerator(tokenizer, cfg, seed)


BUILDERS = {"hf": _hf, "vllm-colocate": _vllm_colocate, "vllm-server": _vllm_server}  # one per BACKENDS name


def build_generator(cfg, *, tokenizer, model=None, model_dir: str | None = None, seed: int = 0,
                    synced: bool = False) -> Generator:
    """The backend `cfg` (a recipe's rollout section) names (training, `grpo eval` and the run's eval go through
    it). `model`: the policy (hf samples with it); `model_dir`: the folder a colocated engine loads; `seed`:
    per-request seeds (vLLM); `synced`: the policy's weights are sharded over processes (hf)."""
    return BUILDERS[backend_name(cfg)](cfg, model=model, tokenizer=tokenizer, model_dir=model_dir, seed=seed,
                                       synced=synced)
