"""What bench/sampling_draw.py, bench/decode_cache.py and bench/few_rows.py share: bench/vs_trl.py's decoding shape
(SmolLM2-135M-Instruct, 2 chat prompts x 8 rows), their command line, generates alternating between two ways of
decoding, and that generate's floor on this machine (bench/floors.py)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def arguments(doc: str) -> argparse.Namespace:
    """--repeats, --threads (set for torch here) and --new-tokens; the C allocator set as `grpo train` sets it on a
    CPU (train.keep_freed_memory: freed blocks kept for reuse; without it a generate here took 21-40 k page faults,
    each step's logits and the draw's temporaries mapped anew)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from grpo_cli.process.allocator import keep_freed_memory

    keep_freed_memory(True, "cpu", True)
    return a


def chat_rows(tok) -> tuple[list[list[int]], list[list[int]]]:
    """The two prompts' token ids, and the 16 rows generate samples (each prompt 8 times)."""
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {x} + {y}?"}], add_generation_prompt=True)
               for x, y in ((17, 25), (8, 34))]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    return prompts, [p for p in prompts for _ in range(8)]


def alternating_generates(gen, rows: list[list[int]], new_tokens: int, repeats: int, sides: dict):
    """`gen`'s generate of `rows` once a side in each of repeats + 1 rounds, the sides alternating (`sides`: name -> a
    function that puts that side in place), seed k in round k for every side, round 0 untimed (it warms up) ->
    ({name: [seconds]}, one [(ids, mask) of each side] a round)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    rounds = []
    for k in range(repeats + 1):
        drawn = []
        for name, use in sides.items():
            use()
            torch.manual_seed(k)
            t0 = time.perf_counter()
            ids, mask, _, _ = gen._run(rows, max_new_tokens=new_tokens)
            if k:
                times[name].append(time.perf_counter() - t0)
            drawn.append((ids, mask))
        rounds.append(drawn)
    return times, rounds


def generate_floor(folder: str, prompts: list[list[int]], new_tokens: int, threads: int):
    """-> (floors.sampling_floor's dict, the machine measured, the mean prompt width) for 16 rows of `prompts`."""
    from floors import Shape, measure, micro_batch_matmul, sampling_floor

    shape = Shape.of(folder)
    width = statistics.fmean(len(p) for p in prompts)
    machine = measure("cpu", "float32", 16, micro_batch_matmul(shape, 8, width + new_tokens), threads=threads)
    return sampling_floor(shape, machine, "float32", 2, 16, width, new_tokens), machine, width
