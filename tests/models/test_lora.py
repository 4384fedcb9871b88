"""LoRA / QLoRA with peft: the reference is the base with adapters off, adapter checkpoints resume, eval and export."""

import json
from pathlib import Path

import pytest
import torch

from grpo_cli.errors import RecipeError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.trainer.engine import Engine

from helpers import cli, read_jsonl, stable

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/ci-tiny.yaml"
LORA = ["model.lora.r=8", "model.lora.target_modules=[q_proj, v_proj, up_proj]"]

pytestmark = pytest.mark.usefixtures("model_cache")


def seq_logps(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_lora_trains_only_adapters_and_the_reference_is_the_base(tmp_path):
    from grpo_cli.models.loading import load_model

    r = load_recipe(TINY, [*LORA, "algorithm.beta=0.1", "train.max_steps=3", "train.learning_rate=0.02",
                           "checkpoint.every_steps=0", "logging.rollouts=false"])
    e = Engine(r, tmp_path / "run")
    assert e.reference.model is None  # no second copy: the base with adapters disabled is the reference
    policy = e.accelerator.unwrap_model(e.policy)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj", "up_proj"}  # ...q_proj.lora_A.default.weight
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    e.fit()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert metrics[-1]["kl"] > 0 and all(m["memory/peak_gib"] > 0 for m in metrics)
    assert all(torch.equal(p, frozen[n]) for n, p in policy.named_parameters() if not p.requires_grad)

    ids = torch.randint(3, 700, (2, 12), generator=torch.Generator().manual_seed(0))
    base = load_model(r.model)
    with policy.disable_adapter():
        assert torch.equal(seq_logps(policy, ids), seq_logps(base, ids))  # reference == the untouched base
    assert (seq_logps(policy, ids) - seq_logps(base, ids)).abs().max() > 1e-3  # and the policy moved away


def test_merged_state_dict_equals_peft_merge_and_unload():
    import peft

    from grpo_cli.models.loading import load_model
    from grpo_cli.models.lora import merged_state_dict
    from grpo_cli.recipe.schema import ModelConfig

    cfg = ModelConfig(name_or_path="builtin:tiny-qwen2")
    model = peft.get_peft_model(load_model(cfg), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                 init_lora_weights=False))  # B != 0: real deltas
    ours = {k: v.clone() for k, v in merged_state_dict(model).items()}
    assert any("lora" not in k and "base_layer" not in k for k in ours)
    reference = model.merge_and_unload().state_dict()
    assert ours.keys() == reference.keys()
    assert max((ours[k] - reference[k]).abs().max().item() for k in ours) < 1e-6
    plain = load_model(cfg).state_dict()
    assert max((ours[k] - plain[k]).abs().max().item() for k in ours) > 1e-3  # the deltas are in there


@pytest.mark.slow
def test_lora_resume_eval_and_export(tmp_path):
    common = [*LORA, "algorithm.beta=0.05", "algorithm.num_iterations=2", "train.learning_rate=0.02",
              "checkpoint.every_steps=2"]
    full = cli("train", str(TINY), "-o", str(tmp_path / "full"), *common, "train.max_steps=4")
    assert full.returncode == 0, full.stderr[-2000:]
    assert "reference: the base with adapters disabled (no copy)" in full.stdout + full.stderr
    run = tmp_path / "cut"
    assert cli("train", str(TINY), "-o", str(run), *common, "train.max_steps=2").returncode == 0
    ckpt = run / "checkpoints/step-2"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    base = json.loads((ckpt / "base_model.json").read_text())
    assert base["name_or_path"] == "builtin:tiny-qwen2" and base["model_type"] == "qwen2" and base["num_parameters"] > 0
    p = cli("train", str(TINY), "-o", str(run), *common, "train.max_steps=4", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = read_jsonl(tmp_path / "full/metrics.jsonl"), read_jsonl(run / "metrics.jsonl")
    assert [stable(m) for m in a] == [stable(m) for m in b]

    # export: a plain HF model whose log-probs equal the adapter model's
    out = tmp_path / "merged"
    p = cli("export", str(run / "checkpoints/step-4"), "--merge", str(out))
    assert p.returncode == 0, p.stderr
    assert not (out / "adapter_config.json").exists() and json.loads((out / "export.json").read_text())["lora_merged"]
    from transformers import AutoModelForCausalLM

    from grpo_cli.models.lora import load_adapter_model

    merged = AutoModelForCausalLM.from_pretrained(out)
    adapter = load_adapter_model(run / "checkpoints/step-4", load_recipe(run / "recipe.yaml").model, trainable=False)
    ids = torch.randint(3, 700, (3, 20), generator=torch.Generator().manual_seed(1))
    diff = (seq_logps(merged, ids) - seq_logps(adapter, ids)).abs().max().item()
    assert diff < 1e-5, diff
    with adapter.disable_adapter():
        assert (seq_logps(merged, ids) - seq_logps(adapter, ids)).abs().max().item() > 1e-3  # trained, not the base
    p = cli("export", str(run / "checkpoints/step-4"), "--merge", str(out))
    assert p.returncode == 2 and "not empty" in p.stderr

    # grpo eval reads the adapter checkpoint (base from its recipe) and samples what the exported model samples
    p = cli("eval", str(run / "checkpoints/step-4"), str(out), "base", "--limit", "6", "-n", "2", "-o", str(tmp_path / "ev"))
    assert p.returncode == 0, p.stderr[-2000:]
    completions: dict[str, list[str]] = {}
    for s in read_jsonl(tmp_path / "ev/samples.jsonl"):
        completions.setdefault(s["target"], []).append(s["completion"])
    ours, exported, base_model = completions.values()
    assert len(ours) == 6 * 3  # greedy + 2 samples per problem
    assert ours == exported and ours != base_model


@pytest.mark.slow
def test_qlora_trains_adapters_on_a_4bit_base(tmp_path):
    pytest.importorskip("bitsandbytes")
    run = tmp_path / "q"
    p = cli("train", str(TINY), "-o", str(run), *LORA, "model.load_in_4bit=true", "algorithm.beta=0.05",
            "train.max_steps=2", "train.learning_rate=0.02")
    assert p.returncode == 0, p.stderr[-2000:]
    m = read_jsonl(run / "metrics.jsonl")
    assert m[-1]["kl"] > 0 and m[-1]["grad_norm"] > 0
    from safetensors.torch import load_file

    adapter = load_file(str(run / "checkpoints/step-2/adapter_model.safetensors"))
    assert max(t.abs().max().item() for k, t in adapter.items() if "lora_B" in k) > 0  # B left its zero init
    p = cli("train", str(TINY), "-o", str(run), *LORA, "model.load_in_4bit=true", "algorithm.beta=0.05",
            "train.max_steps=3", "train.learning_rate=0.02", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(read_jsonl(run / "metrics.jsonl")) == 3
    # export merges the adapter into the unquantized base; base_model.json counts unpacked parameters
    assert json.loads((run / "checkpoints/step-3/base_model.json").read_text())["num_parameters"] == 123456
    p = cli("export", str(run), "--merge", str(tmp_path / "merged"))
    assert p.returncode == 0, p.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert sum(p.numel() for p in merged.parameters()) == 123456


@pytest.mark.parametrize("overrides, field", [
    (["model.load_in_4bit=true"], "model.lora.r > 0"),
    ([*LORA, "model.load_in_4bit=true", "rollout.backend=vllm"], "rollout.backend hf only"),
    (["model.lora.r=-1"], "model.lora.r"),
    (["model.lora.rank=8"], "model.lora.rank"),
])
def test_bad_lora_settings_name_the_field(overrides, field):
    with pytest.raises(RecipeError, match=field.replace(".", r"\.").replace(">", ">")):
        load_recipe(TINY, overrides)


@pytest.mark.slow
def test_lora_reference_adds_no_model_copy_to_peak_rss(tmp_path):
    """Peak RSS of one step: beta > 0 costs a full-size copy without LoRA, and nothing measurable with it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    tiny = resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2"))
    tok = AutoTokenizer.from_pretrained(tiny)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    folder = tmp_path / "model"
    model = AutoModelForCausalLM.from_config(config)
    model_gib = sum(p.numel() * 4 for p in model.parameters()) / 2**30  # fp32
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model

    def peak(name: str, *overrides: str) -> float:
        p = cli("train", str(TINY), "-o", str(tmp_path / name), f"model.name_or_path={folder}", "train.max_steps=1",
                "checkpoint.every_steps=0", "logging.rollouts=false", "rollout.max_completion_length=8", *overrides)
        assert p.returncode == 0, p.stderr[-2000:]
        return read_jsonl(tmp_path / name / "metrics.jsonl")[-1]["memory/peak_gib"]

    full_kl, full = peak("full-kl", "algorithm.beta=0.04"), peak("full", "algorithm.beta=0")
    lora_kl, lora = peak("lora-kl", *LORA, "algorithm.beta=0.04"), peak("lora", *LORA, "algorithm.beta=0")
    print(f"model {model_gib:.3f} GiB; peak RSS full {full:.3f} / +ref {full_kl:.3f}; lora {lora:.3f} / +ref {lora_kl:.3f}")
    assert full_kl - full > 0.75 * model_gib  # the measurement sees a second copy when there is one
    assert lora_kl - lora < 0.2 * model_gib  # LoRA's reference (adapters disabled) is not one
    assert lora < full - model_gib  # no gradients or AdamW moments for the frozen base
