"""`grpo export CKPT --merge OUT`: a checkpoint as a plain Hugging Face model folder (grpo_cli/models/export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    checkpoint: Path = typer.Argument(..., help="A checkpoint folder (RUN/checkpoints/step-N) or a run folder (its newest).", show_default=False),
    merge: Path = typer.Option(..., "--merge", help="Output folder for the merged Hugging Face model.", show_default=False),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Save in this dtype: float32, bfloat16 or float16 (default: the recipe's model.dtype)."),
) -> None:
    """Write a checkpoint as a plain Hugging Face model, LoRA adapters merged into the base.

    Examples:

      grpo export runs/gsm8k/checkpoints/step-200 --merge models/gsm8k-merged

      grpo export runs/gsm8k --merge models/gsm8k-merged --dtype bfloat16
    """
    from grpo_cli.errors import UsageError
    from grpo_cli.models.export import DTYPES

    if dtype not in (None, *DTYPES):
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    from grpo_cli.models.export import export_checkpoint

    record = export_checkpoint(checkpoint, merge, dtype)
    what = "LoRA adapters merged into " + record["base_model"] if record["lora_merged"] else "full weights"
    typer.echo(f"wrote {merge} ({what}, {record['dtype']}); load it with AutoModelForCausalLM.from_pretrained")
