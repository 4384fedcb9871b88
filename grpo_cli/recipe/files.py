"""Reading a recipe file: YAML (safe loader) + dotted command-line overrides -> a plain dict with interpolations
resolved and local paths made absolute (the recipe file's folder for what it says, the working directory for
overrides), validated into a `Recipe` (grpo_cli/recipe/schema.py) with errors for people; and back to YAML or
to flat dotted keys (a resume's drift check, trackers' hyper-parameters).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_cli.errors import RecipeError
from grpo_cli.recipe.names import PREFIX, is_file, is_remote, is_reward_model
from grpo_cli.recipe.schema import Recipe


def _override_value(value: str) -> Any:
    """An override's value: a YAML scalar or flow collection (0.3, null, [a, b], {k: v}), else the text itself.

    `data.template={prompt} Answer with a number.` is not YAML, `{question}` would be a one-key mapping
    and `Be brief: one line` a block mapping: all three are taken as plain text."""
    import yaml

    if not value:
        return ""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(parsed, dict) and (not value.lstrip().startswith("{") or (
            ":" not in value and all(v is None for v in parsed.values()))):
        return value
    return parsed


def load_raw(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """YAML (safe loader) + dotlist overrides -> plain dict, interpolations resolved, local paths made absolute.

    Relative paths written in the file start at the file's folder; those given as overrides at the
    working directory (see `resolve_paths`)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML: {e}") from None
    return apply_overrides(data, overrides, path.resolve().parent, str(path))


def apply_overrides(data: Any, overrides: list[str] | tuple[str, ...], recipe_dir: Path, where: str) -> dict[str, Any]:
    """A recipe mapping (read from `where`, a file or `a recipe dict`) + dotlist overrides -> plain dict with
    interpolations resolved and local paths made absolute (written ones from `recipe_dir`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(data, dict):
        raise RecipeError(f"{where}: a recipe is a YAML mapping of sections, got {type(data).__name__}")
    try:
        cfg = OmegaConf.create(data)
    except OmegaConfBaseException as e:
        raise RecipeError(f"{where}: {str(e).splitlines()[0]}") from None
    overridden = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep or not key:
            raise RecipeError(f"override {o!r} is not of the form dotted.key=value")
        key = key.strip()
        try:
            OmegaConf.update(cfg, key, _override_value(value), merge=True)
        except (OmegaConfBaseException, TypeError, ValueError, KeyError, IndexError) as e:
            raise RecipeError(f"override {o!r} cannot be applied: {str(e).splitlines()[0]}") from None
        overridden.append(re.sub(r"\[(\d+)\]", r".\1", key))  # rewards[0].name == rewards.0.name
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise RecipeError(f"{where}: {str(e).splitlines()[0]}") from None
    return resolve_paths(raw, recipe_dir, overridden)  # type: ignore[arg-type]


def _absolute(value: str, base: Path) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))


def _local_path(value: Any, base: Path) -> bool:
    """A name that means a local path: ./ ../ / ~, or found under `base` (hub ids like org/name stay)."""
    if not isinstance(value, str) or not value or "://" in value:
        return False
    if value.startswith(("./", "../", "/", "~")) or value in (".", ".."):
        return True
    return ":" not in value and os.path.exists(os.path.join(base, value))


def _reward_path(name: Any, base: Path) -> Any:
    """`dir/file.py:fn` and `model:PATH` rewards with their path made absolute; other names unchanged."""
    if not isinstance(name, str) or ":" not in name or is_remote(name):
        return name
    if is_reward_model(name):
        target = name.removeprefix(PREFIX)
        return f"{PREFIX}{_absolute(target, base)}" if _local_path(target, base) else name
    target, _, fn = name.rpartition(":")
    return f"{_absolute(target, base)}:{fn}" if is_file(target) else name


def _environment_path(name: Any, base: Path) -> Any:
    """An environment class's file made absolute; a server's URL (openenv:http://...) unchanged."""
    return name if isinstance(name, str) and "://" in name else _reward_path(name, base)


def resolve_paths(raw: dict[str, Any], recipe_dir: Path, overridden: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Local paths of a raw recipe made absolute, so the recipe works from any directory and the resolved
    recipe saved with a run names the same files wherever it is read.

    A value set by an override (its dotted key, or a parent's, is in `overridden`) starts at the working
    directory, any other at `recipe_dir`. Paths: data.files, eval.files (always paths), reward files
    (`dir/file.py:fn`) and `model:PATH` rewards, model.name_or_path, data.dataset and eval.dataset when they
    name a local path (./, ../, /, ~, or existing there). logging.output_dir stays relative to the working
    directory, as in TRL and verl."""

    def base(key: str) -> Path:
        from_cli = any(key == o or key.startswith(o + ".") for o in overridden)
        return Path.cwd() if from_cli else recipe_dir

    def section(name: str) -> dict[str, Any]:
        value = raw.get(name)
        return value if isinstance(value, dict) else {}

    for sec in ("data", "eval"):
        d = section(sec)
        files = d.get("files")
        if isinstance(files, str):
            files = [files]
        if isinstance(files, list):
            d["files"] = [_absolute(f, base(f"{sec}.files.{i}")) if isinstance(f, str) else f for i, f in enumerate(files)]
        if _local_path(d.get("dataset"), base(f"{sec}.dataset")):
            d["dataset"] = _absolute(d["dataset"], base(f"{sec}.dataset"))
    m = section("model")
    if _local_path(m.get("name_or_path"), base("model.name_or_path")):
        m["name_or_path"] = _absolute(m["name_or_path"], base("model.name_or_path"))
    ro = section("rollout")
    if isinstance(ro.get("environment"), str):  # path/to/env.py:Class, like a reward file
        ro["environment"] = _environment_path(ro["environment"], base("rollout.environment"))
    elif isinstance(ro.get("environment"), dict):  # {route: path/to/env.py:Class}
        ro["environment"] = {k: _environment_path(v, base(f"rollout.environment.{k}"))
                             for k, v in ro["environment"].items()}
    agent = ro.get("agent")
    if isinstance(agent, str) and agent.startswith("verifiers:") and agent.endswith(".py"):  # a taskset's file
        ro["agent"] = "verifiers:" + _absolute(agent.removeprefix("verifiers:"), base("rollout.agent"))
    elif isinstance(agent, str):
        ro["agent"] = _reward_path(agent, base("rollout.agent"))
    if isinstance(ro.get("tools"), list):
        ro["tools"] = [_reward_path(t, base(f"rollout.tools.{i}")) for i, t in enumerate(ro["tools"])]
    rewards = raw.get("rewards")
    for i, r in enumerate(rewards if isinstance(rewards, list) else []):
        if isinstance(r, dict) and "name" in r:
            r["name"] = _reward_path(r["name"], base(f"rewards.{i}.name"))
        update = r.get("update") if isinstance(r, dict) else None
        if isinstance(update, dict) and "label" in update:  # names a reward: resolved as its name was
            update["label"] = _reward_path(update["label"], base(f"rewards.{i}.update.label"))
    return raw


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown field (value {e['input']!r}); check the spelling")
        elif e["type"] == "missing":
            lines.append(f"{loc}: required field is missing")
        elif loc and msg.startswith(f"{loc}."):  # a section's validator that names the field itself
            lines.append(msg)
        elif loc:
            lines.append(f"{loc}: {msg} (got {e['input']!r})" if not isinstance(e["input"], dict) else f"{loc}: {msg}")
        else:
            lines.append(msg)
    return "invalid recipe:\n  " + "\n  ".join(lines)


def raw_recipe(source: str | Path | dict[str, Any] | Recipe, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """`load_recipe`'s plain dict before validation: a YAML file, a dict of sections (relative paths start at the
    working directory) or a `Recipe`, with the overrides applied."""
    if isinstance(source, Recipe):
        return apply_overrides(source.model_dump(mode="json"), overrides, Path.cwd(), "a Recipe")
    if isinstance(source, dict):  # OmegaConf reads a copy: the caller's dict stays as it was
        return apply_overrides(source, overrides, Path.cwd(), "a recipe dict")
    if isinstance(source, (str, Path)):
        return load_raw(source, overrides)
    raise RecipeError(f"a recipe is a YAML file's path, a dict of sections or a Recipe, not {type(source).__name__}")


def validated(raw: dict[str, Any]) -> Recipe:
    """A raw recipe dict validated into a `Recipe`; RecipeError naming every bad field."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(format_validation_error(e)) from None


def load_recipe(source: str | Path | dict[str, Any] | Recipe, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe: a YAML file, a dict of sections (relative paths start at the working
    directory) or a `Recipe` (overrides give a new one). Raises RecipeError with a message for people."""
    return validated(raw_recipe(source, overrides))


def recipe_to_yaml(recipe: Recipe) -> str:
    """The fully resolved recipe (every default spelled out), as saved with runs and checkpoints."""
    import yaml

    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested recipe dict -> {"algorithm.beta": 0.0, "rewards.0.name": ..., ...}; lists of scalars stay whole."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out.update(flatten({str(i): x for i, x in enumerate(v)}, key + "."))
        else:
            out[key] = v
    return out


def flat_config(d: dict[str, Any]) -> dict[str, Any]:
    """`flatten` with scalar values only (what trackers' hparams accept): None and lists become text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flatten(d).items()}
