"""Objects a recipe names: `module:attr` (an importable module) or `path/to/file.py:attr` (a file; in a recipe
relative to its folder, load_recipe makes it absolute). Rewards, environments and tools are named so. A third
form, `python:NAME`, names a function handed over in this process (`grpo_cli.train(rewards=[fn])` registers it by
its `__name__`): the recipe saved with the run records the name, and another process (the CLI resuming the run)
is told which function it lacks and how to give it.

A file is loaded once per process (keyed by its absolute path) under a module name of its own, registered in
sys.modules so pickle and dataclasses inside it find their module. Errors are ValueErrors for people, naming
the entry as `{kind} {name!r}`. Importing this module must not import torch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo_cli.recipe.names import is_file

FORMS = ("`module:{what}` (an importable module) or `path/to/file.py:{what}` (in a recipe file: relative "
         "to its folder; in a command-line override: to the current directory)")
_FILE_MODULES: dict[str, ModuleType] = {}  # absolute path -> module
IN_PROCESS = "python:"
_IN_PROCESS: dict[str, Any] = {}  # __name__ -> the function registered last under it (a notebook cell run again)


def forms(what: str = "function") -> str:
    return FORMS.format(what=what)


def split(name: str, kind: str = "reward", what: str = "function") -> tuple[str, str]:
    target, _, attr = name.rpartition(":")
    if not target or not attr:
        raise ValueError(f"{kind} {name!r}: expected {forms(what)}, with both parts non-empty")
    return target, attr


def portable(name: str) -> str:
    """`rel/file.py:attr` with the file's path made absolute; other names unchanged."""
    target, attr = split(name)
    return f"{os.path.abspath(os.path.expanduser(target))}:{attr}" if is_file(target) else name


def load_file(target: str, name: str, kind: str = "reward") -> ModuleType:
    path = os.path.abspath(os.path.expanduser(target))
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
    if not os.path.isfile(path):
        raise ValueError(
            f"{kind} {name!r}: file not found: {target} (looked at {path}; "
            "a recipe's relative paths start at its folder, an override's at the current directory)"
        )
    stem = "".join(ch if ch.isalnum() else "_" for ch in Path(path).stem)
    mod_name = f"grpo_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{kind} {name!r}: cannot load {path} as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any error in user code becomes a message for people
        del sys.modules[mod_name]
        raise ValueError(f"{kind} {name!r}: loading {target} raised {type(e).__name__}: {e}") from None
    _FILE_MODULES[path] = module
    return module


def import_module(target: str, name: str, kind: str = "reward", what: str = "function") -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - any error in user code becomes a message for people
        raise ValueError(
            f"{kind} {name!r}: cannot import module {target!r} ({type(e).__name__}: {e}); install it or put it on "
            f"PYTHONPATH, or name a file as path/to/file.py:{what}"
        ) from None


def attribute(module: ModuleType, attr: str, where: str, name: str, kind: str = "reward",
              what: str = "function") -> Any:
    """`module.attr` (dotted), callable; ValueError listing what the module defines otherwise."""
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
            listing = ", ".join(defined[:20]) or "no public functions or classes"
            raise ValueError(f"{kind} {name!r}: {where} has no {what} {attr!r}; it defines: {listing}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{kind} {name!r}: {where}:{attr} is a {type(obj).__name__}, not a {what}")
    return obj


def register_in_process(obj: Any, kind: str = "reward") -> str:
    """`python:NAME` for a callable handed over in this process, registered under its `__name__` (a function
    defined again under the same name replaces the earlier one). ValueError when it has no usable name."""
    name = getattr(obj, "__name__", None)
    if not callable(obj):
        raise ValueError(f"a {kind} must be a function, got {type(obj).__name__}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a {kind} is logged under its function's name, and {obj!r} has none that can be "
                         "(a lambda or a functools.partial): define it with `def name(...)`")
    _IN_PROCESS[name] = obj
    return f"{IN_PROCESS}{name}"


def is_in_process(name: str) -> bool:
    return name.startswith(IN_PROCESS)


def in_process(name: str, kind: str = "reward") -> Any:
    """The callable `python:NAME` stands for; ValueError saying how to give it when this process has none."""
    short = name.removeprefix(IN_PROCESS)
    fn = _IN_PROCESS.get(short)
    if fn is None:
        raise ValueError(
            f"{kind} {name!r} is a Python function handed over by the process that started this run, and this "
            f"process has none named {short!r}: from Python, hand it again (grpo_cli.train(..., rewards=[{short}]) "
            f"or grpo_cli.evaluate(..., rewards=[{short}])); from the command line, put it in a file and name it "
            f"path/to/file.py:{short} (grpo eval --recipe with that reward; a resume: an override of this "
            f"{kind}'s name with --allow-recipe-change). What scores nothing (export, inspect-rollouts, report, "
            "audit) needs no reward"
        )
    return fn


def resolve_object(name: str, kind: str = "reward", what: str = "function") -> Any:
    """The object `module:attr`, `path/file.py:attr` or `python:NAME` names."""
    if is_in_process(name):
        return in_process(name, kind)
    target, attr = split(name, kind, what)
    module = load_file(target, name, kind) if is_file(target) else import_module(target, name, kind, what)
    return attribute(module, attr, target, name, kind, what)
