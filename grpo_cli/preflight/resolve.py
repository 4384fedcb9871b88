"""`resolve(recipe) -> Resolved`: every name a recipe gives to code, imported and checked against its use.

The schema (grpo_cli/recipe) checks a name's grammar only and imports nothing it names; here each reward resolves
and its kwargs fit its function (a reward model's config says one label), each tool can be described to the model,
the environment class has the methods the episode calls and takes its kwargs, the data generator is one of ours, the
cache implementation is one of transformers'. Errors name the field and exit 2, as the schema's do. Called by train,
validate, doctor, eval and convert-trl, from the command line and from Python (a replay trains on recorded rewards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_cli.errors import RecipeError
from grpo_cli.recipe.names import is_remote, is_reward_model
from grpo_cli.recipe.schema import Recipe


@dataclass(frozen=True)
class Resolved:
    """A recipe and what its names stand for, in the recipe's order."""

    recipe: Recipe
    rewards: tuple[Any, ...]  # each rewards[i]'s function; None for a reward model (the trainer loads its weights)
    tools: tuple[Any, ...]  # each rollout.tools[i]'s function
    environments: dict  # rollout.environment's classes: {route: agents.environments.EnvSpec}, {None: spec} for one
    unresolved: dict[int, str] = field(default_factory=dict)  # with elsewhere=True: rewards[i] -> why not here


def resolve(recipe: Recipe, *, elsewhere: bool = False) -> Resolved:
    """RecipeError ("invalid recipe:" and the field) unless every name resolves and fits its use. `elsewhere`: the
    recipe is for another machine (`grpo convert-trl`): a reward function of the user's own (`module:fn`,
    `file.py:fn`) that does not resolve here is listed in `unresolved`, its slot None, instead of an error."""
    try:
        rewards, unresolved = _rewards(recipe, elsewhere)
        tools, environments = _tools(recipe), _environment(recipe)
        if recipe.rollout.agent is not None:
            from grpo_cli.agents.programs import check_program

            check_program(recipe.rollout.agent, recipe.rollout.agent_kwargs)
        _distinct_tools(tools, environments)
        _generator(recipe)
        _cache_implementation(recipe)
    except ValueError as e:
        raise RecipeError(f"invalid recipe:\n  {e}") from None
    return Resolved(recipe, rewards, tools, environments, unresolved)


def _rewards(recipe: Recipe, elsewhere: bool) -> tuple[tuple[Any, ...], dict[int, str]]:
    from grpo_cli.rewards import check_reward, resolve_reward

    out, unresolved = [], {}
    for i, r in enumerate(recipe.rewards):
        own = ":" in r.name and not is_reward_model(r.name) and not is_remote(r.name)
        if elsewhere and own:
            try:
                resolve_reward(r.name)
            except ValueError as e:
                unresolved[i] = f"rewards.{i}.name: {e}"
                out.append(None)
                continue
        try:
            check_reward(r.name, r.kwargs, r.timeout_s, r.level)
        except ValueError as e:
            raise ValueError(f"rewards.{i}.{e}") from None
        out.append(None if is_reward_model(r.name) else resolve_reward(r.name, r.timeout_s))
    return tuple(out), unresolved


def _tools(recipe: Recipe) -> tuple[Any, ...]:
    from grpo_cli.agents.tools import check_tools, resolve_tool

    check_tools(recipe.rollout.tools)
    return tuple(resolve_tool(name) for name in recipe.rollout.tools)


def _environment(recipe: Recipe) -> dict:
    """{route: EnvSpec} of rollout.environment ({} without one)."""
    if recipe.rollout.environment is None:
        return {}
    from grpo_cli.agents.environments import check_environment

    return check_environment(recipe.rollout, needs_reward=any(r.name == "environment" for r in recipe.rewards))


def _distinct_tools(tools: tuple, environments: dict) -> None:
    names = {fn.__name__: i for i, fn in enumerate(tools)}
    for route, spec in environments.items():
        for method in spec.tools:
            if method in names:
                field = "rollout.environment" + ("" if route is None else f".{route}")
                raise ValueError(f"{field}: its method {method} is a tool, and rollout.tools.{names[method]} has that "
                                 "name too; tool names must differ")


def _generator(recipe: Recipe) -> None:
    if recipe.data.generator:
        from grpo_cli.data.generators import GENERATORS

        if recipe.data.generator not in GENERATORS:
            raise ValueError(f"data.generator {recipe.data.generator!r} is unknown; valid: "
                             f"{', '.join(GENERATORS.names())}")


def _cache_implementation(recipe: Recipe) -> None:
    ro = recipe.rollout
    if ro.cache_implementation is not None:
        from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

        if ro.cache_implementation not in ALL_CACHE_IMPLEMENTATIONS:
            raise ValueError(f"rollout.cache_implementation: {ro.cache_implementation!r} is not one of transformers' "
                             f"caches ({', '.join(ALL_CACHE_IMPLEMENTATIONS)})")
