"""Where each step's batch comes from: DeepSeekMath Algorithm 1's "sample G outputs for each question", scored.

The engine asks a `Rollouts` (grpo_cli/rollout/protocol.py) for step t's `StepBatch` and hands it the weights after
each update; it sees none of the choices behind it. The implementations, each small and none with a mode flag:
- `Sampled`: B prompts from the stream, completed now by the backend B*G times (one turn each, or multi-turn
  episodes), this process's rows scored;
- `Ahead`: the same batches sampled k steps ahead by a `grpo serve-vllm` (rollout.max_staleness; the schedule
  is grpo_cli/rollout/pipeline.py's);
- `DynamicSampling` (grpo_cli/rollout/dynamic.py): DAPO's wrapper, rounds of `Sampled` until B groups have signal;
- `Recorded` (grpo_cli/rollout/recorded.py): each step's recorded batch, for `grpo replay`.
`build_rollouts` picks the run's. Adding a schedule is a class with these methods and its line there.

The generation batch is split evenly over processes by rows; every process gets every row's rewards (a group
is normalised over all its G completions) and, with step rewards, every row's steps.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from grpo_cli.agents.runners import episode_runner
from grpo_cli.data.prompts import user_prompts
from grpo_cli.datatypes import Processes, PromptBatch, Rollout, StepBatch
from grpo_cli.models.loading import resolve_model_source
from grpo_cli.process.clock import Clock
from grpo_cli.recipe.names import is_reward_model
from grpo_cli.rewards import score_rollout
from grpo_cli.recipe.backends import backend_of
from grpo_cli.rollout.backends import Generator, build_generator
from grpo_cli.rollout.dynamic import DynamicSampling
from grpo_cli.rollout.pipeline import Serialized, start_pipeline
from grpo_cli.rollout.protocol import Rollouts, Scored


class Sampled:
    """Rollouts sampled when the step asks for them, with the weights of the step before."""

    def __init__(self, recipe, *, generator: Generator, episodes, stream, procs: Processes, rows: range, device,
                 tokenizer) -> None:
        self.recipe, self.generator, self.episodes, self.stream = recipe, generator, episodes, stream
        self.procs, self.rows, self.device, self.tokenizer = procs, rows, device, tokenizer
        self.G = recipe.algorithm.num_generations

    # ------------------------------------------------------------------ the run
    def prepare(self) -> str | None:
        """rollout.compile: the static cache and the compiled decode step; a grpo serve-vllm client: how LoRA
        weights travel."""
        prepare = getattr(self.generator, "prepare", None)
        return prepare(len(self.rows), self.recipe.data.max_prompt_length) if prepare is not None else None

    def start(self, step: int) -> None:
        pass

    def next(self, step: int, clock: Clock) -> StepBatch:
        return self.step_batch(step, self.round(step, clock))

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        self.generator.wake_up()
        self.generator.sync_weights(policy)
        return synced(self.generator)

    def eval_generator(self, sharded: bool) -> Generator | None:
        """A backend with its own weights is reused (one vLLM engine per process); hf samples with the policy
        itself unless its weights are sharded."""
        return self.generator if backend_of(self.recipe.rollout).own_weights or sharded else None

    def sampling_copy(self) -> torch.nn.Module | None:
        return getattr(self.generator, "copy", None)

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"generator_per_rank": self.generator}  # e.g. vLLM's request seeds continue where they were

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()  # an agent endpoint's server
        self.generator.close()

    def _episode_counts(self) -> dict[str, int]:
        return self.episodes.take_counts()

    # ------------------------------------------------------------------ a round: sampled, then scored
    def round(self, step: int, clock: Clock, wake: bool = False) -> Scored:
        """B prompts -> this process's rows of their B*G completions, scored, and the weighted rewards of all rows
        (every process's), [N]. `wake`: a later round of the step, after the generator went to sleep."""
        with clock("generate"):
            batch, mine, rollout, episode_columns = self._sample(wake)
            rollout = rollout.to(self.device)
        with clock("score"):
            columns = mine.columns | episode_columns
            r = self.recipe
            users = user_prompts(r.data, columns) if any(is_reward_model(s.name) for s in r.rewards) else None
            rewards = score_rollout(r.rewards, rollout, columns, max_completion_length=r.rollout.max_completion_length,
                                    step=step, user_prompts=users, tokenizer=self.tokenizer)  # users: RMs' templates
        total = self.procs.gather(torch.tensor(rewards.total, dtype=torch.float32))  # [N] every process's rows
        self.stream.observe(batch.indices, total.tolist(), self.G)  # data.curriculum marks the groups without signal
        return Scored(batch, rollout, rewards, total)

    def _sample(self, wake: bool) -> tuple[PromptBatch, PromptBatch, Rollout, dict[str, list]]:
        """-> the step's prompts (the same B on every process), this process's rows of them (each its prompt's
        columns) and of their completions, and the columns multi-turn episodes add (turns, environment rewards)."""
        batch = self.stream.next_batch()
        if wake:
            self.generator.wake_up()
        mine = batch.per_row(self.rows, self.G)
        columns: dict[str, list] = {}
        if self.episodes is not None:
            with_reward = any(s.name == "environment" for s in self.recipe.rewards)
            rollout, columns = self.episodes.run(mine, with_reward=with_reward)
        else:
            rollout = self.generator.generate(mine.input_ids, mine.texts)
        self.generator.sleep()  # colocated vLLM on GPU (sleep_mode): give the trainer its memory
        return batch, mine, rollout, columns

    def step_batch(self, step: int, chosen: Scored, metrics: dict[str, float] | None = None) -> StepBatch:
        """A round (this process's rows) -> the step's batch, with what sampling measured (`metrics`)."""
        batch, rollout, rewards = chosen.batch, chosen.rollout, chosen.rewards
        metrics = dict(metrics or {})
        if rollout.weight_step is not None:  # steps between the weights that sampled and the ones being trained
            metrics["sampling/staleness/mean"] = metrics["sampling/staleness/max"] = float(step - 1 - rollout.weight_step)
        if self.episodes is not None:  # environment failures and tool calls this step, every process's
            metrics |= episode_metrics(self._episode_counts(), self.recipe.rollout, self.procs.total,
                                       tools=self.episodes.uses_tools, splits=self.episodes.splits)
        columns = [[math.nan if v is None else v for v in col] for col in rewards.per_function.values()]
        per_function = torch.tensor(columns, dtype=torch.float32).reshape(len(columns), len(rollout))  # [K, n]
        return StepBatch(
            prompts=batch, rollout=rollout, rewards=rewards, rows=self.rows, total=chosen.total,
            per_function=self.procs.gather(per_function.T.contiguous()),  # [N, K]
            weights=[spec.weight for spec in self.recipe.rewards],
            steps={name: self.procs.gather_rows(col) for name, col in rewards.steps.items()}, metrics=metrics,
        )


class Ahead(Sampled):
    """Rollouts sampled k = rollout.max_staleness steps ahead by a `grpo serve-vllm` while the trainer updates; the
    batches in flight at a checkpoint are part of it (the weights that sampled them are gone)."""

    def __init__(self, recipe, **parts: Any) -> None:
        super().__init__(recipe, **parts)
        self._in_flight: list[dict] = []  # at the checkpoint resumed from
        self._counts: dict[str, int] | None = None  # the episode counts of the batch taken last
        self.pipeline = None  # started by `start`

    def start(self, step: int) -> None:
        """The first k + 1 batches, or those in flight at the checkpoint, topped up."""
        self.pipeline = start_pipeline(self.generator, self.recipe, self.G, step, self._in_flight, self.stream,
                                       self.episodes)

    def _sample(self, wake: bool) -> tuple[PromptBatch, PromptBatch, Rollout, dict[str, list]]:
        batch, rollout, columns, self._counts = self.pipeline.next()  # the wait is what shows as generate
        return batch, batch.per_row(self.rows, self.G), rollout, columns

    def _episode_counts(self) -> dict[str, int]:
        return self._counts  # the batch's own: its episodes ran on the pipeline's worker

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, int]:
        """The weights are written now and loaded by the server after the batches sampled before them."""
        self.pipeline.submit_weights(policy, step)
        if step + self.recipe.rollout.max_staleness + 1 <= self.recipe.train.max_steps:
            self.pipeline.submit_batch(self.stream.next_batch())
        return synced(self.generator)

    def eval_generator(self, sharded: bool) -> Generator | None:
        """Through the pipeline's queue: after the batches in flight, with this step's weights."""
        return Serialized(self.pipeline)

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        shared, own = super().checkpoint_parts()
        return {"in_flight": self, **shared}, own

    def state_dict(self) -> list[dict]:
        """The batches in flight, waited for."""
        return self.pipeline.state() if self.pipeline is not None else []

    def load_state_dict(self, state: list[dict]) -> None:
        self._in_flight = state

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        super().close()


def synced(generator) -> dict[str, float]:
    """What a weight sync reports: the bytes handed over, and with several servers how many are live."""
    pool = generator.metrics() if callable(getattr(type(generator), "metrics", None)) else {}
    return {"sync/bytes": int(getattr(generator, "sync_bytes", 0)), **pool}


def episode_metrics(counts: dict[str, int], rollout_cfg, total: Callable[[float], float], *,
                    tools: bool, splits: bool = False) -> dict[str, float]:
    """Multi-turn counters of this process (EpisodeRunner.take_counts) -> the step's metrics; `total` sums a
    number over processes. tools/call_frequency: tool calls per episode; tools/failure_frequency: the share of
    calls that failed (malformed, unknown tool, an exception, a timeout); `tools`: whether the model has any
    (rollout.tools, or an environment's methods). episodes/samples: training samples per episode, where episodes
    are split where the template changes their history (`splits`, rollout.history_change: split)."""
    m: dict[str, float] = {}
    if rollout_cfg.environment is not None:
        m["environment/errors"], m["environment/timeouts"] = total(counts["errors"]), total(counts["timeouts"])
    if rollout_cfg.agent is not None:  # agent programs (agents/programs.py)
        m["agent/errors"], m["agent/timeouts"] = total(counts["errors"]), total(counts["timeouts"])
        m["agent/rewrites"] = total(counts["rewrites"])
        m["agent/tool_call_frequency"] = total(counts["tool_calls"]) / max(total(counts["episodes"]), 1.0)
    if tools:
        calls, episodes = total(counts["tool_calls"]), total(counts["episodes"])
        m["tools/call_frequency"] = calls / max(episodes, 1.0)
        m["tools/failure_frequency"] = total(counts["tool_failures"]) / calls if calls else 0.0
    if splits:
        m["episodes/samples"] = total(counts["samples"]) / max(total(counts["episodes"]), 1.0)
    return m


def build_rollouts(recipe, *, policy, tokenizer, stream, procs: Processes, rows: range, device, sharded: bool,
                   model_cfg, resumed_adapters: bool) -> Rollouts:
    """The run's backend and schedule. `policy`: the unwrapped model (hf samples with it); `model_cfg`: the model
    section it was loaded from (a checkpoint's folder when resuming): a colocated vLLM engine starts from that
    folder (LoRA: from the base, the merged weights are synced); `resumed_adapters`: LoRA adapters restored from a
    checkpoint, which such an engine does not hold yet."""
    ro, backend = recipe.rollout, backend_of(recipe.rollout)
    model_dir = resolve_model_source(recipe.model if recipe.model.lora.r else model_cfg) \
        if backend.loads_model_folder else None
    generator = build_generator(ro, tokenizer=tokenizer, model=policy, synced=sharded, model_dir=model_dir,
                                seed=recipe.train.seed + procs.index)
    # a server may hold other weights; a colocated engine holds the base, not the resumed adapters
    if backend.own_weights and (not backend.in_process or resumed_adapters):
        generator.sync_weights(policy)
    episodes = episode_runner(recipe, tokenizer, generator, policy)  # rollout.environment / rollout.tools
    schedule = Ahead if ro.max_staleness else Sampled
    rollouts = schedule(recipe, generator=generator, episodes=episodes, stream=stream, procs=procs, rows=rows,
                        device=device, tokenizer=tokenizer)
    return DynamicSampling(rollouts) if recipe.algorithm.dynamic_sampling.enabled else rollouts
