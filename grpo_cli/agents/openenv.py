"""OpenEnv environments (`rollout.environment: openenv:<url>`): an environment running as its own server, spoken to
with OpenEnv's own client (`openenv-core`'s GenericEnvClient, one WebSocket session per episode), trained unchanged.

The adapter follows TRL's environment contract (agents/environments.py): the server's action becomes one tool,
described to the model by the action's JSON schema from the server's /schema (named after the action class,
EchoAction -> `echo`; OpenEnv's own `metadata` field left out); reset() resets the session and its observation is
appended to the row's prompt; each call is one step(action), its observation the tool's answer; a step whose
observation says done ends the episode; get_reward() is the episode's return, the sum of its step rewards (the
reward `environment`). An observation is shown as its one text field when it has one, then JSON of its other
fields; else as JSON of its fields (reward, done, metadata and empty fields left out). The server must hold a
session per episode a step runs (OpenEnv's max_concurrent_envs); one that refuses stops the run, saying so.
Importing this module must not import torch.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

PREFIX = "openenv:"
HIDDEN = ("reward", "done", "metadata")  # an observation's fields the model is not shown


def is_openenv(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def action_tool(url: str, timeout_s: float = 10.0) -> dict:
    """The tool schema of the server's action (ValueError when the server cannot be reached or read)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/schema", timeout=timeout_s) as r:
            action = json.loads(r.read())["action"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the OpenEnv server's action schema at {url}/schema ({type(e).__name__}: "
                         f"{e}); start the environment's server first (e.g. `uvicorn server.app:app --port 8001` in "
                         "its folder)") from None
    title = str(action.get("title") or "Action")
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", re.sub(r"Action$", "", title) or "step").lower() or "step"
    properties = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
    parameters = {"type": "object", "properties": properties,
                  "required": [k for k in action.get("required") or [] if k in properties]}
    description = action.get("description") or f"Take an action in the environment ({title})."
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def render(observation: Any) -> str:
    """An observation as the model reads it: its one text field, else JSON of what it shows."""
    if not isinstance(observation, dict):
        return str(observation)
    shown = {k: v for k, v in observation.items() if k not in HIDDEN and v not in (None, "", [], {})}
    texts = [k for k, v in shown.items() if isinstance(v, str)]
    if len(texts) != 1:
        return json.dumps(shown, ensure_ascii=False, default=str)
    rest = {k: v for k, v in shown.items() if k != texts[0]}
    return shown[texts[0]] + (f"\n{json.dumps(rest, ensure_ascii=False, default=str)}" if rest else "")


class OpenEnvEnvironment:
    """One episode on an OpenEnv server: TRL's contract, with the action as the tool named `tool`."""

    def __init__(self, base_url: str, tool: str = "step", message_timeout_s: float = 60.0) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.tool, self.base_url, self.total, self.done = tool, base_url, 0.0, False
        self.client = GenericEnvClient(base_url=base_url, message_timeout_s=message_timeout_s).sync()

    def reset(self, **columns: Any) -> str | None:
        from grpo_cli.errors import EnvironmentUnavailable

        try:
            result = self.client.reset()
        except Exception as e:  # the server at capacity answers an error, or closes the new session before it
            refused = "CAPACITY_REACHED" in str(e) or "at capacity" in str(e) or type(e).__name__.startswith(
                "ConnectionClosed")
            if refused:
                raise EnvironmentUnavailable(
                    f"the OpenEnv server at {self.base_url} refused a session ({e}); a step runs all its episodes at "
                    "once, one session each: start the server with max_concurrent_envs >= the rows a process samples "
                    "per step (train.prompts_per_step x algorithm.num_generations / processes)") from None
            raise
        self.total, self.done = float(result.reward or 0.0), bool(result.done)
        return render(result.observation) or None

    def __getattr__(self, name: str) -> Any:
        if name == self.__dict__.get("tool"):  # the action, as the tool the model calls
            return self._act
        raise AttributeError(name)

    def _act(self, **action: Any) -> str:
        result = self.client.step(action)
        self.total += float(result.reward or 0.0)
        self.done = bool(result.done)
        return render(result.observation)

    def get_reward(self) -> float:
        return self.total

    def is_done(self) -> bool:
        return self.done

    def close(self) -> None:
        self.client.close()
