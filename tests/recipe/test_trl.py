"""`grpo convert-trl` and the TRL GRPOConfig table (issue 15): three TRL configs (TRL's documentation example,
vLLM server mode, LoRA) convert to recipes that validate and train 2 steps of the tiny model; the batch arithmetic;
TRL's defaults written out; unmapped fields listed; unknown fields exit 2; the docs' table covers every field."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
import urllib.request

import pytest
import yaml

from grpo_cli.errors import ConversionError, RecipeError
from grpo_cli.recipe.files import load_recipe
from grpo_cli.recipe.trl import convert
from grpo_cli.recipe.trl_fields import GRPO_CONFIG, MODEL_ARGS, SCRIPT_ARGS
from grpo_cli.recipe.trl_homes import HOMES, known_fields, trl_table

from helpers import ROOT, cli, popen, read_jsonl

# TRL's documentation example (docs: GRPO Trainer, "trl grpo --config"), with the model and data made local below
DOC = {"model_name_or_path": "Qwen/Qwen2-0.5B-Instruct", "dataset_name": "trl-lib/DeepMath-103K",
       "reward_funcs": ["accuracy_reward"], "output_dir": "Qwen2-0.5B-GRPO", "learning_rate": 1.0e-5,
       "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "max_steps": 100, "logging_steps": 10}
SERVER = {**DOC, "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://127.0.0.1:8000",
          "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_cap": 2.0, "beta": 0.04,
          "loss_type": "grpo", "scale_rewards": False, "num_generations": 4, "per_device_train_batch_size": 4,
          "gradient_accumulation_steps": 1}
LORA = {**DOC, "use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_target_modules": ["q_proj", "v_proj"], "dtype": "float32", "bf16": False, "push_to_hub": True,
        "optim": "adafactor", "lr_scheduler_type": "cosine", "warmup_steps": 0.1}


def test_every_field_has_a_home_and_the_docs_table_is_current():
    assert known_fields() == set(HOMES)
    assert len(GRPO_CONFIG) == 189 and len(MODEL_ARGS) == 19 and len(SCRIPT_ARGS) == 8
    page = (ROOT / "docs/reference/trl-fields.md").read_text()
    assert page[page.index("| TRL field |"):].strip() == trl_table()
    from grpo_cli.recipe.schema import schema_keys

    keys = {k for k, _ in schema_keys()} | {"rewards", "name"}
    assert {key for key, _ in HOMES.values() if key} <= keys  # every key the table names exists


def test_the_frozen_fields_are_trls():
    trl = pytest.importorskip("trl")  # in bench/.venv-trl, never in grpo's dependencies
    from trl import GRPOConfig, ModelConfig

    assert trl.__version__.startswith("1.16")
    assert {f.name for f in dataclasses.fields(GRPOConfig) if not f.name.startswith("_")} == set(GRPO_CONFIG)
    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(MODEL_ARGS)


def test_the_documentation_example_converts_with_trls_defaults_and_the_batch_arithmetic():
    out = convert(DOC)
    r = out.recipe
    assert (r["train"]["prompts_per_step"], r["train"]["micro_batch_size"], r["algorithm"]["num_generations"]) == (2, 8, 8)
    assert "8 x 2 x 1 = 16 completions = 2 prompts x G=8" in out.notes[0]
    assert convert(DOC, num_processes=4).recipe["train"]["prompts_per_step"] == 8  # 8 x 2 x 4 / 8
    # TRL's defaults that change what is learned are written out
    assert (r["algorithm"]["beta"], r["algorithm"]["loss_type"], r["algorithm"]["use_bias_correction_kl"]) == (0.0, "dapo", True)
    assert (r["train"]["adam_beta2"], r["train"]["scheduler"], r["rollout"]["max_completion_length"]) == (0.999, "linear", 512)
    # TRL 1.16 loads float32 weights (ModelConfig.dtype) and trains under bf16 autocast (bf16 unless fp16)
    assert r["model"]["gradient_checkpointing"] is True and r["model"]["dtype"] == "float32"
    assert r["train"]["mixed_precision"] == "bf16"
    assert r["rewards"] == [{"name": "accuracy"}] and r["logging"]["output_dir"] == "Qwen2-0.5B-GRPO"
    assert out.unmapped == [] and out.unknown == []


def test_server_and_lora_configs_and_what_cannot_be_mapped():
    s = convert(SERVER).recipe
    assert s["rollout"]["backend"] == "vllm" and s["rollout"]["vllm"]["mode"] == "server"
    assert s["rollout"]["vllm"]["server_url"] == "http://127.0.0.1:8000"
    assert (s["rollout"]["importance_sampling"], s["rollout"]["importance_sampling_cap"]) == ("token_truncate", 2.0)
    assert "importance_sampling_min" not in s["rollout"]  # TRL's default: no lower bound
    band = convert({**SERVER, "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5})
    assert (band.recipe["rollout"]["importance_sampling"], band.recipe["rollout"]["importance_sampling_min"]) == (
        "token_mask", 0.5)  # issue 38: IcePop's band [0.5, 2]
    assert (s["algorithm"]["beta"], s["algorithm"]["loss_type"], s["algorithm"]["scale_rewards"]) == (0.04, "grpo", "none")
    assert s["train"]["prompts_per_step"] == 1  # 4 x 1 x 1 / 4
    # issue 38: TRL's colocate tensor parallelism splits each engine over processes; a server takes --tp itself
    colocated = convert({**SERVER, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 2})
    assert colocated.recipe["rollout"]["vllm"]["tensor_parallel_size"] == 2
    served = convert({**SERVER, "vllm_tensor_parallel_size": 2})
    assert "tensor_parallel_size" not in served.recipe["rollout"]["vllm"]
    assert any("grpo serve-vllm --tp 2" in n for n in served.notes)
    with pytest.raises(RecipeError, match=r"tensor_parallel_size \(2\).*--tp 2"):
        load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.backend=vllm", "rollout.vllm.mode=server",
                                                     "rollout.vllm.tensor_parallel_size=2"])
    with pytest.raises(RecipeError, match="tensor_parallel_size > 1 with multi-turn"):
        load_recipe(ROOT / "recipes/ci-tiny.yaml", ["rollout.backend=vllm", "rollout.vllm.tensor_parallel_size=2",
                                                     "rollout.tools=[calc_tools.py:add]"])
    out = convert(LORA)
    lora = out.recipe["model"]["lora"]
    assert lora == {"r": 8, "alpha": 16.0, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "use_rslora": False}
    assert (out.recipe["train"]["optimizer"], out.recipe["train"]["scheduler"]) == ("adafactor", "cosine")
    assert out.recipe["train"]["warmup_steps"] == 10 and out.recipe["train"]["mixed_precision"] == "no"
    assert [(k, v) for k, v, _ in out.unmapped] == [("push_to_hub", True)]
    old = convert({**DOC, "use_liger_loss": True, "vllm_guided_decoding_regex": "[0-9]+", "max_prompt_length": 256})
    assert old.unknown == [] and old.recipe["data"]["max_prompt_length"] == 256
    assert "use_liger_loss is older TRL's name of use_liger_kernel" in old.notes
    assert sorted(k for k, _, _ in old.unmapped) == ["use_liger_kernel", "vllm_structured_outputs_regex"]  # no vLLM
    with pytest.raises(ConversionError, match=r"steps_per_generation \(3\) is not a multiple of gradient_accumulation"):
        convert({**DOC, "steps_per_generation": 3})
    with pytest.raises(ConversionError, match="both set"):
        convert({**DOC, "steps_per_generation": 4, "generation_batch_size": 32})


def test_steps_per_generation_becomes_mini_batches_and_trls_optimizer_steps_become_grpo_steps():
    # issue 38: 8 completions a micro-batch, an optimizer step every 2, a generation batch every 4 micro-batches: 32
    # completions (4 prompts of G=8) and 2 optimizer steps on them; TRL's 100 optimizer steps are 50 grpo steps
    for spg in ({"steps_per_generation": 4}, {"generation_batch_size": 32}):
        out = convert({**DOC, **spg, "save_steps": 30, "warmup_steps": 10})
        t = out.recipe["train"]
        assert (t["prompts_per_step"], t["micro_batch_size"], t["mini_batches"]) == (4, 8, 2), t
        assert (t["max_steps"], t["warmup_steps"], out.recipe["checkpoint"]["every_steps"]) == (50, 10, 15)
        assert any("train.mini_batches: 2" in n for n in out.notes), out.notes
    # with num_iterations 2 each grpo step is 4 of TRL's optimizer steps (rounded up: 25 and 8 of 30 / 4)
    out = convert({**DOC, "steps_per_generation": 4, "num_iterations": 2, "save_steps": 30})
    assert (out.recipe["train"]["max_steps"], out.recipe["checkpoint"]["every_steps"]) == (25, 8)
    # the default (steps_per_generation = gradient_accumulation_steps): one optimizer step a generation batch
    t = convert(DOC).recipe["train"]
    assert (t["prompts_per_step"], t["max_steps"]) == (2, 100) and "mini_batches" not in t
    # issue 38: no max_steps (TRL's -1) trains num_train_epochs (TRL's default 3) of the data; a warmup ratio of
    # steps not known before the data is read is refused
    epochs = convert({k: v for k, v in DOC.items() if k != "max_steps"})
    assert epochs.recipe["train"]["epochs"] == 3.0 and "max_steps" not in epochs.recipe["train"]
    assert convert({**DOC, "max_steps": -1, "num_train_epochs": 2}).recipe["train"]["epochs"] == 2.0
    with pytest.raises(ConversionError, match="warmup_steps 0.1 is a ratio"):
        convert({**DOC, "max_steps": -1, "warmup_steps": 0.1})


def test_trls_reward_columns_warmup_ratio_and_the_defaults_note():
    # issue 22: accuracy_reward reads `solution`, but the recipe kept answer_column: answer (failed at step 1);
    # warmup_ratio aborted the conversion; the user's own values were listed as "TRL defaults written out"
    out = convert(DOC | {"warmup_ratio": 0.1, "learning_rate": 3e-6})
    assert out.unknown == [] and out.recipe["train"]["warmup_steps"] == 10  # 0.1 x 100 steps
    assert out.recipe["data"]["answer_column"] == "solution"
    assert "accuracy_reward reads the dataset column `solution` (TRL's): data.answer_column: solution" in out.notes
    assert "warmup_ratio 0.1 is older transformers' name of a fractional warmup_steps" in out.notes
    [defaults] = [n for n in out.notes if "defaults are written out" in n]
    assert "beta 0.0" in defaults and "learning_rate" not in defaults and "3e-06" not in defaults
    both = convert(DOC | {"warmup_ratio": 0.1, "warmup_steps": 5})
    assert both.recipe["train"]["warmup_steps"] == 5 and any("warmup_ratio 0.1 is left out" in n for n in both.notes)
    assert convert({**DOC, "reward_funcs": ["think_format_reward"]}).recipe["data"].get("answer_column") is None


@pytest.mark.parametrize("given, dtype, precision, said", [
    ({}, "float32", "bf16", "dtype float32 (TRL's default), bf16 true (TRL's default): float32 weights, gradients and "
                            "AdamW state under bfloat16 autocast (train.mixed_precision: bf16), as TRL trains"),
    ({"bf16": True, "use_cpu": True}, "float32", "bf16", "dtype float32 (TRL's default), bf16 true: float32 weights"),
    ({"dtype": "bfloat16"}, "bfloat16", "no", "dtype bfloat16, bf16 true (TRL's default): the weights are bfloat16 "
                                              "already (model.dtype), so no autocast (train.mixed_precision: no)"),
    ({"dtype": "auto"}, "bfloat16", "no", "dtype auto (the checkpoint's own dtype, not read when converting: "
                                          "bfloat16 assumed; set model.dtype if it differs)"),
    ({"fp16": True}, "float32", "fp16", "dtype float32 (TRL's default), fp16 true: float32 weights under float16 "
                                        "autocast"),
    ({"bf16": False}, "float32", "no", "dtype float32 (TRL's default), bf16 false: float32 weights, no autocast"),
])
def test_dtype_and_bf16_convert_as_trl_trains_and_say_so(given, dtype, precision, said):
    # issue 22: `bf16: true` was dropped without a word, and TRL's float32 default weights became bfloat16 ones
    out = convert(DOC | given)
    assert (out.recipe["model"]["dtype"], out.recipe["train"]["mixed_precision"]) == (dtype, precision)
    [note] = [n for n in out.notes if n.startswith("dtype ")]
    assert note.startswith(said), note


def test_the_recipe_name_is_made_of_the_characters_a_name_may_hold():
    assert convert(DOC).recipe["name"] == "Qwen2-0.5B-Instruct-grpo"
    assert convert(DOC | {"model_name_or_path": "builtin:tiny-qwen2"}).recipe["name"] == "builtin-tiny-qwen2-grpo"
    assert convert(DOC | {"run_name": "my run #3 (lr 1e-6)"}).recipe["name"] == "my-run-3-lr-1e-6"


def test_a_reward_module_not_installed_here_is_converted_with_a_note(tmp_path):
    # issue 22: a reward module that could not be imported on the converting machine aborted the conversion
    out = convert_cli(tmp_path, {**DOC, "reward_funcs": ["accuracy_reward", "my_company_rewards.strict_format"]})
    assert out.returncode == 0, out.stderr
    assert "note: cannot check here: rewards.1" in out.stderr and "my_company_rewards" in out.stderr
    rewards = yaml.safe_load((tmp_path / "recipe.yaml").read_text())["rewards"]
    assert rewards == [{"name": "accuracy"}, {"name": "my_company_rewards:strict_format"}]
    bad = convert_cli(tmp_path, {**DOC, "loss_type": "ppo"})  # anything else still exits 2
    assert bad.returncode == 2 and "does not validate" in bad.stderr


def test_luspo_vespo_and_the_entropy_bonus_convert(tmp_path, local_data):
    # issue 21: loss_type luspo exited 2 with a bare schema error; vespo and the entropy bonus had no home
    out = convert_cli(tmp_path, {**DOC, "loss_type": "luspo", "importance_sampling_level": "sequence"})
    assert out.returncode == 0, out.stderr
    a = yaml.safe_load((tmp_path / "recipe.yaml").read_text())["algorithm"]
    assert (a["loss_type"], a["importance_sampling_level"]) == ("luspo", "sequence")
    # TRL's default token level with luspo: TRL warns and trains a token-level ratio; grpo takes the paper's
    out = convert(DOC | {"loss_type": "luspo"})
    assert out.recipe["algorithm"]["importance_sampling_level"] == "sequence"
    assert any("luspo" in n and "importance_sampling_level: sequence" in n for n in out.notes), out.notes
    vespo = convert(DOC | {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_neg": 2.5, "entropy_coef": 0.01,
                           "use_adaptive_entropy": True, "entropy_target": 0.5, "entropy_coef_max": 0.1,
                           "entropy_coef_delta": 0.001, "entropy_coef_min": 0.002})
    a = vespo.recipe["algorithm"]
    assert (a["loss_type"], a["vespo_k_pos"], a["vespo_lambda_pos"], a["vespo_k_neg"], a["vespo_lambda_neg"]) == (
        "vespo", 1.5, 3.0, 3.0, 2.5)
    assert (a["entropy_coef"], a["use_adaptive_entropy"], a["entropy_target"], a["entropy_coef_min"],
            a["entropy_coef_max"], a["entropy_coef_delta"]) == (0.01, True, 0.5, 0.002, 0.1, 0.001)
    assert vespo.unmapped == [] and vespo.unknown == []
    local = {"model_name_or_path": "builtin:tiny-qwen2", "dataset_name": local_data}  # validate reads the data
    for config in (DOC | local | {"loss_type": "luspo"}, DOC | local | {"loss_type": "vespo"}):
        assert convert_cli(tmp_path, config).returncode == 0
        assert cli("validate", str(tmp_path / "recipe.yaml"), timeout=120).returncode == 0


@pytest.mark.parametrize("shaping, named", [
    ({"repetition_penalty": 1.1}, "repetition_penalty 1.1"),
    ({"vllm_structured_outputs_regex": "[0-9]+"}, "vllm_structured_outputs_regex"),
    ({"generation_kwargs": {"min_tokens": 4}}, "generation_kwargs.min_tokens"),
])
def test_a_vllm_config_whose_sampling_the_trainer_cannot_replay_converts_without_the_correction(shaping, named):
    """TRL would apply its importance-sampling correction with a ratio biased by the setting; grpo refuses that
    combination (recipe/checks.py), so the conversion turns the correction off and says why."""
    from grpo_cli.recipe.schema import Recipe

    out = convert({**SERVER, **shaping})
    assert out.recipe["rollout"]["importance_sampling"] == "none"
    assert any(n.startswith("vllm_importance_sampling_correction: off, because " + named) for n in out.notes), out.notes
    out.recipe["rewards"] = [{"name": "accuracy"}]  # validated as written, without the hub model and data
    out.recipe["model"]["name_or_path"], out.recipe["data"] = "builtin:tiny-qwen2", {"generator": "arithmetic"}
    Recipe.model_validate(out.recipe)
    assert convert({**SERVER, "top_p": 0.8, "top_k": 20}).recipe["rollout"]["importance_sampling"] == "token_truncate"


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trl-data")
    # TRL's columns: a conversational `prompt` and the `solution` its accuracy_reward reads
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "solution": str(a + b)}
            for a in range(1, 9) for b in range(1, 9)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(folder)


def convert_cli(tmp_path, config: dict, *args: str):
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump(config))
    return cli("convert-trl", str(path), "-o", str(tmp_path / "recipe.yaml"), *args, timeout=120)


def train_two_steps(tmp_path, *overrides: str, env=None):
    return cli("train", tmp_path / "recipe.yaml", "train.max_steps=2", "train.threads=1",
               f"logging.output_dir={tmp_path / 'run'}", *overrides, env=env or os.environ)


@pytest.mark.slow
def test_a_config_with_epochs_and_steps_per_generation_trains_its_epochs_in_mini_batches(tmp_path, local_data,
                                                                                         turn_model, model_cache):
    # issue 38: 64 prompts, generation batches of 4 x 4 = 16 completions (4 prompts) in 2 optimizer steps of 2
    # micro-batches of 4; a quarter of an epoch is 4 steps, 8 optimizer steps on a linear schedule
    config = {k: v for k, v in DOC.items() if k != "max_steps"} | {
        "model_name_or_path": turn_model, "dataset_name": local_data, "max_completion_length": 8,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 4,
        "num_generations": 4, "num_train_epochs": 0.25, "gradient_checkpointing": False, "bf16": False}
    out = convert_cli(tmp_path, config)
    assert out.returncode == 0, out.stderr[-3000:]
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert {k: recipe["train"][k] for k in ("epochs", "prompts_per_step", "mini_batches", "micro_batch_size")} == {
        "epochs": 0.25, "prompts_per_step": 4, "mini_batches": 2, "micro_batch_size": 4}
    p = cli("train", tmp_path / "recipe.yaml", "train.threads=1", f"logging.output_dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and metrics[-1]["epoch"] == 0
    lr = recipe["train"]["learning_rate"]  # the rate at each step's first of 2 optimizer steps, of 8 in all
    assert [round(m["learning_rate"] / lr, 6) for m in metrics] == [1.0, 0.75, 0.5, 0.25]


VESPO_ENTROPY = {**DOC, "loss_type": "vespo", "use_adaptive_entropy": True, "entropy_target": 100.0}
LUSPO = {**DOC, "loss_type": "luspo"}
STREAMING = {**DOC, "dataset_streaming": True}


@pytest.mark.slow
@pytest.mark.parametrize("config", [DOC, LORA, VESPO_ENTROPY, LUSPO, STREAMING],
                         ids=["documentation", "lora", "vespo", "luspo", "streaming"])
def test_converted_recipes_train_the_tiny_model(config, tmp_path, local_data, turn_model, model_cache):
    small = {**config, "model_name_or_path": turn_model, "dataset_name": local_data, "max_completion_length": 8,
             "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4,
             "gradient_checkpointing": False}
    if config is not DOC:  # the documentation example keeps TRL's precision: float32 weights under bf16 autocast
        small["bf16"] = False
    out = convert_cli(tmp_path, small)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "note: batch: TRL's generation batch" in out.stderr
    if config is LORA:
        assert "not mapped: push_to_hub = True: no hub upload" in out.stderr
    assert cli("validate", str(tmp_path / "recipe.yaml"), timeout=120).returncode == 0
    p = train_two_steps(tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and len(read_jsonl(tmp_path / "run" / "rollouts.jsonl")) == 2 * 8
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert recipe["train"]["mixed_precision"] == ("bf16" if config is DOC else "no")
    assert recipe["data"].get("streaming", False) is (config is STREAMING)  # the data folder read as a stream
    if config is VESPO_ENTROPY:  # the entropy stays below 100 nats: the coefficient rises by 0.005 a step
        assert [round(m["entropy_coef"], 6) for m in metrics] == [0.005, 0.01]
        assert all(m["vespo/phi_seq_mean"] > 0 for m in metrics)


@pytest.mark.vllm
def test_converted_server_config_trains_against_grpo_serve_vllm(tmp_path, local_data, turn_model, model_cache):
    pytest.importorskip("vllm")
    from grpo_cli.trainer.launch import free_port

    port = free_port()
    small = {**SERVER, "model_name_or_path": turn_model, "dataset_name": local_data, "max_completion_length": 8,
             "vllm_server_base_url": f"http://127.0.0.1:{port}", "bf16": False, "gradient_checkpointing": False,
             "dtype": "float32"}
    out = convert_cli(tmp_path, small)
    assert out.returncode == 0, out.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING_")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", GRPO_SERVER_TOKEN="convert-test")
    server = popen("serve-vllm", "--model", turn_model, "--port", str(port), env=env, stdout=open(tmp_path / "server.log", "a"),
                   stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        p = train_two_steps(tmp_path, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2] and all("sampling/importance_sampling_ratio/mean" in m for m in metrics)
    finally:
        server.kill()
        server.wait()


def test_unknown_fields_exit_2_naming_them(tmp_path):
    out = convert_cli(tmp_path, {**DOC, "learnig_rate": 1e-5, "per_device_batch_size": 4})
    assert out.returncode == 2
    assert "learnig_rate: not a field of TRL 1.16.0's GRPOConfig" in out.stderr and "did you mean 'learning_rate'" in out.stderr
    assert "per_device_batch_size" in out.stderr and not (tmp_path / "recipe.yaml").exists()
    out = convert_cli(tmp_path, {k: v for k, v in DOC.items() if k != "reward_funcs"})
    assert out.returncode == 2 and "reward_funcs (or reward_model_name_or_path) is missing" in out.stderr
    # issue 35: a misspelt field is named with the field it may have meant (issue 38: max_steps is no longer
    # required, TRL's num_train_epochs counts without it)
    typo = {**{k: v for k, v in DOC.items() if k != "max_steps"}, "max_step": 100}
    out = convert_cli(tmp_path, typo)
    assert out.returncode == 2, out.stderr
    assert "max_step: not a field of TRL 1.16.0's GRPOConfig" in out.stderr and "did you mean 'max_steps'" in out.stderr


ENV_CONFIG = {"model_name_or_path": "Qwen/Qwen3-0.6B", "environment_factory": "recipes.envs.increment.IncrementEnv",
              "max_steps": 1000, "chat_template_kwargs": {"enable_thinking": False}}


def test_environment_factory_and_tools_convert():
    out = convert(ENV_CONFIG, owns_reward=lambda path: True)
    r = out.recipe
    assert r["data"] == {"generator": "blank", "chat_template": True, "chat_template_kwargs": {"enable_thinking": False}}
    assert r["rewards"] == [{"name": "environment", "weight": 1.0}]  # get_reward, TRL's weight 1
    assert r["rollout"]["environment"] == "recipes.envs.increment:IncrementEnv"
    assert r["rollout"]["max_turns"] == 512  # max_completion_length (TRL 1.16: 512): TRL's unlimited tool calls: every turn samples a token
    # TRL continues an episode's tokens with each tool answer's (prompt_ids + completion_ids + suffix_ids), never
    # re-rendering the history: what grpo calls `keep`
    assert r["rollout"]["history_change"] == "keep" and any("history_change: keep" in n for n in out.notes)
    assert "history_change" not in convert(DOC).recipe["rollout"]  # no tools: nothing to say
    routed = {**DOC, "environment_factory": {"coding": "my_envs.CodingEnv", "game": "my_envs.GameEnv"},
              "tools": ["my_tools.add"], "reward_funcs": ["my_rewards.fmt"], "reward_weights": [0.5],
              "max_tool_calling_iterations": 3}
    r = convert(routed, owns_reward=lambda path: path == "my_envs:CodingEnv").recipe
    assert r["rollout"]["environment"] == {"coding": "my_envs:CodingEnv", "game": "my_envs:GameEnv"}
    assert r["rollout"]["tools"] == ["my_tools:add"] and r["rollout"]["max_turns"] == 4
    assert r["rewards"] == [{"name": "my_rewards:fmt", "weight": 0.5}, {"name": "environment", "weight": 1.0}]
    assert r["data"]["dataset"] == DOC["dataset_name"]
    r = convert({**routed, "environment_factory": "my_envs.GameEnv"}, owns_reward=lambda path: False).recipe
    assert [w["name"] for w in r["rewards"]] == ["my_rewards:fmt"]  # no get_reward: nothing added
    with pytest.raises(ConversionError, match="or an environment_factory whose class has get_reward"):
        convert({k: v for k, v in routed.items() if k != "reward_funcs"}, owns_reward=lambda path: False)


@pytest.mark.slow
def test_a_converted_environment_factory_config_trains(tmp_path, model_cache):
    small = {**ENV_CONFIG, "model_name_or_path": "builtin:tiny-qwen2", "max_completion_length": 16,
             "max_tool_calling_iterations": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
             "num_generations": 4, "gradient_checkpointing": False, "bf16": False, "max_steps": 2}
    out = convert_cli(tmp_path, small)
    assert out.returncode == 0, out.stderr[-3000:]
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert recipe["rollout"]["environment"] == "recipes.envs.increment:IncrementEnv" and recipe["rollout"]["max_turns"] == 3
    p = train_two_steps(tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all("rewards/environment/mean" in m for m in metrics)
    bad = convert_cli(tmp_path, {**small, "environment_factory": "recipes.envs.increment.Missing"})
    assert bad.returncode == 2 and "environment_factory:" in bad.stderr
