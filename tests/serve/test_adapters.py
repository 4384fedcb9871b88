"""What `grpo serve-vllm --lora-rank R` accepts as a LoRA adapter (grpo_cli/serve/adapters.py), without vLLM: the
trainer's own adapter file passes, every malformed one is a 422 naming the tensor or the setting."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_cli.errors import RequestError


@pytest.fixture(scope="module")
def peft_model(tmp_path_factory):
    import peft
    from transformers import AutoModelForCausalLM

    from grpo_cli.models.builtin import build_tiny

    folder = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("tiny-qwen2", folder)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    shapes = {k: tuple(v.shape) for k, v in base.state_dict().items()}
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(base, config), shapes


def _write(path, state, config) -> None:
    from safetensors.torch import save_file

    from grpo_cli.serve.adapters import CONFIG_KEY

    save_file(state, str(path), metadata=None if config is None else {CONFIG_KEY: json.dumps(config)})


def test_the_trainers_adapter_file_passes_and_becomes_a_peft_folder(peft_model, tmp_path):
    from safetensors.torch import load_file

    from grpo_cli.rollout.vllm_server import _adapter_state
    from grpo_cli.serve.adapters import check_adapter_file, write_peft_folder

    model, shapes = peft_model
    state, metadata = _adapter_state(model)
    layers = model.config.num_hidden_layers
    assert len(state) == 3 * 2 * layers  # q, v, down: lora_A and lora_B each
    _write(tmp_path / "a.safetensors", state, json.loads(metadata["adapter_config"]))
    config, count = check_adapter_file(tmp_path / "a.safetensors", shapes, max_rank=8)
    assert count == len(state) and config["r"] == 4 and sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    write_peft_folder(tmp_path / "a.safetensors", config, tmp_path / "folder")
    # what peft itself reads back: the same tensors under the same config
    import peft

    loaded = peft.PeftConfig.from_pretrained(str(tmp_path / "folder"))
    assert loaded.r == 4 and loaded.lora_alpha == 8
    again = load_file(str(tmp_path / "folder/adapter_model.safetensors"))
    assert all(torch.equal(again[k], v) for k, v in state.items())


def test_bad_adapters_are_refused_naming_the_tensor(peft_model, tmp_path):
    from grpo_cli.rollout.vllm_server import _adapter_state
    from grpo_cli.serve.adapters import check_adapter_file

    model, shapes = peft_model
    state, metadata = _adapter_state(model)
    config = json.loads(metadata["adapter_config"])
    qa = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    qb = qa.replace("lora_A", "lora_B")
    assert qa in state and qb in state
    cases = [  # (what, tensors, config, max rank, words the 422 must contain)
        ("no config", state, None, 8, ["adapter_config"]),
        ("rank over the server's", state, config, 1, ["rank 4", "--lora-rank 1"]),
        ("started without --lora-rank", state, config, 0, ["without --lora-rank"]),
        ("DoRA", state, {**config, "use_dora": True}, 8, ["DoRA"]),
        ("modules_to_save", state, {**config, "modules_to_save": ["lm_head"]}, 8, ["modules_to_save", "lm_head"]),
        ("a bias", state, {**config, "bias": "all"}, 8, ["biases"]),
        ("not a LoRA tensor", {**state, "base_model.model.model.norm.weight": torch.zeros(64)}, config, 8,
         ["model.norm.weight", "not a LoRA tensor"]),
        ("not a module", {**state, "base_model.model.model.evil.lora_A.weight": torch.zeros(4, 64)}, config, 8,
         ["model.evil", "not a linear layer"]),
        ("a norm is no linear", {**state, "base_model.model.model.norm.lora_A.weight": torch.zeros(4, 64)}, config, 8,
         ["model.norm", "not a linear layer"]),
        ("A without B", {k: v for k, v in state.items() if k != qb}, config, 8, ["q_proj", "lora_A without lora_B"]),
        ("wrong input width", {**state, qa: torch.zeros(4, 63)}, config, 8, ["q_proj", "(4, 63)"]),
        ("ranks of A and B differ", {**state, qa: torch.zeros(2, state[qa].shape[1])}, config, 8, ["q_proj"]),
        ("integer dtype", {**state, qa: state[qa].to(torch.int32)}, config, 8, [qa, "I32"]),
    ]
    for what, tensors, cfg, rank, words in cases:
        path = tmp_path / "bad.safetensors"
        _write(path, tensors, cfg)
        with pytest.raises(RequestError) as e:
            check_adapter_file(path, shapes, max_rank=rank)
        assert e.value.status == 422 and all(w in str(e.value) for w in words), (what, str(e.value))
    path.write_bytes(b"\x08" + b"\x00" * 7 + b"{not json")
    with pytest.raises(RequestError, match="safetensors"):
        check_adapter_file(path, shapes, max_rank=8)


def test_ranks_vllm_takes():
    from grpo_cli.serve.adapters import served_rank, unservable

    assert [served_rank(r) for r in (1, 2, 8, 9, 16, 17, 300, 512)] == [1, 8, 8, 16, 16, 32, 320, 512]
    with pytest.raises(ValueError, match="512"):
        served_rank(513)
    assert unservable({"r": 16}, 16) is None and unservable({"r": 8, "rank_pattern": {"q_proj": 32}}, 16) is not None
    assert "orthogonal" not in (unservable({"r": 8, "init_lora_weights": "orthogonal"}, 8) or "")
    assert "pissa" in unservable({"r": 8, "init_lora_weights": "pissa"}, 8)


def test_adapter_sync_needs_lora_and_a_server(tmp_path):
    from helpers import ROOT, cli

    TINY = str(ROOT / "recipes/ci-tiny.yaml")

    for extra, ok in [
        (["rollout.vllm.lora_sync=adapter"], False),  # no LoRA, hf backend
        (["rollout.vllm.lora_sync=adapter", "model.lora.r=8", "rollout.backend=vllm"], False),  # colocate
        (["rollout.vllm.lora_sync=adapter", "model.lora.r=8", "rollout.backend=vllm", "rollout.vllm.mode=server"], True),
        (["rollout.vllm.lora_sync=merged"], True),
    ]:
        p = cli("validate", TINY, *extra)
        assert (p.returncode == 0) == ok, (extra, p.stdout, p.stderr)
        if not ok:
            assert p.returncode == 2 and "rollout.vllm.lora_sync adapter" in p.stderr, p.stderr
