"""Step time and peak memory of `grpo train` on a random model of a real shape: full, full + KL, LoRA + KL.

Each mode is a real `grpo train` subprocess (ci-tiny recipe, the model swapped for a random one of the
chosen shape, no download). Peak memory is the trainer's own `memory/peak_gib` metric: CUDA allocator
peak on a GPU, peak RSS on the CPU. Step time is the mean `time/step` after the first step.

    python bench/train_memory.py                          # Qwen2.5-0.5B shape, fp32, on this machine
    python bench/train_memory.py --mixed-precision bf16 --dtype bfloat16   # the GPU check
    python bench/train_memory.py --shape tiny --steps 4   # seconds, to try the script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # Qwen2.5-0.5B's config.json (vocab 151936, tied embeddings: 494M parameters); tiny: seconds
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    # bench/doctor_memory.py's: a real vocabulary on few layers (the logits are most of a step's transients); head
    # size 32, which vLLM's CPU attention takes
    "vocab32k": dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny": dict(vocab_size=768, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True),
}
MODES = {
    "full, beta=0": ["algorithm.beta=0"],
    "full, beta=0.04 (reference copy)": ["algorithm.beta=0.04"],
    "LoRA r=16, beta=0.04": ["model.lora.r=16", "algorithm.beta=0.04"],
}


def build_model(shape: str, folder: Path) -> float:
    """A random Qwen2 of `shape` with the builtin byte-level tokenizer (its ids fit any vocab); -> params (M)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    tok = AutoTokenizer.from_pretrained(resolve_model_source(ModelConfig(name_or_path="builtin:tiny-qwen2")))
    config = Qwen2Config(**SHAPES[shape], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         max_position_embeddings=2048)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters()) / 1e6


def run_mode(folder: Path, out: Path, overrides: list[str], args) -> dict:
    cmd = [sys.executable, "-m", "grpo_cli", "train", str(ROOT / "recipes/ci-tiny.yaml"), "-o", str(out),
           f"model.name_or_path={folder}", f"model.dtype={args.dtype}", f"train.mixed_precision={args.mixed_precision}",
           f"train.max_steps={args.steps}", "checkpoint.every_steps=0", "logging.rollouts=false",
           f"rollout.max_completion_length={args.new_tokens}", f"train.threads={args.threads}", *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = metrics[1:] or metrics
    return {"step_s": sum(m["time/step"] for m in later) / len(later), "train_s": sum(m["time/train"] for m in later) / len(later),
            "peak_gib": max(m["memory/peak_gib"] for m in metrics)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    os.environ.setdefault("GRPO_CACHE_DIR", str(Path(tempfile.gettempdir()) / "grpo-bench-cache"))
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        folder = Path(tmp) / "model"
        params = build_model(args.shape, folder)
        print(f"{args.shape}: {params:.1f}M parameters, dtype {args.dtype}, mixed_precision {args.mixed_precision}, "
              f"B=2 x G=4, {args.new_tokens} new tokens, {args.steps} steps")
        print("| mode | s/step | train s/step | peak GiB |\n|---|---|---|---|")
        rows = {}
        for i, (name, overrides) in enumerate(MODES.items()):
            rows[name] = r = run_mode(folder, Path(tmp) / f"run{i}", overrides, args)
            print(f"| {name} | {r['step_s']:.2f} | {r['train_s']:.2f} | {r['peak_gib']:.2f} |", flush=True)
    full, lora = rows["full, beta=0.04 (reference copy)"], rows["LoRA r=16, beta=0.04"]
    print(f"peak memory, full + KL / LoRA + KL: {full['peak_gib']:.2f} / {lora['peak_gib']:.2f} GiB = "
          f"{full['peak_gib'] / lora['peak_gib']:.2f}x")


if __name__ == "__main__":
    main()
