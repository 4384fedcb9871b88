"""The products of a decode step's few rows: torch's float32 product against grpo's kernel (grpo_cli/models/
few_rows.py, issue 40 item 2), first each alone over SmolLM2-135M's weights at 1-96 rows, then in a whole `generate`
beside the decoder layers fused around the kernel (grpo_cli/models/decode_layer.py).

bench/vs_trl.py's shape: SmolLM2-135M-Instruct loaded as `grpo train` loads it, float32, 2 prompts x 8 rows, 32 new
tokens, `--threads` threads; the three ways alternate (torch's products and the model's layers; the kernel's products
and the model's layers; the kernel's products in the fused layers, as `grpo train` samples), each seed drawn by all
(how many rows came out as torch's is printed: the sums are the same to float rounding, so a row can differ where a
draw falls on a rounding's edge), beside the weight-read floor of that generate on this machine (bench/floors.py).

    python bench/few_rows.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))


def best(fn, repeats: int = 5) -> float:
    fn()
    out = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def rows_table(model) -> None:
    """GB/s of every product weight of `model` read once, at each row count, torch's against the kernel's."""
    from grpo_cli.models import few_rows

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    total = sum(w.numel() * 4 for w in weights)
    print(f"{total / 1e9:.2f} GB of weights, each read once")
    print("| rows | torch GB/s | kernel GB/s | kernel / torch time |\n|---|---|---|---|")
    for rows in (1, 2, 4, 8, 16, 24, 32, 64, 96):
        xs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in weights}}
        t = best(lambda: [F.linear(xs[w.shape[1]], w) for w in weights])
        if rows in few_rows.FEW_ROWS:
            with few_rows.sampling():  # the kernel is a sampler's (as the hf backend's generate runs it)
                assert few_rows.linear(xs[weights[0].shape[1]], weights[0], None) is not None
                k = best(lambda: [few_rows.linear(xs[w.shape[1]], w, None) for w in weights])
            print(f"| {rows} | {total / t / 1e9:.1f} | {total / k / 1e9:.1f} | {k / t:.2f}x |")
        else:
            print(f"| {rows} | {total / t / 1e9:.1f} | (torch's: outside FEW_ROWS) | |")


def main() -> None:
    from decode_shape import alternating_generates, arguments, chat_rows, generate_floor
    from transformers import AutoTokenizer
    from vs_trl import SMOLLM2

    from grpo_cli.models import decode_layer, few_rows
    from grpo_cli.models.loading import load_model, resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig, RolloutConfig
    from grpo_cli.rollout.hf import HFGenerator

    a = arguments(__doc__)
    if few_rows.library() is None:
        sys.exit("the kernel is not available on this machine (no compiler, no AVX-512, or GRPO_CPU_KERNELS=off)")
    cfg = ModelConfig(**SMOLLM2)
    folder = resolve_model_source(cfg)
    model = load_model(cfg).eval()
    with torch.no_grad():
        rows_table(model)
    tok = AutoTokenizer.from_pretrained(folder)
    prompts, rows = chat_rows(tok)
    gen = HFGenerator(model, tok, RolloutConfig(max_completion_length=a.new_tokens, temperature=1.0))
    kernel_rows, fused = few_rows.FEW_ROWS, decode_layer.LAYERS

    def use(span: range, layers: set) -> None:
        few_rows.FEW_ROWS, decode_layer.LAYERS = span, layers

    sides = {"torch's products": partial(use, range(0), set()), "few_rows kernel": partial(use, kernel_rows, set()),
             "kernel + fused layers": partial(use, kernel_rows, fused)}
    times, rounds = alternating_generates(gen, rows, a.new_tokens, a.repeats, sides)
    use(kernel_rows, fused)
    same = [sum(torch.equal(x, y) for drawn in rounds for x, y in zip(drawn[0][0], drawn[k][0])) for k in (1, 2)]
    total = len(rows) * len(rounds)
    floor, machine, width = generate_floor(folder, prompts, a.new_tokens, a.threads)
    print(f"\nSmolLM2-135M-Instruct float32, 16 rows, {width:.0f} prompt + {a.new_tokens} new tokens, {a.threads} "
          f"threads; {machine.how}")
    print("| products | generate s (median) | each | / weight-read floor |\n|---|---|---|---|")
    for name, ts in times.items():
        g = statistics.median(ts)
        print(f"| {name} | {g:.3f} | {' '.join(f'{t:.2f}' for t in ts)} | {g / floor['seconds']:.2f}x |")
    t, kk, ff = (statistics.median(ts) for ts in times.values())
    print(f"floor: {floor['what']}; rows drawn as with torch's products: {same[0]} of {total} (kernel), {same[1]} of "
          f"{total} (fused layers)")
    print(f"few_rows kernel in fused layers: generate {ff:.3f} s against {t:.3f} s ({ff / t:.2f}x; the kernel alone "
          f"{kk:.3f} s, {kk / t:.2f}x), {ff / floor['seconds']:.2f}x its weight-read floor")


if __name__ == "__main__":
    main()
