"""Agent programs (`rollout.agent`): black-box agents that own their tool loop and talk to the policy through an
OpenAI-compatible endpoint (agents/endpoint.py), trained on what they were answered.

A program is a function, named like a reward (`path/to/agent.py:fn`, `module:fn`), sync or async:

    fn(base_url: str, api_key: str, row: dict, **rollout.agent_kwargs) -> float | None

called once per rollout, each call in its own child process: it builds its own client
(`openai.OpenAI(base_url=base_url, api_key=api_key)`), runs its episode against the row (the dataset row's columns),
and may return the episode's reward (the built-in reward `environment`). At most `rollout.agent_concurrency`
programs run at once; one that overruns `rollout.agent_timeout_s` is killed and its episode cut where it was
(agent/timeouts), one that raises is counted (agent/errors) and its reward is missing. The trainer rebuilds each
episode from the endpoint's record: the prompt its first request rendered, then every sampled and observed token in
order (observations masked out of the loss), the sampler's log-probs. Importing this module must not import torch.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from grpo_cli.agents.endpoint import Endpoint, Session
from grpo_cli.agents.records import Episode, EpisodeRecords
from grpo_cli.agents.verifiers import PREFIX as VERIFIERS
from grpo_cli.agents.verifiers import check as verifiers_check
from grpo_cli.agents.verifiers import is_verifiers
from grpo_cli.usercode import objects
from grpo_cli.usercode.children import become_subreaper, kill_tree, mp_context, send_error

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from grpo_cli.datatypes import PromptBatch, Rollout

log = logging.getLogger(__name__)


def resolve_program(name: str) -> Any:
    return objects.resolve_object(name, kind="agent program", what="function")


def check_program(name: str, kwargs: dict[str, Any]) -> None:
    """ValueError starting with the field unless `name` is a function taking (base_url, api_key, row, **kwargs)."""
    if is_verifiers(name):  # grpo's own program runs the taskset's episodes
        try:
            verifiers_check(name, kwargs)
        except ValueError as e:
            raise ValueError(f"rollout.agent: {e}") from None
        return
    try:
        fn = resolve_program(name)
    except ValueError as e:
        raise ValueError(f"rollout.agent: {e}") from None
    if not callable(fn) or inspect.isclass(fn):
        raise ValueError(f"rollout.agent: {name} is not a function fn(base_url, api_key, row, **kwargs)")
    try:
        inspect.signature(fn).bind("http://x", "key", {}, **kwargs)
    except TypeError as e:
        raise ValueError(f"rollout.agent: {name}{inspect.signature(fn)} cannot be called as fn(base_url, api_key, "
                         f"row{', ' + ', '.join(kwargs) if kwargs else ''}) (rollout.agent_kwargs): {e}") from None
    except ValueError:
        pass


def _program_main(name: str, base_url: str, api_key: str, row: dict, kwargs: dict, conn: Connection) -> None:
    """Child process: run the program, send ("ok", reward or None) or ("error", text)."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    become_subreaper()
    try:
        result = resolve_program(name)(base_url, api_key, row, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        if result is not None and not (isinstance(result, (int, float)) and not isinstance(result, bool)):
            raise TypeError(f"it returned {type(result).__name__} {str(result)[:60]!r}, not a reward (float or None)")
        conn.send(("ok", None if result is None else float(result)))
    except BaseException as e:  # noqa: BLE001 - everything goes back, counted
        send_error(conn, e)
    finally:
        conn.close()


class AgentRunner(EpisodeRecords):
    """Runs a generation batch's rows as agent programs against the endpoint; the EpisodeRunner's interface."""

    uses_tools = False  # the program owns its tools; the calls the model wrote: agent/tool_call_frequency

    def __init__(self, cfg, data_cfg, tokenizer, generator, context_limit: int, model_name: str = "policy") -> None:
        self.cfg, self.tok, self.generator = cfg, tokenizer, generator
        self.endpoint = Endpoint(tokenizer, generator, cfg, data_cfg, context_limit, model_name=model_name)
        self.name, self.kwargs = objects.portable(cfg.agent), dict(cfg.agent_kwargs)
        if is_verifiers(cfg.agent):  # agents/verifiers.py: the taskset's Env, its harness and rubric, per episode
            self.name = "grpo_cli.agents.verifiers:episode"
            self.kwargs = {"taskset": cfg.agent.removeprefix(VERIFIERS), **self.kwargs}
        self.splits = bool(self.endpoint.splitting)  # rollout.history_change: split, on a template that needs it
        self.counts = self._zero()
        self._reported: set[str] = set()
        self._sampler_logps = False

    @staticmethod
    def _zero() -> dict[str, int]:
        return {"episodes": 0, "samples": 0, "errors": 0, "timeouts": 0, "rewrites": 0, "tool_calls": 0}

    def take_counts(self) -> dict[str, int]:
        out, self.counts = self.counts, self._zero()
        return out

    def run(self, batch: PromptBatch, *, with_reward: bool, **sampling: Any) -> tuple[Rollout, dict[str, list]]:
        """One program per row of `batch` -> the Rollout of what they were answered, and the reward columns it adds
        (`turns`, and `environment_reward`: what each program returned)."""
        rows = [{k: v[i] for k, v in batch.columns.items()} for i in range(len(batch))]
        self.endpoint.batcher.sampling = sampling
        sessions = [self.endpoint.open() for _ in rows]
        try:
            results = self._programs(sessions, rows)
        finally:
            for s in sessions:
                self.endpoint.close_session(s)
        episodes, texts = [], []
        for i, s in enumerate(sessions):
            if s.messages is None:  # the program never asked: the row's prompt, nothing sampled
                episodes.append(Episode(prompt=list(batch.input_ids[i]), done=True, failed=True, truncated=True))
                texts.append(batch.texts[i])
                continue
            episodes.append(Episode(prompt=s.prompt, tokens=s.tokens, observed=s.observed, logps=s.logps,
                                    turns=s.turns, sampled=s.sampled, done=True, truncated=s.truncated,
                                    segments=s.segments))
            texts.append(s.prompt_text)
            self.counts["rewrites"] += s.rewrites
            self.counts["tool_calls"] += s.tool_calls
        self.counts["episodes"] += len(rows)
        self.counts["samples"] += sum(1 + len(e.segments) for e in episodes)
        self._sampler_logps = any(s.sampled for s in sessions) and self.endpoint.batcher.logps_seen
        rollout = self._rollout(episodes, texts)
        rewards = [r if with_reward and not isinstance(r, str) else None for r in results]
        return rollout, {"turns": rollout.turns, "environment_reward": rewards}

    def _programs(self, sessions: list[Session], rows: list[dict]) -> list[float | None | str]:
        """Every row's program, at most agent_concurrency at once -> each one's reward, or "errors" / "timeouts"."""
        results: list[Any] = [None] * len(rows)
        waiting = list(range(len(rows)))
        live: dict[Any, tuple[int, Any, float]] = {}  # reader -> (row, process, deadline)
        try:
            self._loop(sessions, rows, results, waiting, live)
        finally:  # the sampler failed (the run stops): no program outlives it
            for reader, (_, proc, _) in live.items():
                kill_tree(proc)
                reader.close()
            self.endpoint.running = 0
        return results

    def _loop(self, sessions: list[Session], rows: list[dict], results: list, waiting: list[int], live: dict) -> None:
        c, ctx = self.cfg, mp_context()
        while waiting or live:
            while waiting and len(live) < c.agent_concurrency:
                i = waiting.pop(0)
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_program_main, name="agent", args=(
                    self.name, self.endpoint.base_url(sessions[i]), self.endpoint.token, rows[i], self.kwargs,
                    writer))
                proc.start()
                writer.close()
                live[reader] = (i, proc, time.monotonic() + c.agent_timeout_s)
                self.endpoint.running = len(live)
            soonest = min(d for _, _, d in live.values())
            batcher = self.endpoint.batcher
            for reader in wait([*live, batcher.wake], timeout=max(0.0, soonest - time.monotonic())):
                if reader is batcher.wake:  # requests wait: sampled here, on the thread that owns the generator
                    batcher.pump()
                    continue
                i, proc, _ = live.pop(reader)
                try:
                    status, value = reader.recv()
                except EOFError:
                    status, value = "error", f"its process exited ({proc.exitcode}) without an answer"
                results[i] = value if status == "ok" else self._failed(sessions[i], "errors", value)
                reader.close()
                proc.join(5)
            now = time.monotonic()
            for reader, (i, proc, deadline) in list(live.items()):
                if deadline <= now and not reader.poll():
                    live.pop(reader)
                    kill_tree(proc)
                    reader.close()
                    results[i] = self._failed(sessions[i], "timeouts", f"did not end within rollout.agent_timeout_s "
                                                                       f"({c.agent_timeout_s:g} s); it was killed")
            self.endpoint.running = len(live)

    def _failed(self, session: Session, kind: str, text: str) -> str:
        """Count a program that raised or overran; its episode is cut where it was (truncated)."""
        self.counts[kind] += 1
        session.truncated = True
        if kind not in self._reported:
            self._reported.add(kind)
            log.warning("agent %s: %s (its episode is cut there and its reward is missing; later ones are only "
                        "counted in agent/%s)", self.cfg.agent, text, kind)
        return kind

    def close(self) -> None:
        self.endpoint.close()

