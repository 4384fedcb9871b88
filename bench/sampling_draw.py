"""The draw of the next token: torch.multinomial against grpo's inverse-CDF draw (issue 40 item 2), alone and in a
whole `generate`, beside the weight-read floor of that generate on this machine (bench/floors.py).

    multinomial   what transformers' sampling does: softmax, then one exponential per vocabulary entry and row
    inverse CDF   grpo_cli/algo/sampling.py's InverseCDFDraw: softmax, the running sum, one uniform per row

The generate is bench/vs_trl.py's shape: SmolLM2-135M-Instruct in float32, 2 prompts x 8 rows, 32 new tokens (every
row made to run all 32: min_new_tokens), `--threads` threads, the two draws alternating, each repeated.

    python bench/sampling_draw.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def time_draws(rows: int, vocab: int, repeats: int) -> dict[str, float]:
    from grpo_cli.algo.sampling import InverseCDFDraw

    scores = torch.randn(rows, vocab)
    ids = torch.zeros(rows, 1, dtype=torch.long)
    draws = {"multinomial": lambda: torch.multinomial(torch.softmax(scores, -1), 1),
             "inverse CDF": lambda: InverseCDFDraw(1.0)(ids, scores).argmax(-1)}
    out = {}
    for name, fn in draws.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    from decode_shape import arguments, chat_rows, generate_floor
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vs_trl import SMOLLM2

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig, RolloutConfig
    from grpo_cli.rollout.hf import HFGenerator

    a = arguments(__doc__)
    folder = resolve_model_source(ModelConfig(**SMOLLM2))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    prompts, rows = chat_rows(tok)
    gen = HFGenerator(model, tok, RolloutConfig(max_completion_length=a.new_tokens, temperature=1.0))
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(a.repeats + 1):
        for inverse in (False, True):
            gen.inverse_cdf = inverse
            torch.manual_seed(k)
            t0 = time.perf_counter()
            gen._run(rows, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)
            if k:  # the first round warms up
                times[inverse].append(time.perf_counter() - t0)
    draws = time_draws(16, model.config.vocab_size, 20)
    floor, machine, width = generate_floor(folder, prompts, a.new_tokens, a.threads)
    print(f"SmolLM2-135M-Instruct float32, 16 rows, {width:.0f} prompt + {a.new_tokens} new tokens, "
          f"{a.threads} threads; {machine.how}")
    print("| draw | one draw over 16 x 49,152 (ms) | generate s (median) | generate / weight-read floor | "
          "/ floor at the products' rate |\n|---|---|---|---|---|")
    for inverse, name in ((False, "multinomial"), (True, "inverse CDF")):
        g = statistics.median(times[inverse])
        print(f"| {name} | {draws[name] * 1e3:.2f} | {g:.3f} ({' '.join(f'{t:.2f}' for t in times[inverse])}) | "
              f"{g / floor['seconds']:.2f}x | {g / floor['at_products_s']:.2f}x |")
    print(f"floor: {floor['what']}")
    m, i = statistics.median(times[False]), statistics.median(times[True])
    print(f"inverse-CDF draw: generate {i:.3f} s against {m:.3f} s ({i / m:.2f}x), {i / floor['seconds']:.2f}x its "
          f"weight-read floor")


if __name__ == "__main__":
    main()
