"""The memory plan of `grpo doctor` against the peak memory real runs report (memory/peak_gib), and a model that
does not fit."""

import json
import re

import pytest

from grpo_cli.doctor.memory import GIB, PromptLengths, check_memory, model_sizes, peak, plan
from grpo_cli.recipe.files import load_recipe

from helpers import ROOT, cli, read_jsonl

pytestmark = pytest.mark.usefixtures("model_cache")


def planned_and_measured(tmp_path, recipe: str, *overrides: str) -> tuple[float, float]:
    run = tmp_path / "run"
    p = cli("train", recipe, "-o", str(run), *overrides, timeout=900, fresh=True)  # its own imports' memory
    assert p.returncode == 0, p.stderr[-3000:]
    measured = max(m["memory/peak_gib"] for m in read_jsonl(run / "metrics.jsonl"))
    p = cli("doctor", recipe, *overrides, "--json", fresh=True)  # its own imports' memory too: a zygote's forked
    # child has not touched the libraries' pages it shares, which its resident memory then leaves out
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


@pytest.fixture(scope="module")
def vocab_model(tmp_path_factory):
    """A random Qwen2 with a real vocabulary (32,000: the logits are most of a step's transient memory) on the builtin
    byte-level tokenizer (its ids fit), and data whose prompts run from 12 to about 200 tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    folder = tmp_path_factory.mktemp("vocab-model")
    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    config = Qwen2Config(vocab_size=32000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_position_embeddings=1024)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    rows = [{"question": "Context: " + " ".join(f"w{(k * 37 + i) % 997}" for i in range(8 * k)) + f". What is {k}?",
             "answer": str(k)} for k in range(16)]
    (folder / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


TENSOR_SHAPES = {  # full and LoRA, fp32 and bf16 autocast, short and long prompts
    "full fp32": [],
    "full, bf16 autocast, long prompts": ["train.mixed_precision=bf16", "LONG"],
    "LoRA r=16": ["model.lora.r=16"],
    "LoRA r=16, bf16 autocast, long prompts": ["model.lora.r=16", "train.mixed_precision=bf16", "LONG"],
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", TENSOR_SHAPES)
def test_the_plans_tensors_are_within_a_tenth_of_a_runs_live_tensors(vocab_model, tmp_path, shape):
    # issue 35: the plan within 10% on every shape. What a GPU reports (its allocator's peak: tensors only) is
    # measured here by tests/tensor_peak.py in a real run; the CPU's resident memory adds the C allocator's
    # retention (bench/doctor_memory.py measures both)
    import subprocess
    import sys

    from grpo_cli.doctor.diagnose import _inputs
    from grpo_cli.doctor.memory import prompt_lengths
    from grpo_cli.trainer.setup import forward_choices

    long = ["data.generator=null", f"data.files={vocab_model / 'long.jsonl'}", "data.prompt_column=question",
            "data.template=null", "data.max_prompt_length=512"]
    # 4 steps of 4 prompts: the 16 rows whose longest prompt the plan pads every batch to (grpo doctor reads 16)
    overrides = [f"model.name_or_path={vocab_model / 'model'}", "train.max_steps=4", "checkpoint.every_steps=0",
                 "logging.rollouts=false", "eval=null", "rollout.max_completion_length=32", "train.prompts_per_step=4",
                 "train.micro_batch_size=8", "train.threads=1"]
    for x in TENSOR_SHAPES[shape]:
        overrides += long if x == "LONG" else [x]
    p = subprocess.run([sys.executable, str(ROOT / "tests/tensor_peak.py"), str(tmp_path / "run"),
                        str(ROOT / "recipes/ci-tiny.yaml"), *overrides], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    measured = json.loads(p.stdout.splitlines()[-1])["tensors_gib"] * GIB
    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", overrides)
    _, config, _, stream = _inputs(recipe)  # as grpo doctor reads them
    lengths = prompt_lengths(stream.upcoming(16))
    planned = peak(plan(recipe, model_sizes(config), 1, lengths.longest, "cpu", 0.0, 0.0,
                        forward_choices(recipe, "cpu", config)))
    print(f"{shape}: planned {planned / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")
    assert abs(planned - measured) <= 0.10 * measured, (shape, planned / 2**20, measured / 2**20)
    assert measured > 0.05 * GIB  # the logits and the optimizer's moments are most of it, not the runtime


def test_a_model_that_does_not_fit_names_the_setting_to_change():
    from transformers import Qwen2Config

    seven_b = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064)  # Qwen2.5-7B's shape
    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.dtype=float32"])
    v = check_memory(recipe, seven_b, 1, PromptLengths(longest=64, first=64, rows=1))
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


def test_the_plan_asks_the_trainers_forward_choices():
    # issue 35: the plan assumed the chunked LM head and the lean MLP where the trainer would not use them
    from transformers import GPT2Config, Qwen2Config

    from grpo_cli.trainer.setup import forward_choices

    qwen = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256)
    tiny = load_recipe(ROOT / "recipes/ci-tiny.yaml")
    cpu = forward_choices(tiny, "cpu", qwen)
    assert (cpu.shared_prompts, cpu.chunked_head, cpu.lean_mlp, cpu.grouped_attention, cpu.autocast,
            cpu.recompute_up, cpu.lean_norms) == (True, "keep_logits", True, True, False, False, True)
    gpu = forward_choices(tiny, "cuda", qwen)
    # chunked_lm_head auto: recomputed on CUDA, kept on a CPU; recompute_up_projection auto: on CUDA
    assert not gpu.shared_prompts and gpu.chunked_head is True and gpu.recompute_up
    assert not forward_choices(tiny, "cuda", qwen, sharded=True).chunked_head  # FSDP / ZeRO-3: never
    assert not forward_choices(tiny, "cuda", GPT2Config(n_embd=64, n_layer=2, n_head=4)).chunked_head  # its head
    autocast = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["train.mixed_precision=bf16"])
    assert not forward_choices(autocast, "cpu", qwen).lean_mlp  # lean_forward steps aside under autocast
    down = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.lora.r=8", "model.lora.target_modules=all-linear"])
    assert not forward_choices(down, "cpu", qwen).lean_mlp  # a LoRA down projection is not a plain Linear
    qv = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj]"])
    assert forward_choices(qv, "cpu", qwen).lean_mlp
    checkpointed = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["model.gradient_checkpointing=true"])
    assert not forward_choices(checkpointed, "cpu", qwen).shared_prompts
    # and the plan counts with them: the lean MLP keeps 2 intermediate tensors a token and layer, the model's own 4
    shape = model_sizes(qwen)
    lean = {p.name: p.bytes for p in plan(tiny, shape, 1, 64, "cpu", 0.0, 0.0, cpu)}
    own = {p.name: p.bytes for p in plan(tiny, shape, 1, 64, "cpu", 0.0, 0.0,
                                         forward_choices(down, "cpu", qwen))}
    key = "forward + backward (activations, logits)"
    tokens = 4 * 16 + 1 * 64  # a micro-batch of 4 completions of 16 tokens, their group's prompt once
    assert own[key] - lean[key] == tokens * 2 * 2 * 128 * 4  # layers x 2 more [tokens, intermediate] float32 tensors


def test_a_server_sampling_elsewhere_counts_no_cache_and_the_longest_prompt_pads(tmp_path):
    # issue 35: server mode counted a KV cache the trainer never allocates; batches were sized by the first prompt
    from transformers import Qwen2Config

    shape = model_sizes(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256))
    key = "sampling (KV cache, logits)"
    hf = {p.name: p.bytes for p in plan(load_recipe(ROOT / "recipes/ci-tiny.yaml"), shape, 1, 64, "cpu", 0.0)}
    server = load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.backend=vllm", "rollout.vllm.mode=server"])
    assert hf[key] > 0 and {p.name: p.bytes for p in plan(server, shape, 1, 64, "cpu", 0.0)}[key] == 0
    # through the CLI: data whose first prompts are short and fourth long
    rows = [{"question": ("Context: " + " ".join(f"w{i}" for i in range(40)) + ". " if k == 3 else "") + f"What is {k}?",
             "answer": str(k)} for k in range(8)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["data.generator=null", f"data.files={data}", "data.prompt_column=question", "data.template=null",
              "data.max_prompt_length=256", "data.shuffle=false", "--json"]
    peaks = {}
    for name, extra in (("all", []), ("short", ["data.limit=3"])):
        p = cli("doctor", "recipes/ci-tiny.yaml", *common, *extra)
        verdict = {v["check"]: v for v in json.loads(p.stdout)["verdicts"]}["memory plan"]
        lengths = next(e for e in verdict["evidence"] if e.startswith("prompts: "))
        longest, first = (int(x) for x in re.match(r"prompts: the longest (\d+) tokens of \d+ rows read \((\d+) the first",
                                                    lengths).groups())
        peaks[name] = (longest, first, next(e for e in verdict["evidence"] if e.startswith("forward + backward")))
    assert peaks["all"][0] > 3 * peaks["all"][1] and peaks["short"][0] == peaks["short"][1] == peaks["all"][1]
    assert peaks["all"][2] != peaks["short"][2]  # the long prompt's micro-batch is planned, not the first prompt's


def test_on_a_gpu_the_plan_counts_cublas_the_heads_chunk_and_the_folded_mask(monkeypatch):
    # issue 35, traced on an H200 (bench/cuda_memory_trace.py): the plan was 28-30% under the allocator's peak on full
    # fine-tuning: two 32 MiB cuBLAS workspaces (the forward's thread and autograd's), the chunked head's weight
    # gradient three at once while autograd summed the chunks' (none new now: issue 40), and the attention mask, folded
    # per query head
    from transformers import Qwen2Config

    from grpo_cli.doctor.memory import cublas_workspaces
    from grpo_cli.trainer.setup import forward_choices

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert cublas_workspaces() == 2 * 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    assert cublas_workspaces() == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
    qwen = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, vocab_size=32000)
    shape = model_sizes(qwen)
    assert shape.n_rep == 4
    key = "forward + backward (activations, logits)"

    def forward(recipe, device, prompt=64, processes=1):
        return {p.name: p.bytes for p in plan(recipe, shape, processes, prompt, device, 0.0, 80 * GIB,
                                              forward_choices(recipe, device, qwen))}[key]

    full, lora = load_recipe(ROOT / "recipes/ci-tiny.yaml"), load_recipe(ROOT / "recipes/ci-tiny.yaml",
                                                                         ["model.lora.r=16"])
    # 4 rows x (64 prompt + 16 completion tokens) on 2 layers: the lean norms' (the layers they feed keep their input,
    # not their output) and the lean MLP's activations, its up
    # projection recomputed on CUDA (LoRA's down projection keeps the model's own 4 intermediates), the mask folded 4
    # times, then the head: in full fine-tuning its weight
    # gradient built in one [V, H] float32 tensor (algo/head_gradient.py; autograd's sum of the chunks' own gradients
    # held three at once) beside a row's logits: that tensor is the gradient kept between micro-batches (added to in
    # place: nothing new), with two processes too (DDP reduces it as it finds it); LoRA's head is frozen: a row's logits
    mask = 4 * 4 * 80 * 80 * 4
    assert forward(full, "cuda") == 4 * 80 * 2 * (5 * 64 + 2 * 16 + 1 * 128) * 4 + mask + 16 * 32000 * (4 + 4 + 12)
    assert forward(full, "cuda", processes=2) == forward(full, "cuda")
    assert forward(lora, "cuda") == 4 * 80 * 2 * (5 * 64 + 2 * 16 + 4 * 128) * 4 + mask + 16 * 32000 * (4 + 4 + 12)
    # the mask: 4 rows x 80 positions, folded 4 times on a GPU (rows padded to 16), once on the CPU
    longer = forward(full, "cuda", 96) - forward(full, "cuda", 64)
    per_token = 2 * (5 * 64 + 2 * 16 + 1 * 128) * 4  # layers x a token's activations
    assert longer == 4 * 32 * per_token + 4 * 4 * (112 * 112 - 80 * 80) * 4


def test_on_the_cpu_the_plan_counts_what_the_c_allocator_keeps_of_a_steps_largest_phase():
    # issue 35 defect 6: the CPU's memory/peak_gib is resident memory, 12-21% above a plan of tensors alone on every
    # shape of bench/doctor_memory.py (glibc keeps fragments of the freed ones); a GPU's allocator peak counts none
    from transformers import Qwen2Config

    from grpo_cli.doctor.memory import RETAINED, RETENTION, TRANSIENT, retention

    config = Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True)
    recipe = load_recipe(ROOT / "recipes/ci-tiny.yaml")
    v = check_memory(recipe, config, 1, PromptLengths(longest=64, first=64, rows=16))
    found = {line.rpartition(": ")[0]: line for line in v.evidence}
    assert RETENTION in found
    parts = plan(recipe, model_sizes(config), 1, 64, "cpu", 0.0)
    largest = max(p.bytes for p in parts if p.name.startswith(TRANSIENT))
    kept = retention(parts)
    assert kept.name == RETENTION and kept.bytes == pytest.approx(RETAINED * largest) and largest > 0
    assert peak([*parts, kept]) == pytest.approx(peak(parts) + RETAINED * largest)  # counted once, beside the rest
