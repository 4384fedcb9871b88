"""Models made on this machine, cached under `cache_dir()` ($GRPO_CACHE_DIR or ~/.cache/grpo):

  builtin:tiny-qwen2 / builtin:tiny-llama   a tiny random model + byte-level BPE tokenizer, built offline once
                                            (deterministic, ~1 s); for tests
  a GGUF checkpoint (model.gguf_file)       dequantized once by transformers into a plain HF folder

A cache folder is written to a temporary folder that is renamed into place, so one that exists is complete.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import logging
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from grpo_cli.errors import ModelLoadError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 in the builtin tokenizer
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Bump the suffix whenever the builtin recipe changes, so stale caches are never reused.
# v2: 2 attention heads of size 32 (vLLM's CPU attention needs head sizes >= 32); weights as in v1
BUILTIN_MODELS = {"tiny-qwen2": "tiny-qwen2-v2", "tiny-llama": "tiny-llama-v2"}


def cache_dir() -> Path:
    """Root of grpo's caches: $GRPO_CACHE_DIR, else ~/.cache/grpo."""
    env = os.environ.get("GRPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grpo"


def builtin_model(kind: str) -> Path:
    if kind not in BUILTIN_MODELS:
        raise ModelLoadError(f"unknown builtin model {kind!r}; valid: {', '.join('builtin:' + k for k in BUILTIN_MODELS)}")
    target = cache_dir() / "models" / BUILTIN_MODELS[kind]
    return cached_folder(target, lambda tmp: build_tiny(kind, tmp))


def converted_gguf(source: str, gguf_file: str, revision: str | None) -> Path:
    """Dequantize a GGUF checkpoint once into a cached fp32 HF folder, keyed by the file's path, size and mtime."""
    gguf_path = Path(source).expanduser() / gguf_file
    if not Path(source).expanduser().is_dir():  # a hub repo id: fetch (or find in the hub cache) the one file
        try:
            from huggingface_hub import hf_hub_download

            gguf_path = Path(hf_hub_download(source, gguf_file, revision=revision))
        except Exception as e:
            raise ModelLoadError(load_failure_text(source, f"GGUF file {gguf_file!r}", e)) from e
    if not gguf_path.is_file():
        listed = sorted(p.name for p in gguf_path.parent.glob("*.gguf")) if gguf_path.parent.is_dir() else []
        raise ModelLoadError(
            f"could not load model {source!r}: GGUF file {gguf_path} not found; .gguf files there: {listed or 'none'}"
        )
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{gguf_path.stem}-{key}"
    return cached_folder(target, lambda tmp: dequantize_gguf(gguf_path, tmp))


def cached_folder(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it first if needed: build into a temp sibling, then rename (atomic)."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        if not (tmp / "config.json").is_file():
            raise ModelLoadError(f"building the cached model {target.name} wrote no config.json; nothing was cached")
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # lost a race only if the winner's folder is there
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def dequantize_gguf(gguf_path: Path, out: Path) -> None:
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a cached HF model (once, ~30 s)", gguf_path.name)
    t0 = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        with _gguf_bar_on_terminals_only():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise ModelLoadError(load_failure_text(str(gguf_path), "GGUF model", e, str(gguf_path.parent))) from e
    # save_pretrained refuses a model loaded from GGUF ("quantized with gguf") although its weights are
    # plain dequantized floats: rebuild a normal model from the config minus quantization_config.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=gguf_model.dtype)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if unexpected or [k for k in missing if k not in _tied_keys(model)]:
        raise ModelLoadError(
            f"converting {gguf_path.name}: the weights do not fit the config (missing {missing}, unexpected {unexpected})"
        )
    model.generation_config = gguf_model.generation_config
    _save_on_this_node(model, out)
    tokenizer.save_pretrained(out)
    log.info("converted %s in %.0f s -> %s", gguf_path.name, time.perf_counter() - t0, out.parent)


@contextlib.contextmanager
def _gguf_bar_on_terminals_only():
    """transformers' GGUF reader draws its own tqdm bar (its progress-bar switch does not reach it): in a log file it
    is one long line of carriage returns, and the INFO lines around it already say what happens."""
    import transformers.modeling_gguf_pytorch_utils as reader

    bar = reader.tqdm
    if not sys.stderr.isatty():
        reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def _tied_keys(model: Any) -> set[str]:
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()


# ---------------------------------------------------------------- builtin tiny models


def tiny_corpus(n: int = 4000) -> list[str]:
    """Arithmetic-ish English lines (plus the chat roles) so BPE merges fit the test tasks."""
    rng = random.Random(0)
    names = ["Ann", "Bob", "Carla", "Dev", "Emma", "Femi", "Gus", "Hana"]
    things = ["apples", "books", "coins", "marbles", "pencils", "stickers"]
    lines = []
    for _ in range(n):
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
        r = a + b if op == "+" else a - b if op == "-" else a * b
        who, what = rng.choice(names), rng.choice(things)
        lines.append(
            rng.choice(
                [
                    f"What is {a} {op} {b}? The answer is {r}.",
                    f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now? {a + b}",
                    f"<think>{a} {op} {b} = {r}</think> <answer>{r}</answer>",
                    f"system\nYou are a helpful assistant.\nuser\nCompute {a} {op} {b}.\nassistant\nThe result is {r}.",
                    f"Let's solve this step by step: first {a}, then {op} {b}, so the final answer is \\boxed{{{r}}}",
                ]
            )
        )
    return lines


def build_tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE: every byte is in the initial alphabet, so any text round-trips and nothing is UNK.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=768,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        model_max_length=1024,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny(kind: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    tok = build_tiny_tokenizer()
    ids = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.pad_token_id}
    dims = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, **ids,
    )  # fmt: skip
    if kind == "tiny-qwen2":
        config = Qwen2Config(tie_word_embeddings=True, **dims)
    else:
        config = LlamaConfig(tie_word_embeddings=False, **dims)
    state = torch.random.get_rng_state()
    torch.manual_seed(0)  # identical weights on every machine (CPU init)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(**ids)
    _save_on_this_node(model, out)
    tok.save_pretrained(out)


def _save_on_this_node(model, out: Path) -> None:
    """save_pretrained, also on a node's main process: with torch.distributed up, transformers writes only on
    global rank 0, but a cache may be per node (the main process of each fills its own)."""
    model.should_save_on_this_rank = lambda is_main_process: True
    model.save_pretrained(out)


def load_failure_text(name: str, what: str, err: Exception, source: str | None = None) -> str:
    """"could not load model 'X' (what): cause; what to change" -- `source` is what was handed to from_pretrained."""
    first = (str(err).strip().splitlines() or [""])[0]
    cause = f"{type(err).__name__}: {first}" if first else type(err).__name__
    if source is not None and Path(source).expanduser().is_dir():
        return (
            f"could not load model {name!r} ({what}) from folder {source}: {cause}; the folder needs config.json, "
            "weights and tokenizer files as written by save_pretrained; set model.name_or_path to such a folder, "
            "or to a hub id, `pkg:<package>` with model.gguf_file, or builtin:tiny-qwen2"
        )
    offline = " (HF_HUB_OFFLINE is set and it is not in the local hub cache)" if os.environ.get("HF_HUB_OFFLINE") else ""
    return (
        f"could not load model {name!r} ({what}): {cause}{offline}; set model.name_or_path to a local folder "
        "with config.json, a cached hub id, `pkg:<package>` with model.gguf_file, or builtin:tiny-qwen2"
    )
