"""The Hugging Face hub, asked once whether it can be reached, before anything loads from it.

Unreachable, every library would find out on its own: huggingface_hub retries each file five times (about 25 s,
a warning per retry), once for the tokenizer and again for the model, and only then fails or falls back to the
cache. So `grpo train` and `grpo validate` open one TCP connection to the hub (HF_ENDPOINT) when the recipe names
something on it; when that fails they say so in one line and set HF_HUB_OFFLINE / HF_DATASETS_OFFLINE for the run:
cached models and datasets load at once, the others fail at once with the loaders' own messages. Nothing is
probed when the user has chosen offline mode already, or when a proxy is configured (the libraries reach the hub
through it; a direct connection says nothing).

Importing this module imports neither torch nor huggingface_hub: it must run before they read their settings.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_TRUE = ("1", "ON", "YES", "TRUE")


def is_hub_id(name: str | None) -> bool:
    """Whether `name` can only be found on the hub (or in its cache): not a local path, `pkg:`, `builtin:`, a
    folder that exists, or a `file.py:function` / `module:function` reward."""
    if not name or name.startswith(("/", "./", "../", "~", "pkg:", "builtin:")) or ":" in name:
        return False
    return not Path(name).expanduser().exists()


def hub_names(recipe) -> list[str]:
    """What the recipe loads from the hub: the model, the training / eval datasets and reward models."""
    names = [recipe.model.name_or_path, recipe.data.dataset]
    if recipe.eval is not None:
        names.append(recipe.eval.dataset)
    names += [r.name.removeprefix("model:") for r in recipe.rewards if r.name.startswith("model:")]
    return list(dict.fromkeys(n for n in names if is_hub_id(n)))


def offline_chosen() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE for v in OFFLINE_VARS)


def unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the hub cannot be reached ('huggingface.co:443: Name or service not known'), or None when a connection
    opens (or a proxy is configured, so a direct connection would say nothing)."""
    if any(os.environ.get(v) for v in PROXY_VARS):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return _connect(url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443), timeout_s)


@functools.lru_cache(maxsize=None)
def _connect(host: str, port: int, timeout_s: float) -> str | None:
    """Asked once a process per address: the recipe validator and the commands may each want to know."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or (str(e) or type(e).__name__)
        return f"{host}:{port}: {reason}"
    return None


def work_offline_if_unreachable(names: list[str], say: Callable[[str], None]) -> bool:
    """Set the offline variables (and the constants of hub libraries imported already) when `names` (hub ids to
    load) are not empty and the hub cannot be reached; say so once. -> whether the run works offline."""
    if offline_chosen():
        return True
    why = unreachable() if names else None
    if why is None:
        return False
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[var] = "1"  # read at import by huggingface_hub and datasets; inherited by launched workers
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    say(f"the Hugging Face hub cannot be reached ({why}): {', '.join(names)} load from the local cache only "
        "(HF_HUB_OFFLINE=1 for this run)")
    return True
