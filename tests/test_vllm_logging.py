"""vLLM's own log lines: each distinct one once and warnings only by default, every one with --verbose.

The end-to-end counts (a real colocate training run) are in test_vllm_train.py."""

import io
import json
import logging
import logging.config
import os
from pathlib import Path

import pytest

from grpo_cli.models.loading import VERBOSE_ENV, OncePerMessage, quiet_vllm

VLLM_ENV = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING", VERBOSE_ENV)


def test_each_distinct_message_once_then_a_single_note():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(OncePerMessage())
    parent = logging.getLogger("grpo_test_vllm")
    parent.handlers, parent.propagate = [handler], False
    parent.setLevel(logging.INFO)
    child = logging.getLogger("grpo_test_vllm.layerwise")  # vLLM logs from its modules' loggers
    for _ in range(4):  # four weight syncs, the same two lines each
        child.warning("%s: Failed to load weights", "RotaryEmbedding")
        child.info("Reloading and processing weights took %.2f seconds", 0.01)
    child.warning("%s: Failed to load weights", "Linear")  # a new failure is never hidden behind an old one
    child.error("%s: Failed to load weights", "RotaryEmbedding")  # same text at another level: shown
    assert stream.getvalue().splitlines() == [
        "WARNING RotaryEmbedding: Failed to load weights",
        "INFO Reloading and processing weights took 0.01 seconds",
        f"WARNING {OncePerMessage.NOTE}",  # at the first repeat, once
        "WARNING Linear: Failed to load weights",
        "ERROR RotaryEmbedding: Failed to load weights",
    ]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    for key in VLLM_ENV:  # set, then deleted: what quiet_vllm sets is undone after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_quiet_vllm_hands_vllm_a_config_with_the_filter(clean_env):
    pytest.importorskip("vllm")
    quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    path = Path(os.environ["VLLM_LOGGING_CONFIG_PATH"])
    assert path.parent == clean_env
    config = json.loads(path.read_text())
    assert config["handlers"]["vllm"]["filters"] == ["grpo_once"]
    assert config["handlers"]["vllm"]["level"] == config["loggers"]["vllm"]["level"] == "WARNING"
    # applied the way vLLM applies it (dictConfig), on a logger of our own: the handler gets a OncePerMessage
    config["loggers"] = {"grpo_test_vllm_config": config["loggers"]["vllm"]}
    config["handlers"]["vllm"]["stream"] = "ext://sys.stderr"
    logging.config.dictConfig(config)
    handler, = logging.getLogger("grpo_test_vllm_config").handlers
    assert [type(f) for f in handler.filters] == [OncePerMessage]


def test_verbose_and_the_users_own_settings_win(clean_env, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    quiet_vllm()
    assert json.loads(Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read_text())["handlers"]["vllm"]["level"] == "ERROR"
    for key in VLLM_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(VERBOSE_ENV, "1")  # grpo train --verbose
    quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO" and "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    monkeypatch.delenv(VERBOSE_ENV)
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", "/my/logging.json")
    quiet_vllm()
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == "/my/logging.json"
