"""Before a run or an evaluation: `resolve(recipe)` imports what the recipe's names stand for (reward functions,
tools, environments, generators) once and checks them against their use, above the pure schema of grpo_cli/recipe
and below the front doors. Commands that need no reward (export, inspect-rollouts, report, audit) never call it,
so they work on any run folder, one trained from Python with functions that no other process has too."""

from grpo_cli.preflight.resolve import Resolved, resolve

__all__ = ["Resolved", "resolve"]
