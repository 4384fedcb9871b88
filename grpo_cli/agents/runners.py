"""`episode_runner`: what runs a recipe's multi-turn rollouts, if anything: an EpisodeRunner (rollout.environment,
rollout.tools; agents/episodes.py) or an AgentRunner (rollout.agent; agents/programs.py). Both take a batch of rows
and give back the Rollout and the reward columns it adds."""

from __future__ import annotations

from grpo_cli.agents.episodes import EpisodeRunner
from grpo_cli.agents.programs import AgentRunner


def episode_runner(recipe, tokenizer, generator, model) -> EpisodeRunner | AgentRunner | None:
    """The runner of a recipe with rollout.environment, rollout.tools or rollout.agent (None without): its context
    limit is rollout.max_episode_length, else the model's max_position_embeddings."""
    ro = recipe.rollout
    if ro.environment is None and not ro.tools and ro.agent is None:
        return None
    limit = ro.max_episode_length or getattr(getattr(model, "config", None), "max_position_embeddings", None) or 2**31
    if ro.agent is not None:
        return AgentRunner(ro, recipe.data, tokenizer, generator, limit, model_name=recipe.model.name_or_path)
    return EpisodeRunner(ro, recipe.data, tokenizer, generator, limit)
