import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_cache(tmp_path_factory, monkeypatch):
    """One builtin-model cache per session (not ~/.cache), and the repo root as working directory."""
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "grpo-cache"))
    monkeypatch.chdir(ROOT)
