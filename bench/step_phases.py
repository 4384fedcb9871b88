"""Where a training step's time and peak memory go: sampling and the training forward/backward, each alone.

A random model of a real shape (bench/train_memory.py's), B prompts x G completions of exactly --new-tokens
tokens. Each phase starts from the same memory (weights and gradients allocated), resets the allocator's peak
and reports its own peak above that, and its median time over --repeat runs:

  generate, shared prefill      HFGenerator's path: each distinct prompt prefilled once, then `generate`
  generate, plain               `generate` on the B*G rows
  train fwd+bwd, shared prompt  grpo's token_logprobs (a group's prompt runs once), micro-batch by micro-batch
  train fwd+bwd, whole rows     the same, every row's prompt run (as TRL does)

    python bench/step_phases.py --shape tiny --device cpu               # seconds, to try the script
    python bench/step_phases.py --device cuda --dtype bfloat16 --new-tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_since_reset(device: torch.device, base: int) -> float:
    if device.type != "cuda":
        return float("nan")  # RSS has no reset: measure on a GPU
    return (torch.cuda.max_memory_allocated(device) - base) / 2**30


def measure(fn, device: torch.device, repeat: int) -> tuple[float, float]:
    """-> (median seconds, peak GiB above what was allocated before) of fn()."""
    times, peaks = [], []
    for _ in range(repeat + 1):  # the first run warms up kernels and the allocator
        sync(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        peaks.append(peak_since_reset(device, base) if device.type == "cuda" else float("nan"))
    return statistics.median(times[1:]), max(peaks)


def step_parser(doc: str, shapes, prompt_tokens: int, new_tokens: int) -> argparse.ArgumentParser:
    """The arguments of a step's shape: the model's, the device's, B x G rows of prompt + new tokens, micro-batches."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=shapes, default="qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=prompt_tokens)
    ap.add_argument("--new-tokens", type=int, default=new_tokens)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    return ap


def main() -> None:
    from train_memory import SHAPES, build_model

    args = step_parser(__doc__, SHAPES, prompt_tokens=30, new_tokens=64).parse_args()

    from transformers import AutoModelForCausalLM

    from grpo_cli.algo.logprobs import token_logprobs
    from grpo_cli.rollout.hf import shared_prefill

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(args.shape, Path(tmp) / "m")
        model = AutoModelForCausalLM.from_pretrained(Path(tmp) / "m", dtype=dtype).to(device)
    model.config.use_cache = True
    for p in model.parameters():  # the step's gradients exist already (as after the first step)
        p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(0)
    V, N = model.config.vocab_size, args.B * args.G
    prompts = torch.randint(3, min(V, 700), (args.B, args.prompt_tokens), generator=g)
    ids = prompts.repeat_interleave(args.G, dim=0).to(device)  # a group's G rows in a row
    mask = torch.ones_like(ids)
    completions = torch.randint(3, min(V, 700), (N, args.new_tokens), generator=g).to(device)
    cmask = torch.ones_like(completions)

    def generate(shared: bool):
        def run():
            model.eval()
            with torch.no_grad():
                cache = shared_prefill(model, ids, mask) if shared else None
                model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, do_sample=True, top_k=0,
                               max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)
            model.train()
        return run

    def train(shared: bool):
        def run():
            for s in range(0, N, args.micro_batch):
                sl = slice(s, s + args.micro_batch)
                lp, _ = token_logprobs(model, ids[sl], mask[sl], completions[sl], cmask[sl], with_entropy=True,
                                       shared_prompts=shared)
                (-(lp * cmask[sl]).sum() / cmask.sum()).backward()
        return run

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.shape} ({params:.0f}M parameters), {args.dtype} on {name}; B={args.B} x G={args.G}, "
          f"{args.prompt_tokens} prompt + {args.new_tokens} new tokens, micro-batch {args.micro_batch}; "
          f"median of {args.repeat}; static (weights + grads) "
          f"{torch.cuda.memory_allocated(device) / 2**30 if device.type == 'cuda' else float('nan'):.2f} GiB")
    print("| phase | s | peak above static GiB |\n|---|---|---|")
    rows = {}
    for label, fn in (("generate, shared prefill", generate(True)), ("generate, plain", generate(False)),
                      ("train fwd+bwd, shared prompt", train(True)), ("train fwd+bwd, whole rows", train(False))):
        rows[label] = measure(fn, device, args.repeat)
        print(f"| {label} | {rows[label][0]:.3f} | {rows[label][1]:.2f} |", flush=True)
    a, b = rows["train fwd+bwd, shared prompt"], rows["train fwd+bwd, whole rows"]
    print(f"train fwd+bwd shared/whole rows: time {a[0] / b[0]:.2f}x, peak {a[1] / b[1] if b[1] else float('nan'):.2f}x")


if __name__ == "__main__":
    main()
