"""`grpo export CKPT --merge OUT`: a checkpoint (LoRA adapter or full weights) -> a plain Hugging Face model folder.

The output loads with `AutoModelForCausalLM.from_pretrained(OUT)` (and vLLM) with no grpo and no peft:
LoRA adapters are merged into the base (W + scale * B @ A; a QLoRA base is loaded unquantized for this),
optimizer and RNG state are left behind, the tokenizer and the recipe come along.
"""

from __future__ import annotations

import json
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")  # what a model is saved in


def export_checkpoint(checkpoint: Path, out: Path, dtype: str | None = None) -> dict:
    """Write the merged model to `out` (must not exist or be empty); returns what export.json records."""
    import shutil

    import torch

    from grpo_cli.errors import UsageError
    from grpo_cli.models.loading import load_model, load_tokenizer, quiet_libraries
    from grpo_cli.models.lora import is_adapter_checkpoint, load_adapter_model
    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.run.checkpoint_io import make_readable
    from grpo_cli.run.checkpoints import is_checkpoint, newest_if_run_folder, recipe_path, verify_checkpoint

    quiet_libraries()
    checkpoint = newest_if_run_folder(checkpoint)
    if not is_checkpoint(checkpoint):
        raise UsageError(f"{checkpoint} is not a checkpoint written by `grpo train` (no trainer/ state folder)")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty; choose a new folder")
    verify_checkpoint(checkpoint)
    recipe = load_recipe(recipe_path(checkpoint))
    base = recipe.model.model_copy(update={"load_in_4bit": False, "gradient_checkpointing": False,
                                           **({"dtype": dtype} if dtype else {})})
    adapter = is_adapter_checkpoint(checkpoint)
    if adapter:
        model = load_adapter_model(checkpoint, base, trainable=False).merge_and_unload()
    else:
        cfg = base.model_copy(update={"name_or_path": str(checkpoint.resolve()), "gguf_file": None, "revision": None})
        model = load_model(cfg)
    if dtype:
        model.to(getattr(torch, dtype))
    tokenizer = load_tokenizer(recipe.model.model_copy(update={"name_or_path": str(checkpoint.resolve()),
                                                               "gguf_file": None, "revision": None}))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    shutil.copy(recipe_path(checkpoint), out / "recipe.yaml")
    record = {"checkpoint": str(checkpoint.resolve()), "lora_merged": adapter,
              "base_model": recipe.model.name_or_path, "dtype": str(model.dtype).removeprefix("torch.")}
    (out / "export.json").write_text(json.dumps(record, indent=1))
    make_readable(out)
    return record
