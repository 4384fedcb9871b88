"""Shared fixtures. The tests mirror the package (tests/<folder>/test_<module>.py); the modules beside this file
(helpers.py, servers.py, the reward, environment and tool files recipes name) are importable from every test.

Markers: `slow` (a test of 3 s or more on the 2-core CI machine), `vllm` (a real vLLM), `multiprocess` (several
trainer processes). `make test-fast` runs the tests with none of them; `make test` runs everything."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # helpers.py, servers.py (import mode: importlib)


@pytest.fixture
def model_cache(tmp_path_factory, monkeypatch):
    """One builtin-model cache per session (not ~/.cache), and the repo root as working directory."""
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "grpo-cache"))
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="session")
def turn_model(tmp_path_factory) -> str:
    """The builtin tiny Qwen2 taught (150 Adam steps, under a second) to end its turn: after a chat prompt it
    samples 0-4 arbitrary tokens, then <|im_end|>. Multi-turn episodes need turns that end."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.models.builtin import build_tiny

    folder = tmp_path_factory.mktemp("turn-model")
    build_tiny("tiny-qwen2", folder / "base")
    tok = AutoTokenizer.from_pretrained(folder / "base")
    model = AutoModelForCausalLM.from_pretrained(folder / "base")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                     add_generation_prompt=True)
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        seqs = [head + torch.randint(20, 200, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
                + [eos] for _ in range(8)]
        L = max(map(len, seqs))
        ids = torch.full((8, L), tok.pad_token_id)
        labels = torch.full((8, L), -100)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, len(head) : len(s)] = torch.tensor(s[len(head) :])
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    return str(folder / "model")


HEAVY = ("slow", "vllm", "multiprocess")  # the markers of tests that take seconds to minutes


def pytest_collection_modifyitems(config, items):
    """The files with the most heavy tests first, each file's tests in their order. `make test` runs with --dist
    loadfile, where a worker takes a whole file: a long file handed out last is the run's tail while the other worker
    idles, so the longest go first and the quick ones fill in at the end."""
    heavy: dict[str, int] = {}
    for item in items:
        heavy.setdefault(item.nodeid.split("::")[0], 0)
        if any(item.get_closest_marker(m) for m in HEAVY):
            heavy[item.nodeid.split("::")[0]] += 1
    items.sort(key=lambda item: -heavy[item.nodeid.split("::")[0]])  # stable: the order within a file stays
