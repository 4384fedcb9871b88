"""The key/value cache `generate` decodes into on the hf backend: transformers' dynamic cache (grown by a copy of
every layer's cache at every step) against grpo's preallocated one (grpo_cli/rollout/preallocated.py, made once at
its full length, written in place), issue 40 item 2.

bench/vs_trl.py's shape: SmolLM2-135M-Instruct loaded as `grpo train` loads it (its grouped-query attention), float32,
2 prompts x 8 rows, 32 new tokens, `--threads` threads; the two caches alternate, each seed drawn by both (the
tokens are compared), beside the weight-read floor of that generate on this machine (bench/floors.py).

    python bench/decode_cache.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from decode_shape import alternating_generates, arguments, chat_rows, generate_floor
    from transformers import AutoTokenizer
    from vs_trl import SMOLLM2

    import grpo_cli.rollout.preallocated as preallocated
    from grpo_cli.models.loading import load_model, resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig, RolloutConfig
    from grpo_cli.rollout.hf import HFGenerator

    a = arguments(__doc__)
    cfg = ModelConfig(**SMOLLM2)
    folder = resolve_model_source(cfg)
    model = load_model(cfg).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    prompts, rows = chat_rows(tok)
    gen = HFGenerator(model, tok, RolloutConfig(max_completion_length=a.new_tokens, temperature=1.0))
    made = preallocated.preallocated
    caches = {"dynamic (transformers')": lambda cache, model, capacity: cache, "preallocated (grpo's)": made}
    sides = {name: partial(setattr, preallocated, "preallocated", fn) for name, fn in caches.items()}
    times, rounds = alternating_generates(gen, rows, a.new_tokens, a.repeats, sides)
    preallocated.preallocated = made
    same = all(torch.equal(dynamic[0], mine[0]) for dynamic, mine in rounds)
    tokens = [float(mask.sum(1).float().mean()) for drawn in rounds for _, mask in drawn]
    floor, machine, width = generate_floor(folder, prompts, a.new_tokens, a.threads)
    print(f"SmolLM2-135M-Instruct float32 (grpo's attention: {model.config._attn_implementation}), 16 rows, {width:.0f} "
          f"prompt + {a.new_tokens} new tokens (mean {statistics.fmean(tokens):.1f} drawn), {a.threads} threads; "
          f"{machine.how}")
    print("| cache | generate s (median) | each | / weight-read floor | / floor at the products' rate |\n|---|---|---|---|---|")
    for name, ts in times.items():
        g = statistics.median(ts)
        print(f"| {name} | {g:.3f} | {' '.join(f'{t:.2f}' for t in ts)} | {g / floor['seconds']:.2f}x | "
              f"{g / floor['at_products_s']:.2f}x |")
    print(f"floor: {floor['what']}; the same tokens from both caches for every seed: {'yes' if same else 'NO'}")
    d, p = (statistics.median(ts) for ts in times.values())
    print(f"preallocated cache: generate {p:.3f} s against {d:.3f} s ({p / d:.2f}x), {p / floor['seconds']:.2f}x its "
          f"weight-read floor")


if __name__ == "__main__":
    main()
