"""train.packing against the padded layout, on a batch of mixed prompt and completion lengths (issue 38 item 4),
the batch padded as a rollout holds it (prompts to the longest on the left, completions to the longest on the right).

A random model of a real shape (bench/train_memory.py's), loaded as the trainer loads it (grpo's load_model:
grouped sdpa, the lean gated MLP). B prompts x G completions, lengths drawn as a GRPO batch has them: prompt
lengths uniform in [--prompt-min, --prompt-max]; completion lengths log-normal around --new-tokens / 4 (sigma 0.9),
cut at --new-tokens (those are the truncated ones). The phase is the update's forwards: every micro-batch's
policy forward + backward (the log-probs and entropy as the trainer takes them) and the reference's forward without a
gradient (beta > 0). Time: median of --repeat after a warm-up. Peak: above the weights and their gradients; on a GPU
the allocator's peak, on the CPU the peak of live tensors (tests/tensor_peak.py, in a pass of its own).

    python bench/packing.py                                              # CPU, vocab32k shape
    python bench/packing.py --shape qwen2.5-0.5b --device cuda --dtype bfloat16 --prompt-max 512 --new-tokens 1024
    python bench/packing.py --check --device cuda    # packed = padded on this device (tests/algo/test_packing.py's)
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
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests"), str(BENCH.parent / "tests/algo")]


def lengths(args, g: torch.Generator) -> tuple[list[int], list[int]]:
    prompts = torch.randint(args.prompt_min, args.prompt_max + 1, (args.B,), generator=g).tolist()
    median = args.new_tokens / 4
    drawn = torch.exp(torch.randn(args.B * args.G, generator=g) * 0.9 + torch.log(torch.tensor(median)))
    return prompts, drawn.round().clamp(1, args.new_tokens).long().tolist()


def check(device: torch.device) -> None:
    """tests/algo/test_packing.py's comparison on `device` in float32 (CUDA's attention kernels and the folded
    grouped mask there): the LM head plain and in chunks; with flash attention installed, its one-bin varlen path in
    bfloat16 against sdpa's padded one too."""
    import importlib.util

    from test_packing import HEAD_CHUNKED, assert_same, mixed, run

    from grpo_cli.algo import logprobs as logprobs_module
    from grpo_cli.models.attention import use_grouped_sdpa
    from helpers import tiny_lm

    args = [t.to(device) for t in mixed()]
    for chunked in (False, True):
        logprobs_module.HEAD_CHUNKED = set(HEAD_CHUNKED) if chunked else set()
        for kind, grouped in (("qwen2", False), ("qwen2", True), ("llama", True)):
            model = tiny_lm(kind).to(device)
            if grouped:  # as the trainer loads it (grpo_cli/models/attention.py: CUDA folds the mask)
                assert use_grouped_sdpa(model)
            padded, packed = run(model, args, False, with_entropy=True), run(model, args, True, with_entropy=True)
            assert_same(padded, packed)
            worst = max((padded[2][n] - packed[2][n]).abs().max().item() for n in padded[2])
            print(f"{device} float32 {kind} {model.config._attn_implementation}, head {'in chunks' if chunked else 'plain'}: max |logp difference| "
                  f"{(padded[0] - packed[0]).abs().max().item():.2e}, max |gradient difference| {worst:.2e}; "
                  f"tokens run {padded[3]} padded, {packed[3]} packed")
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        model = tiny_lm("qwen2").to(device, torch.bfloat16)
        padded = run(model, args, False, with_entropy=True)
        model.set_attn_implementation("flash_attention_2")
        packed = run(model, args, True, with_entropy=True)
        print(f"bfloat16 flash_attention_2 one bin ({packed[3]} tokens) against sdpa padded: max |logp difference| "
              f"{(padded[0] - packed[0]).abs().max().item():.2e}")
    else:
        print("flash_attn is not installed here: the one-bin varlen path is not run")
    print("packed = padded: checked")


def main() -> None:
    from train_memory import SHAPES, build_model

    if "--check" in sys.argv:
        sys.argv.remove("--check")
        ap = argparse.ArgumentParser()
        ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        check(torch.device(ap.parse_args().device))
        return

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="vocab32k")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--beta", type=float, default=0.04, help="> 0: the reference's forward too")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from grpo_cli.algo.logprobs import token_logprobs
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(args.shape, Path(tmp) / "m")
        model = load_model(ModelConfig(name_or_path=str(Path(tmp) / "m"), dtype=args.dtype), device=device)
        reference = load_model(ModelConfig(name_or_path=str(Path(tmp) / "m"), dtype=args.dtype), device=device) \
            if args.beta > 0 else None
    if reference is not None:
        reference.eval().requires_grad_(False)
    model.train()
    for p in model.parameters():  # the step's gradients exist already (as after the first step)
        p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(0)
    V, N, P, T = model.config.vocab_size, args.B * args.G, args.prompt_max, args.new_tokens
    prompt_lens, completion_lens = lengths(args, g)
    ids = torch.zeros(args.B, P, dtype=torch.long)
    mask = torch.zeros(args.B, P, dtype=torch.long)
    for i, n in enumerate(prompt_lens):  # left padded
        ids[i, P - n:], mask[i, P - n:] = torch.randint(3, min(V, 700), (n,), generator=g), 1
    ids, mask = ids.repeat_interleave(args.G, 0).to(device), mask.repeat_interleave(args.G, 0).to(device)
    completions = torch.randint(3, min(V, 700), (N, T), generator=g)
    cmask = (torch.arange(T)[None] < torch.tensor(completion_lens)[:, None]).long()
    completions, cmask = (completions * cmask).to(device), cmask.to(device)
    # as a rollout holds them: prompts left-padded to the batch's longest, completions right-padded to its longest
    ids, mask = ids[:, P - max(prompt_lens):], mask[:, P - max(prompt_lens):]
    completions, cmask = completions[:, :max(completion_lens)], cmask[:, :max(completion_lens)]
    micro = [slice(s, s + args.micro_batch) for s in range(0, N, args.micro_batch)]

    # what each layout runs: the padded one every row at the batch's longest prompt + longest completion
    real = int(mask.sum() + cmask.sum())
    padded_tokens = ids.numel() + completions.numel()

    def update(packing: bool, shared: bool):
        def run():
            for sl in micro:
                if reference is not None:
                    with torch.no_grad():
                        token_logprobs(reference, ids[sl], mask[sl], completions[sl], cmask[sl], packing=packing,
                                       shared_prompts=shared, chunked_head=device.type == "cuda")
                lp, _ = token_logprobs(model, ids[sl], mask[sl], completions[sl], cmask[sl], with_entropy=True,
                                       packing=packing, shared_prompts=shared, chunked_head=device.type == "cuda")
                (-(lp * cmask[sl]).sum() / cmask.sum()).backward()
        return run

    def timed(fn) -> float:
        times = []
        for _ in range(args.repeat + 1):  # the first warms up kernels and the allocator
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def peak(fn) -> float:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            fn()
            return (torch.cuda.max_memory_allocated(device) - base) / 2**30
        from tensor_peak import TensorPeak

        with TensorPeak() as p:
            base = p.base
            fn()
        return (p.peak - base) / 2**30

    from grpo_cli.algo.packing import first_fit

    bins = 0
    for sl in micro:
        rows = (mask[sl].sum(1) + cmask[sl].sum(1)).tolist()
        bins += (max(b for b, _ in first_fit(rows, max(rows))) + 1) * max(rows)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"{args.shape} ({params:.0f}M parameters), {args.dtype} on {name}; B={args.B} x G={args.G}, prompts "
          f"{min(prompt_lens)}-{max(prompt_lens)} tokens, completions {min(completion_lens)}-{max(completion_lens)} "
          f"(median {statistics.median(completion_lens):.0f}, {sum(c == T for c in completion_lens)} cut at {T}), "
          f"micro-batch {args.micro_batch}, beta {args.beta}; median of {args.repeat}")
    print(f"real tokens {real}; the padded layout runs {padded_tokens} (padding {1 - real / padded_tokens:.0%}), "
          f"packed bins {bins} ({1 - real / bins:.0%})")
    layouts = {"padded, whole rows": (False, False), "packed": (True, False)}
    if device.type == "cpu":  # the CPU's default: a group's prompt once
        layouts = {"padded, a group's prompt once (CPU default)": (False, True), **layouts}
    print("| layout | update forwards s | peak above weights + grads GiB |\n|---|---|---|")
    rows = {}
    for label, (packing, shared) in layouts.items():
        rows[label] = timed(update(packing, shared)), peak(update(packing, shared))
        print(f"| {label} | {rows[label][0]:.3f} | {rows[label][1]:.3f} |", flush=True)
    a, b = rows["packed"], rows["padded, whole rows"]
    print(f"packed / padded (whole rows): time {a[0] / b[0]:.2f}x, peak {a[1] / b[1]:.2f}x, "
          f"tokens run {bins / padded_tokens:.2f}x")


if __name__ == "__main__":
    main()
