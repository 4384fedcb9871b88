"""Environments in the shapes of TRL's docs (docs/source/grpo_trainer.md, "Environments" and "Multiple
environments"), written as TRL users write them, for tests/agents/test_trl_environments.py (loaded by path)."""

import time


class IncrementEnv:
    """TRL's example with an external dataset: the row's `target` column arrives in reset(target=...)."""

    def reset(self, target, **kwargs) -> None:
        self.counter = 0
        self.target = target
        self.columns = sorted(kwargs)

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class CodingEnv:
    """Routed by the row's `environment` column; owns its prompt; only `run_code` is its tool."""

    def reset(self, **kwargs) -> str:
        assert "environment" not in kwargs, "the routing column reached reset"
        self.ran = []
        return "Compute the 7th Fibonacci number."

    def run_code(self, code: str) -> str:
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        self.ran.append(code)
        return "13"

    def get_reward(self) -> float:
        return float(bool(self.ran))


class GameEnv:
    """The other route: `move` is its tool, and it owns no reward (its rows get None)."""

    def reset(self, **kwargs) -> str:
        assert "environment" not in kwargs, "the routing column reached reset"
        return "Reach the goal tile."

    def move(self, action: str) -> str:
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        if action not in ("up", "down", "left", "right"):
            raise ValueError(f"unknown action {action!r}")
        if action == "down":
            time.sleep(60)  # hangs: with rollout.environment_timeout_s the instance is killed
        return f"moved {action}"


class Undescribed:
    def reset(self, **kwargs) -> str:
        return "hi"

    def poke(self, x):
        return x


class Unavailable:
    """Its reset finds no room: the run stops (grpo_cli.errors.EnvironmentUnavailable), in a child process too."""

    def reset(self, **kwargs) -> str:
        from grpo_cli.errors import EnvironmentUnavailable

        raise EnvironmentUnavailable("no room for another session")

    def poke(self, x: int) -> int:
        """Poke.

        Args:
            x: How hard.
        """
        return x
