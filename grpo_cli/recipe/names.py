"""The grammar of the names a recipe gives code: an object in a file is `path/file.py:attr` (a module's is
`module:attr`), a reward model is `model:PATH_OR_HUB_ID`, a remote reward its URL, and every reward is logged under a name made from its own
(`accuracy`, `path/file.py:fn` -> `fn`, `model:x/my-rm` -> `rm_my-rm`, repeats `_2`, `_3`, ...). Pure string rules:
the schema's checks, the importer of user code (grpo_cli/usercode/objects.py) and the scoring all read them, and
nothing here imports what a name stands for."""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = "model:"


def is_file(target: str) -> bool:
    """The part before `:` names a file (`path/file.py`), not an importable module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def is_remote(name: str) -> bool:
    """A reward function behind a URL (rewards/remote.py)."""
    return name.startswith(("http://", "https://"))


def remote_log_name(url: str) -> str:
    """`http://host:9000/score` -> `score`; a URL without a path -> `remote`."""
    path = url.split("://", 1)[1].partition("/")[2].split("?")[0].rstrip("/")
    return path.rpartition("/")[2] or "remote"


def is_reward_model(name: str) -> bool:
    return name.startswith(PREFIX)


def model_source(name: str) -> str:
    """The folder or hub id after `model:`, with `~` expanded."""
    source = name[len(PREFIX) :].strip()
    return os.path.expanduser(source) if source.startswith("~") else source


def log_name(name: str) -> str:
    """`model:/x/my-rm` -> `rm_my-rm`; `model:org/Some-RM` -> `rm_Some-RM`."""
    return "rm_" + (Path(model_source(name).rstrip("/")).name or "model")


def reward_log_name(name: str) -> str:
    """Name a reward is logged under: built-ins as is, `x:fn` as `fn`, `model:x/my-rm` as `rm_my-rm`."""
    if is_reward_model(name):
        return log_name(name)
    if is_remote(name):
        return remote_log_name(name)
    return name.rpartition(":")[2].rpartition(".")[2] if ":" in name else name


def unique_log_names(names: list[str]) -> list[str]:
    """Log names of the rewards in order; repeats get `_2`, `_3`, ..."""
    used: set[str] = set()
    out = []
    for name in names:
        base = candidate = reward_log_name(name)
        k = 1
        while candidate in used:
            k += 1
            candidate = f"{base}_{k}"
        used.add(candidate)
        out.append(candidate)
    return out
