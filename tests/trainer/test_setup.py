"""TRL GRPOConfig options with a home here (issue 15): model.init_kwargs, data.chat_template_kwargs,
rollout.generation_kwargs, rollout.cache_implementation, logging.num_completions_to_print, train.optimizer."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.errors import SetupError
from grpo_cli.preflight import resolve
from grpo_cli.recipe.schema import DataConfig, ModelConfig, Recipe, RolloutConfig

from helpers import cli, read_jsonl, stable

torch.set_num_threads(1)
BASE = {"name": "t", "model": {"name_or_path": "builtin:tiny-qwen2"}, "data": {"generator": "arithmetic"},
        "rewards": [{"name": "accuracy"}], "train": {"max_steps": 1}}


def refused(section: str, fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:  # by the schema or, for what a name stands for, the preflight
        resolve(Recipe.model_validate({**BASE, section: {**BASE.get(section, {}), **fields}}))
    assert message in str(e.value), (message, str(e.value))


def test_model_init_kwargs_reach_from_pretrained(model_cache):
    from grpo_cli.models.loading import load_model

    assert load_model(ModelConfig(name_or_path="builtin:tiny-qwen2")).config.use_cache is True
    model = load_model(ModelConfig(name_or_path="builtin:tiny-qwen2", init_kwargs={"use_cache": False}))
    assert model.config.use_cache is False  # a config override, through from_pretrained
    refused("model", {"init_kwargs": {"torch_dtype": "bfloat16"}}, "model.init_kwargs.torch_dtype: set model.dtype instead")
    refused("model", {"init_kwargs": {"device_map": "auto"}}, "model.init_kwargs.device_map: not settable (the trainer")


def test_chat_template_kwargs_reach_the_template(model_cache):
    from transformers import AutoTokenizer

    from grpo_cli.agents.observations import Observations
    from grpo_cli.data.prompts import render_prompt
    from grpo_cli.models.loading import resolve_model_source

    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                         "not enable_thinking %}<think></think>{% endif %}{% endif %}")
    row = {"prompt": "What is 2 + 3?"}
    plain = render_prompt(row, DataConfig(generator="arithmetic", template="{prompt}"), tok)
    off = render_prompt(row, DataConfig(generator="arithmetic", template="{prompt}",
                                        chat_template_kwargs={"enable_thinking": False}), tok)
    assert off == plain + "<think></think>"  # Qwen3's switch
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    text = Observations(tok, {"enable_thinking": False}).text([{"role": "user", "content": "hi"}], eos)
    assert text.endswith("<|im_start|>assistant\n<think></think>")


def test_generation_kwargs_and_cache_implementation_reach_generate(turn_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.rollout.hf import HFGenerator

    tok, model = AutoTokenizer.from_pretrained(turn_model), AutoModelForCausalLM.from_pretrained(turn_model)
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                         add_generation_prompt=True), add_special_tokens=False)["input_ids"]

    def lengths(**rollout):
        torch.manual_seed(0)
        out = HFGenerator(model, tok, RolloutConfig(max_completion_length=16, **rollout)).generate([prompt], ["p"], 16)
        return out.completion_mask.sum(1).tolist(), out

    free, _ = lengths()
    forced, _ = lengths(generation_kwargs={"min_new_tokens": 7})
    assert min(free) < 7 <= min(forced)  # the model ends its turns early; min_new_tokens holds EOS back
    torch.manual_seed(0)
    dynamic = HFGenerator(model, tok, RolloutConfig(max_completion_length=8)).generate([prompt], ["p"], 2, greedy=True)
    static = HFGenerator(model, tok, RolloutConfig(max_completion_length=8, cache_implementation="static")).generate(
        [prompt], ["p"], 2, greedy=True)
    assert static.completion_ids.tolist() == dynamic.completion_ids.tolist()  # a static cache, the same tokens
    refused("rollout", {"generation_kwargs": {"temperature": 0.5}},
            "rollout.generation_kwargs.temperature: set rollout.temperature instead")
    refused("rollout", {"generation_kwargs": {"max_tokens": 5}},
            "rollout.generation_kwargs.max_tokens: set rollout.max_completion_length instead")
    refused("rollout", {"cache_implementation": "statik"}, "rollout.cache_implementation: 'statik' is not one of")


def test_server_requests_carry_sampling_kwargs():
    from grpo_cli.serve.requests import GenerateRequest

    req = GenerateRequest.model_validate({"prompt_token_ids": [[1, 2]], "sampling_kwargs": {"min_tokens": 3}})
    assert req.sampling_kwargs == {"min_tokens": 3}
    with pytest.raises(ValueError):
        GenerateRequest.model_validate({"prompt_token_ids": [[1]], "sampling_kwargs": {f"k{i}": 1 for i in range(40)}})


@pytest.mark.slow
def test_num_completions_to_print(tmp_path, model_cache):
    out = cli("train", "recipes/ci-tiny.yaml", "train.max_steps=2", "logging.num_completions_to_print=2",
              "logging.rollouts=true", f"logging.output_dir={tmp_path / 'run'}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    records = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    printed = out.stdout + out.stderr
    assert "step 1: 2 completions" in printed and "step 2: 2 completions" in printed
    first = records[0]["completion"].split("\n")[0][:20]
    assert first.strip() and first.strip() in printed


@pytest.mark.slow
def test_adafactor_trains_resumes_exactly_and_cannot_be_switched(tmp_path, model_cache):
    def train(out, *args):
        return cli("train", "recipes/ci-tiny.yaml", "train.optimizer=adafactor", "checkpoint.every_steps=2",
                   f"logging.output_dir={out}", *args, timeout=300)

    assert train(tmp_path / "a", "train.max_steps=4").returncode == 0
    assert train(tmp_path / "b", "train.max_steps=2").returncode == 0
    p = train(tmp_path / "b", "train.max_steps=4", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [stable(m) for m in a] == [stable(m) for m in b] and a[-1]["grad_norm"] > 0
    adamw = cli("train", "recipes/ci-tiny.yaml", "train.max_steps=4", "--resume", "auto", "--allow-recipe-change",
                f"logging.output_dir={tmp_path / 'b'}", "train.max_steps=6", timeout=300)
    assert adamw.returncode != 0 and "train.optimizer cannot change on resume (adafactor -> adamw)" in adamw.stderr


@pytest.mark.slow
def test_8bit_adamw(tmp_path, model_cache):
    pytest.importorskip("bitsandbytes")
    def train(out, *args):
        return cli("train", "recipes/ci-tiny.yaml", "train.optimizer=adamw_8bit", "checkpoint.every_steps=2",
                   f"logging.output_dir={out}", *args, timeout=300)

    out = train(tmp_path / "run", "train.max_steps=3")
    assert out.returncode == 0, out.stderr[-3000:]
    straight = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert straight[-1]["grad_norm"] > 0
    assert train(tmp_path / "resumed", "train.max_steps=2").returncode == 0  # its 8-bit state (shared maps) saved
    out = train(tmp_path / "resumed", "train.max_steps=3", "--resume", "auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")] == [stable(m) for m in straight]
    paged = cli("train", "recipes/ci-tiny.yaml", "train.optimizer=paged_adamw_8bit", "train.max_steps=1",
                f"logging.output_dir={tmp_path / 'paged'}", timeout=300)
    assert paged.returncode != 0 and "paged_adamw_8bit" in paged.stderr and "needs CUDA" in paged.stderr


def test_structured_outputs_regex_is_checked():
    # with importance sampling on, the grammar's mask would bias the ratio: test_unreplayed_settings_are_refused...
    Recipe.model_validate({**BASE, "rollout": {"backend": "vllm", "vllm": {"structured_outputs_regex": "[0-9]+"},
                                               "importance_sampling": "none"}})
    refused("rollout", {"vllm": {"structured_outputs_regex": "[0-9]+"}},
            "rollout.vllm.structured_outputs_regex needs rollout.backend vllm")
    refused("rollout", {"backend": "vllm", "vllm": {"structured_outputs_regex": "[0-9"}},
            "rollout.vllm.structured_outputs_regex: not a regular expression")


@pytest.mark.parametrize("rollout, named", [
    ({"backend": "vllm", "repetition_penalty": 1.1}, "rollout.repetition_penalty (1.1)"),
    ({"backend": "vllm", "vllm": {"mode": "server"}, "generation_kwargs": {"min_tokens": 2, "presence_penalty": 0.5}},
     "rollout.generation_kwargs.min_tokens, rollout.generation_kwargs.presence_penalty: shape the distribution"),
    ({"backend": "vllm", "vllm": {"structured_outputs_regex": "[0-9]+"}}, "rollout.vllm.structured_outputs_regex: shapes"),
    ({"dtype": "bfloat16", "generation_kwargs": {"no_repeat_ngram_size": 3}}, "rollout.generation_kwargs.no_repeat_ngram_size"),
])
def test_unreplayed_settings_are_refused_where_sampler_log_probs_correct_the_loss(rollout, named):
    """The trainer replays temperature and top-k / top-p / min-p; a setting it cannot replay, where the sampler's
    log-probs feed the importance ratio (vLLM, an hf sampling copy), is refused by name with the way out."""
    refused("rollout", rollout, named)
    refused("rollout", rollout, "set rollout.importance_sampling: none, or drop the setting")
    Recipe.model_validate({**BASE, "rollout": {**rollout, "importance_sampling": "none"}})  # no correction: allowed
    with pytest.raises(ValueError, match="off_policy_mask_threshold: null"):  # the off-policy mask reads them too
        Recipe.model_validate({**BASE, "rollout": {**rollout, "importance_sampling": "none"},
                               "algorithm": {"off_policy_mask_threshold": 0.5}})


def test_settings_the_trainer_replays_are_accepted_everywhere():
    for backend in ({"backend": "hf", "dtype": "bfloat16"}, {"backend": "vllm"}):
        Recipe.model_validate({**BASE, "rollout": {**backend, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
                                                   "temperature": 0.7}})
    # the hf backend sampling with the policy itself records no log-probs: nothing to bias
    Recipe.model_validate({**BASE, "rollout": {"repetition_penalty": 1.2, "generation_kwargs": {"min_new_tokens": 2}}})


def test_every_optimizer_is_one_spec_and_one_builder():
    # issue 36: optimizers are a table (recipe/specs.py: what each keeps, for the schema and the doctor) and a registry
    # of builders under the same names
    import typing

    from grpo_cli.recipe.specs import OPTIMIZERS
    from grpo_cli.recipe.schema import TrainConfig
    from grpo_cli.trainer.setup import OPTIMIZER_BUILDERS, build_optimizer

    assert set(OPTIMIZER_BUILDERS.names()) == set(OPTIMIZERS)
    assert set(typing.get_args(TrainConfig.model_fields["optimizer"].annotation)) == set(OPTIMIZERS)
    t = TrainConfig(max_steps=1, learning_rate=0.01)
    weights = [torch.nn.Parameter(torch.ones(3))]
    assert isinstance(build_optimizer(weights, t, fused=False), torch.optim.AdamW)
    with pytest.raises(SetupError, match="paged_adamw_8bit .* needs CUDA; on this device use another: adamw, "
                                         "adafactor, adamw_8bit"):
        build_optimizer(weights, TrainConfig(max_steps=1, optimizer="paged_adamw_8bit"), fused=False,
                        device=torch.device("cpu"))
