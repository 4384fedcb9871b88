"""verifiers environments (`rollout.agent: verifiers:<taskset>`), trained unchanged: an adapter that runs a
verifiers (v1) taskset's episodes, its own Env and harness included, against the agent endpoint
(agents/endpoint.py), so every turn its harness asks the policy for is recorded and trained.

`<taskset>` is what verifiers loads (`verifiers.v1.utils.loaders`): an installed taskset's id (a package exporting
its Taskset, and optionally an Env, via `__all__`, as `prime env install` and `pip install` leave them), or a file
`path/to/taskset.py` (its folder joins the import path). The recipe's rows are the taskset's tasks (data.generator:
verifiers, the default with no data section; data/tasksets.py): row i is task i, its prompt shown in the records. Each episode runs in
a program process (agents/programs.py): the taskset's Env (SingleAgentEnv unless the taskset ships one) with every
agent seat on the policy behind the endpoint, its harness in a local subprocess runtime (the null chat harness
unless the seat pins another; verifiers prepares it with `uv`, from the package index), and the task's rewards and
rubric as verifiers computes them; their weighted sum is the reward `environment`. An episode verifiers records as
failed (a harness or an Env error) is counted in agent/errors, its reward missing. Importing this module must not
import torch or verifiers.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from grpo_cli.data.tasksets import load_taskset, taskset_id

PREFIX = "verifiers:"
KEY_VAR = "GRPO_AGENT_API_KEY"  # the endpoint's token, where verifiers' client config reads a key from


def is_verifiers(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def check(name: str, kwargs: dict[str, Any]) -> None:
    """ValueError unless the taskset loads (verifiers installed, the id importable, its config valid)."""
    load_taskset(name.removeprefix(PREFIX), kwargs.get("taskset_config"))


def episode(base_url: str, api_key: str, row: dict, taskset: str, env: str = "", harness: str = "null",
            taskset_config: dict | None = None) -> float:
    """The agent program: task row["task"] of the taskset, one verifiers episode against `base_url` -> its reward."""
    return asyncio.run(_episode(base_url, api_key, int(row["task"]), taskset, env, harness, taskset_config or {}))


async def _episode(base_url: str, api_key: str, index: int, taskset: str, env: str, harness: str,
                   taskset_config: dict[str, Any]) -> float:
    import verifiers.v1 as vf
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.configs.env import EnvConfig
    from verifiers.v1.env import Env
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class, harness_config_type

    ident = taskset_id(taskset)
    os.environ[KEY_VAR] = api_key
    cls = environment_class(ident, env)
    config_cls = concrete_type(cls, EnvConfig, origin=Env) or EnvConfig
    config = config_cls.model_validate({"id": env, "taskset": {"id": ident, **taskset_config}})
    seats = {}
    for name, seat in agent_config_fields(config).items():  # every seat: local, on the policy
        pinned = seat.harness if seat.harness is not None else harness_config_type(harness).model_validate(
            {"id": harness})
        seats[name] = seat.model_copy(update={"runtime": vf.SubprocessConfig(), "harness": pinned})
    environment = cls(config.model_copy(update=seats))
    task = next((t for i, t in enumerate(environment.taskset) if i == index), None)
    if task is None:
        raise IndexError(f"the taskset has no task {index}")
    ctx = ModelContext(model="policy", client=vf.EvalClientConfig(base_url=base_url, api_key_var=KEY_VAR))
    async with environment.serving():
        result = await environment.run_episode(task, ctx)
    errors = [*result.errors, *(e for t in result.traces for e in t.errors)]
    if errors or not result.traces:
        raise RuntimeError(f"verifiers recorded the episode as failed: {errors[0].type}: {errors[0].message[:300]}"
                           if errors else "verifiers recorded no trace")
    return float(sum(t.reward for t in result.traces))
