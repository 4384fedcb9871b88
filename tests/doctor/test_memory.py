"""The memory plan of `grpo doctor` against the peak memory real runs report (memory/peak_gib), and a model that
does not fit."""

import json

import pytest

from grpo_cli.doctor.memory import GIB, check_memory, model_sizes, peak, plan
from grpo_cli.recipe.files import load_recipe

from helpers import ROOT, cli, read_jsonl

pytestmark = pytest.mark.usefixtures("model_cache")


def planned_and_measured(tmp_path, recipe: str, *overrides: str) -> tuple[float, float]:
    run = tmp_path / "run"
    p = cli("train", recipe, "-o", str(run), *overrides, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    measured = max(m["memory/peak_gib"] for m in read_jsonl(run / "metrics.jsonl"))
    p = cli("doctor", recipe, *overrides, "--json")
    verdicts = {v["check"]: v for v in json.loads(p.stdout)["verdicts"]}
    plan_line = next(e for e in verdicts["memory plan"]["evidence"] if e.startswith("peak: "))
    return float(plan_line.split()[1]), measured


def test_the_plan_of_the_tiny_model_is_within_a_quarter_of_a_real_run(tmp_path):
    planned, measured = planned_and_measured(tmp_path, "recipes/ci-tiny.yaml", "train.max_steps=2", "eval=null")
    assert abs(planned - measured) <= 0.25 * measured, (planned, measured)


@pytest.mark.slow
def test_the_plan_of_smollm2_is_within_a_quarter_of_a_real_run(tmp_path):
    # the quickstart's model and batch (16 rows, full fine-tuning in float32: AdamW's moments are a third of it)
    planned, measured = planned_and_measured(tmp_path, "recipes/quickstart.yaml", "train.max_steps=2", "eval=null")
    assert measured > 2.0 and abs(planned - measured) <= 0.25 * measured, (planned, measured)


def test_a_model_that_does_not_fit_names_the_setting_to_change():
    from transformers import Qwen2Config

    seven_b = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064)  # Qwen2.5-7B's shape
    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.dtype=float32"])
    v = check_memory(recipe, seven_b, 1, 64)
    assert v.severity == "fail", v
    assert v.finding.startswith("needs about ") and "the largest part is optimizer state" in v.finding
    assert v.advice == "model.lora.r=16, or train.optimizer=adamw_8bit"
    shape = model_sizes(seven_b)
    assert 7.0e9 < shape.params < 7.8e9  # 7.6B with the untied head
    lora = plan(load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.lora.r=16", "model.dtype=bfloat16"]), shape, 1, 64,
                "cuda", 0.0)
    parts = {p.name: p.bytes for p in lora}
    assert parts["weights"] == shape.params * 2 and parts["optimizer state"] < 0.02 * parts["weights"]  # 40M adapter weights
    assert peak(lora) < 20 * GIB


def test_a_colocated_vllm_engine_counts_its_share_instead_of_transformers_cache():
    from transformers import Qwen2Config

    shape = model_sizes(Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936))  # 0.5B
    hf = {p.name: p.bytes for p in plan(load_recipe(ROOT / "recipes/ci-tiny.yaml"), shape, 1, 64, "cuda", 0.0, 80 * GIB)}
    colocate = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.backend=vllm", "rollout.vllm.mode=colocate",
                                                           "rollout.vllm.gpu_memory_utilization=0.25"])
    parts = {p.name: p.bytes for p in plan(colocate, shape, 1, 64, "cuda", 0.0, 80 * GIB)}
    assert parts["vLLM's share (colocated: rollout.vllm.gpu_memory_utilization)"] == 20 * GIB
    assert hf["vLLM's share (colocated: rollout.vllm.gpu_memory_utilization)"] == 0.0
    assert parts["sampling (KV cache, logits)"] == 0.0 < hf["sampling (KV cache, logits)"]
    cpu = {p.name: p.bytes for p in plan(colocate, shape, 1, 64, "cpu", 0.0)}  # its own weights + the KV cache
    assert cpu["vLLM's share (colocated: its weights and rollout.vllm.cpu_kv_cache_gib)"] == shape.params * 4 + GIB
