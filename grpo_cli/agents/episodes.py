"""Multi-turn episodes (`rollout.environment`, `rollout.tools`, `rollout.max_turns`): the model acts, an
environment or a tool answers, the model acts again; token in, token out.

Each rollout row is one episode with its own environment instance (grpo_cli/agents/environments.py). Every turn, all
episodes waiting for the model are continued together by the backend (`Generator.sample`), each from its exact
token sequence so far: the prompt, the tokens the policy sampled, and the observation tokens appended between
turns (each observation tokenized once, as the chat template renders it after an assistant turn). Nothing is
decoded and re-encoded, so the trained tokens are the sampled ones.

After an assistant turn that ended with EOS: with tools, its tool calls run (grpo_cli/agents/tools.py) and their answers
are the next turn (`tool` messages); a turn without a call goes to the environment's `step`, or, with tools and
no environment, is the final answer and ends the episode.

The episode's completion is everything after the prompt. `observation_mask` marks the observation tokens: they
are attended to but get no loss, no KL, no entropy and are not counted in lengths. Budgets: at most
`max_completion_length` sampled tokens per episode and `max_episode_length` tokens in all (prompt + turns); an
episode that hits either, or whose turn ends without EOS, is truncated. After `max_turns` assistant turns the
episode ends (the environment still sees the last turn).

Where the chat template renders the next turn's history differently from the tokens so far (Qwen3's drops earlier
<think> blocks once a user turn follows; agents/observations.py detects it), `rollout.history_change: split` (the
default) continues the episode from the template's rendering of the whole conversation, as a deployed model sees
it: a new training sample of the same episode (grpo_cli/trainer/samples.py), its tokens still in the episode's row
once. `keep` appends the observation's tokens as everywhere else. Budgets count the current sample's context.
"""

from __future__ import annotations

import logging
from typing import Any

from grpo_cli.agents.chat import answer_message
from grpo_cli.agents.environments import EnvFailure, EnvSpec, call_all, environment_specs, open_environments
from grpo_cli.agents.observations import Observations, history_notice, split_roles
from grpo_cli.agents.records import Episode, EpisodeRecords
from grpo_cli.agents.tools import Call, ToolBox, parse_calls
from grpo_cli.data.prompts import encode_prompts, prompt_messages, render_messages, render_prompt
from grpo_cli.datatypes import PromptBatch, Rollout
from grpo_cli.errors import DataError, EnvironmentUnavailable

log = logging.getLogger(__name__)


class EpisodeRunner(EpisodeRecords):
    """Runs a generation batch's episodes against a generator; counts environment failures."""

    def __init__(self, cfg, data_cfg, tokenizer, generator, context_limit: int) -> None:
        self.cfg, self.data_cfg, self.tok, self.generator = cfg, data_cfg, tokenizer, generator
        self.context_limit = context_limit
        self.observations = Observations(tokenizer, data_cfg.chat_template_kwargs)
        self.toolbox = ToolBox(cfg.tools, cfg.tool_timeout_s) if cfg.tools else None
        self.specs = environment_specs(cfg)  # {route: EnvSpec}
        self.uses_tools = bool(cfg.tools) or any(s.tools for s in self.specs.values())
        roles = {"tool"} if self.uses_tools else set()
        roles |= {"user"} if any(s.api == "turns" for s in self.specs.values()) else set()
        self.splitting = split_roles(self.observations.changes_history, roles, cfg.history_change)
        self.splits = bool(self.splitting)
        notice = history_notice(self.observations.changes_history, roles, cfg.history_change)
        if notice:
            log.warning(notice)
        self.counts = self._zero()
        self._reported: set[str] = set()
        self._sampler_logps = False  # whether the backend reports log-probs (vLLM, a sampling copy)

    @staticmethod
    def _zero() -> dict[str, int]:
        return {"episodes": 0, "samples": 0, "errors": 0, "timeouts": 0, "tool_calls": 0, "tool_failures": 0}

    def close(self) -> None:
        pass  # environments are closed with their episodes

    def take_counts(self) -> dict[str, int]:
        """Since the last call: episodes, environment failures (errors, timeouts), tool calls and failed ones."""
        out, self.counts = self.counts, self._zero()
        return out

    def run(self, batch: PromptBatch, *, with_reward: bool, **sampling: Any) -> tuple[Rollout, dict[str, list]]:
        """One episode per row of `batch` (each row's prompt, columns) -> the Rollout and the reward columns it
        adds: `turns`, and `environment_reward` (the environments' reward() / get_reward(), where `with_reward`).
        `sampling`: greedy / temperature / top_p for every turn (`grpo eval`)."""
        c = self.cfg
        rows = [{k: v[i] for k, v in batch.columns.items()} for i in range(len(batch))]
        specs = [self._route(row) for row in rows]
        envs = open_environments(specs, c.environment_timeout_s) if self.specs else None
        self.counts["episodes"] += len(rows)
        try:
            texts = list(batch.texts)
            episodes = [Episode(prompt=list(ids), spec=spec) for ids, spec in zip(batch.input_ids, specs)]
            resets = [s.reset_args(row, c.environment_column) for s, row in zip(specs, rows)] if envs else []
            resets = call_all(envs, "reset", [a for a, _ in resets], c.environment_timeout_s,
                              [k for _, k in resets]) if envs else []
            for i, extra in enumerate(resets):
                if isinstance(extra, EnvFailure):
                    self._fail(episodes[i], extra)
                elif extra or specs[i].tools:  # the prompt again, with reset's text and this environment's tools
                    texts[i] = render_prompt(rows[i], self.data_cfg, self.tok, extra_user_text=str(extra or ""),
                                             tools=self._schemas(episodes[i]) or None)
                    episodes[i].prompt = encode_prompts([texts[i]], self.tok, self.data_cfg.max_prompt_length)[0]
            if self.splitting:  # the conversation, for the template to render where it changes the history
                for e, row, extra in zip(episodes, rows, resets or [None] * len(rows)):
                    e.messages = prompt_messages(row, self.data_cfg, None if isinstance(extra, EnvFailure) else
                                                 str(extra or ""))
                    e.tools = self._schemas(e) or None
            for turn in range(c.max_turns):
                self._turn(episodes, envs, last=turn == c.max_turns - 1, sampling=sampling)
            rewards = self._rewards(episodes, envs) if with_reward and envs else [None] * len(episodes)
            self.counts["samples"] += sum(1 + len(e.segments) for e in episodes)
        finally:
            for env in envs or []:
                env.close()
        rollout = self._rollout(episodes, texts)
        return rollout, {"turns": rollout.turns, "environment_reward": rewards}

    def _route(self, row: dict[str, Any]) -> EnvSpec | None:
        if not self.specs:
            return None
        if None in self.specs:
            return self.specs[None]
        column = self.cfg.environment_column
        if column not in row:
            raise DataError(f"rollout.environment routes rows by their {column!r} column (rollout.environment_column)"
                            f", which the data does not have; columns: {', '.join(row)}")
        route = row[column]
        if route not in self.specs:
            raise DataError(f"a row's {column!r} is {route!r}, which is not a route of rollout.environment "
                            f"({', '.join(map(str, self.specs))})")
        return self.specs[route]

    def _schemas(self, e: Episode) -> list[dict]:
        """The tools this episode's model sees: rollout.tools, then its environment's methods (TRL's contract)."""
        return list(self.toolbox.schemas if self.toolbox else []) + list(e.spec.schemas if e.spec else [])

    def _rewards(self, episodes: list[Episode], envs: list) -> list[float | None]:
        """Each episode's environment reward; None where it failed or its class has no reward method."""
        rewards: list[float | None] = [None] * len(episodes)
        for method in sorted({e.spec.reward_method for e in episodes}):
            alive = [i for i, e in enumerate(episodes) if not e.failed and e.spec.reward_method == method]
            for i, r in zip(alive, call_all([envs[i] for i in alive], method, [()] * len(alive),
                                            self.cfg.environment_timeout_s)):
                if isinstance(r, EnvFailure):
                    self._fail(episodes[i], r)
                else:
                    rewards[i] = r
        return rewards

    def _turn(self, episodes: list[Episode], envs: list | None, last: bool, sampling: dict) -> None:
        c = self.cfg
        waiting, budgets = [], []
        for i, e in enumerate(episodes):
            if e.done:
                continue
            room = min(c.max_completion_length - e.sampled, self.context_limit - len(e.context()))
            if room <= 0:
                e.truncated = e.done = True
                continue
            waiting.append(i)
            budgets.append(room)
        if not waiting:
            return
        out = self.generator.sample([episodes[i].context() for i in waiting], budgets, **sampling)
        self._sampler_logps = out.logps is not None
        stepping, calling = [], []
        for k, i in enumerate(waiting):
            e, toks = episodes[i], out.tokens[k]
            e.tokens += toks
            e.observed += [0] * len(toks)
            e.logps += out.logps[k] if out.logps is not None else [0.0] * len(toks)
            e.sampled += len(toks)
            text = self.tok.decode(toks, skip_special_tokens=True)
            e.turns.append({"role": "assistant", "text": text, "tokens": toks})
            if e.messages is not None:
                e.messages.append(answer_message(text, self.tok.decode(toks)))
            if not out.finished[k]:  # no EOS within the budget: the turn is cut, the episode ends
                e.truncated = e.done = True
                continue
            # the raw text: a template may make the call tags special tokens, which the turn's text leaves out
            calls = parse_calls(self.tok.decode(toks)) if self._schemas(e) else []
            if calls:
                calling.append((i, calls))
            elif e.spec is not None and e.spec.api == "turns":
                stepping.append(i)
            else:  # tools (rollout.tools, or TRL's contract): a turn without a call is the final answer
                e.done = True
        self._answer_calls(episodes, envs, calling, last)
        results = call_all([envs[i] for i in stepping], "step", [(episodes[i].turns[-1]["text"],) for i in stepping],
                           c.environment_timeout_s) if stepping else []
        for i, result in zip(stepping, results):
            e = episodes[i]
            if isinstance(result, EnvFailure):
                self._fail(e, result)
                continue
            observation, done = _step_result(result)
            if done or observation is None or last:
                e.done = True
                continue
            self._observe(e, [{"role": "user", "content": observation}], "environment", observation)

    def _answer_calls(self, episodes: list[Episode], envs: list | None, calling: list[tuple[int, list[Call]]],
                      last: bool) -> None:
        """Run the turn's tool calls (every episode's together: functions in children, environment methods on their
        instances) and append their answers as `tool` messages."""
        if not calling:
            return
        if last:  # no turn left to read the answers in
            for i, _ in calling:
                episodes[i].done = True
            return
        answers: dict[tuple[int, int], tuple[str, bool]] = {}
        functions, methods = [], []  # (episode, call index, call)
        for i, calls in calling:
            spec = episodes[i].spec
            for j, call in enumerate(calls):
                if call.error is not None:
                    answers[i, j] = (f"error: {call.error}", False)
                elif spec is not None and call.name in spec.tools:
                    methods.append((i, j, call))
                elif self.toolbox is not None and call.name in self.toolbox.names:
                    functions.append((i, j, call))
                else:
                    names = [s["function"]["name"] for s in self._schemas(episodes[i])]
                    answers[i, j] = (f"error: there is no tool {call.name!r}; the tools are: {', '.join(names)}", False)
        if functions:
            for (i, j, _), answer in zip(functions, self.toolbox.run([call for _, _, call in functions])):
                answers[i, j] = answer
        self._call_methods(episodes, envs, methods, answers)
        self.counts["tool_calls"] += len(answers)
        self.counts["tool_failures"] += sum(not ok for _, ok in answers.values())
        for i, calls in calling:
            e = episodes[i]
            if e.failed:  # its environment's process died in a call (a timeout): the episode ends there
                continue
            mine = [answers[i, j] for j in range(len(calls))]
            messages = [{"role": "tool", "content": text} for text, _ in mine]
            self._observe(e, messages, "tool", "\n".join(text for text, _ in mine))
        self._ask_done(episodes, envs, [i for i, _ in calling])

    def _ask_done(self, episodes: list[Episode], envs: list | None, called: list[int]) -> None:
        """Environments that say when they are over (an OpenEnv step's done): asked after the turn's calls."""
        asking = [i for i in called if not episodes[i].done and episodes[i].spec is not None
                  and episodes[i].spec.done_method]
        if not asking:
            return
        for i, over in zip(asking, call_all([envs[i] for i in asking], [episodes[i].spec.done_method for i in asking],
                                            [()] * len(asking), self.cfg.environment_timeout_s)):
            if isinstance(over, EnvFailure):
                self._fail(episodes[i], over)
            elif over:
                episodes[i].done = True

    def _call_methods(self, episodes: list[Episode], envs: list, methods: list[tuple[int, int, Call]],
                      answers: dict) -> None:
        """Environment methods called as tools: each episode's calls in order, all episodes' k-th calls together. A
        method that raises is answered with the error (a tool's rule); a timeout kills the instance and ends the
        episode."""
        pending: dict[int, list[tuple[int, Call]]] = {}
        for i, j, call in methods:
            pending.setdefault(i, []).append((j, call))
        while pending:
            batch = [(i, *calls.pop(0)) for i, calls in pending.items() if not episodes[i].failed]
            results = call_all([envs[i] for i, _, _ in batch], [c.name for _, _, c in batch], [()] * len(batch),
                               self.cfg.environment_timeout_s, [c.arguments for _, _, c in batch])
            for (i, j, _), result in zip(batch, results):
                if not isinstance(result, EnvFailure):
                    answers[i, j] = (str(result), True)
                    continue
                answers[i, j] = (f"error: {result.text}", False)
                if result.kind == "timeout" or getattr(envs[i], "dead", False):
                    self._fail(episodes[i], result)
            pending = {i: calls for i, calls in pending.items() if calls and not episodes[i].failed}

    def _observe(self, e: Episode, messages: list[dict], role: str, text: str) -> None:
        """Append an observation's tokens, or end the episode (truncated) if they leave no room for the model. Where
        the template changes the history after such messages (and rollout.history_change is split), the next turn
        is a new training sample instead, sampled in the template's rendering of the whole conversation."""
        if e.messages is not None:
            e.messages += messages
        if messages[0]["role"] in self.splitting:
            context = self.tok(render_messages(e.messages, self.tok, self.data_cfg.chat_template_kwargs, e.tools),
                               add_special_tokens=False)["input_ids"]
            if len(context) + 1 > self.context_limit:
                e.truncated = e.done = True
                return
            e.segments.append([len(e.tokens), context])
            e.turns.append({"role": role, "text": text, "tokens": [], "sample": len(e.segments)})
            return
        ids = self.observations.ids(messages, e.tokens[-1])
        if len(e.context()) + len(ids) + 1 > self.context_limit:
            e.truncated = e.done = True
            return
        e.tokens += ids
        e.observed += [1] * len(ids)
        e.logps += [0.0] * len(ids)
        e.turns.append({"role": role, "text": text, "tokens": ids})

    def _fail(self, e: Episode, failure: EnvFailure) -> None:
        if failure.kind == "unavailable":
            raise EnvironmentUnavailable(f"environment {e.spec.name if e.spec else ''}: {failure.text}")
        e.done = e.failed = True
        self.counts["timeouts" if failure.kind == "timeout" else "errors"] += 1
        if failure.kind not in self._reported:
            self._reported.add(failure.kind)
            log.warning("environment %s: %s (the episode ends there; later ones are only counted in "
                        "environment/%s)", e.spec.name if e.spec else "", failure.text,
                        "timeouts" if failure.kind == "timeout" else "errors")


def _step_result(result: Any) -> tuple[str | None, bool]:
    """step's (observation, done); a bare string or None is read as (it, False) / (None, True)."""
    if isinstance(result, tuple) and len(result) == 2:
        observation, done = result
        return (None if observation is None else str(observation)), bool(done)
    if result is None:
        return None, True
    return str(result), False
