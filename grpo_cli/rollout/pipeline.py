"""Asynchronous rollouts with a bounded, fixed staleness (`rollout.max_staleness: k`, `grpo serve-vllm`).

With k >= 1 the rollouts of step t are sampled with the weights after step t-1-k (synchronous GRPO: t-1),
so the server samples the next batches while the trainer updates. One worker thread talks to the server
and runs its jobs strictly in the order they were submitted:

    before step 1:   generate b1 .. b(k+1)                       (initial weights, "step 0")
    after step t:    load the weights of step t, generate b(t+k+1)

The weights are written to a file in the trainer's thread when a load is submitted (a snapshot: training
goes on while the file waits its turn) and loaded by the worker in order, so every batch is sampled with
exactly the weights the schedule names, however long anything takes, and the request seeds (a counter
the server generator keeps) follow the same order: two runs sample the same tokens. A checkpoint waits
for the batches in flight and stores them (their prompts' data rows, the sampled tokens and log-probs,
the step of the weights that sampled them): the weights that sampled them are gone, so a resumed run
takes them from the checkpoint instead of sampling them again.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from grpo_cli.datatypes import PromptBatch, Rollout
from grpo_cli.rollout.common import build_rollout, pad_completions


@dataclass
class InFlight:
    batch: PromptBatch
    result: Future  # -> (Rollout, policy_step)


class RolloutPipeline:
    """Rollouts of a `grpo serve-vllm` generator, `staleness` steps ahead of the trainer; single completions, or
    multi-turn episodes run by `episodes` (an EpisodeRunner) on the worker, environments and tools included."""

    def __init__(self, generator, staleness: int, group_size: int, loaded_step: int, episodes=None,
                 with_reward: bool = False) -> None:
        """`loaded_step`: the step whose weights the server holds now (the run's start or its checkpoint);
        `with_reward`: episodes ask their environments for the reward `environment`."""
        self.generator, self.staleness, self.G = generator, staleness, group_size
        self.episodes, self.with_reward = episodes, with_reward
        self.pending: collections.deque[InFlight] = collections.deque()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-rollouts")
        self._loaded_step = loaded_step  # whose weights the server holds, as far as the worker has got
        self._failed: BaseException | None = None  # a failed job fails every later one: no sampling on stale weights

    # ---------------------------------------------------------------- jobs, in order
    def _run(self, fn: Callable[[], Any]) -> Future:
        def job():
            if self._failed is not None:
                raise RuntimeError(f"an earlier rollout job failed: {self._failed}") from self._failed
            try:
                return fn()
            except BaseException as e:
                self._failed = e
                raise

        return self._worker.submit(job)

    def submit_weights(self, model: torch.nn.Module, step: int) -> None:
        """The weights after `step`, for the batches submitted after this call (written now, loaded in order)."""
        path = self.generator.write_weights(model)

        def load():
            self.generator.load_weights(path)
            self._loaded_step = step

        self._run(load)

    def submit_batch(self, batch: PromptBatch) -> None:
        """Sample batch (its B*G rows) with the weights submitted last."""
        G = self.G

        def generate():
            rows = batch.per_row(range(len(batch) * G), G)
            if self.episodes is None:
                return self.generator.generate(rows.input_ids, rows.texts), self._loaded_step, {}, None
            rollout, columns = self.episodes.run(rows, with_reward=self.with_reward)
            return rollout, self._loaded_step, columns, self.episodes.take_counts()

        self.pending.append(InFlight(batch, self._run(generate)))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker after everything submitted so far (e.g. an eval's generate); -> its result."""
        return self._run(fn).result()

    # ---------------------------------------------------------------- results
    def next(self) -> tuple[PromptBatch, Rollout, dict[str, list], dict[str, int] | None]:
        """The oldest batch in flight: its prompts, its rollout (`weight_step`: whose weights sampled it), the
        reward columns its episodes add (turns, environment rewards) and their counts (EpisodeRunner.take_counts)."""
        item = self.pending.popleft()
        rollout, policy_step, columns, counts = item.result.result()
        return item.batch, replace(rollout, weight_step=policy_step), columns, counts

    def state(self) -> list[dict]:
        """The batches in flight, waited for, as JSON (the generator's request counter is then final too); an
        episode's environment is gone by then, so its reward and counts are stored with it."""
        out = []
        for item in self.pending:
            rollout, policy_step, columns, counts = item.result.result()
            out.append({"indices": item.batch.indices, "policy_step": policy_step})
            if self.episodes is not None:
                out[-1]["episodes"] = self.episodes.saved(rollout) | {"columns": columns, "counts": counts}
                continue
            mask = rollout.completion_mask.bool()
            out[-1] |= {"completion_ids": [row[m].tolist() for row, m in zip(rollout.completion_ids, mask)],
                        "sampling_logps": [row[m].tolist() for row, m in zip(rollout.sampling_logps, mask)],
                        "truncated": rollout.truncated.tolist()}
        return out

    def restore(self, state: list[dict], batch_of: Callable[[list[int]], PromptBatch]) -> None:
        """Batches in flight at a checkpoint, from `state()`; `batch_of` renders data rows as the stream does."""
        G, gen = self.G, self.generator
        for item in state:
            batch = batch_of(item["indices"])
            columns, counts = {}, None
            if "episodes" in item:
                saved = item["episodes"]
                rollout, columns, counts = self.episodes.restored(saved), saved["columns"], saved["counts"]
            else:
                completion_ids, mask, logps = pad_completions(item["completion_ids"], item["sampling_logps"],
                                                              gen.pad_id, gen.eos_ids)
                rows = batch.per_row(range(len(batch) * G), G)
                rollout = build_rollout(rows.input_ids, rows.texts, 1, completion_ids, mask,
                                        torch.tensor(item["truncated"]), gen.tokenizer, gen.pad_id, logps)
            done: Future = Future()
            done.set_result((rollout, int(item["policy_step"]), columns, counts))
            self.pending.append(InFlight(batch, done))

    def close(self) -> None:
        """Drop what has not started; a request already at the server finishes there."""
        self._worker.shutdown(wait=False, cancel_futures=True)


def start_pipeline(generator, recipe, group_size: int, start_step: int, saved: list[dict] | None, stream,
                   episodes=None) -> RolloutPipeline:
    """The pipeline of a run starting at `start_step`: the batches in flight at its checkpoint (`saved`), topped up
    to k + 1 (a fresh run; one resumed with a larger train.max_steps samples them with the weights it has)."""
    k, max_steps = recipe.rollout.max_staleness, recipe.train.max_steps
    pipeline = RolloutPipeline(generator, k, group_size, loaded_step=start_step, episodes=episodes,
                               with_reward=any(s.name == "environment" for s in recipe.rewards))
    if saved:
        pipeline.restore(saved, stream.batch_of)
    for _ in range(min(k + 1, max_steps - start_step) - len(pipeline.pending)):
        pipeline.submit_batch(stream.next_batch())
    return pipeline


class Serialized:
    """The pipeline's generator for other callers (the run's eval): each `generate` runs on the worker after
    everything submitted before it, with the weights submitted last."""

    def __init__(self, pipeline: RolloutPipeline) -> None:
        self._pipeline = pipeline

    def generate(self, *args, **kwargs) -> Rollout:
        return self._pipeline.call(lambda: self._pipeline.generator.generate(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline.generator, name)
