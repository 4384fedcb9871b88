"""TRL's environment example (docs/source/grpo_trainer.md, "Environments"), as TRL writes it: the environment owns
its data (reset() returns the prompt), its public method `increment` is a tool, get_reward() scores the episode.
Trained by recipes/trl-increment.yaml, which has no data and no rewards section."""

import random


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
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
