"""Decoding and a training forward + backward with transformers' `sdpa` against grpo's `sdpa_grouped`
(grpo_cli/models/attention.py: grouped-query attention with a mask, without repeated keys and values).

A batch of left-padded prompts (a GRPO step's rows: B prompts x G copies), sampled with the same seed under both
implementations, alternating; then one training forward + backward of the same rows through grpo's log-prob
path. Prints a table (median seconds, tokens equal) and ends with one line: sdpa_grouped's time over sdpa's.

  python bench/attention_decode.py [--model smollm2|qwen2.5-0.5b] [--device cpu|cuda] [--dtype float32|bfloat16]
                                   [--rows 16] [--prompt 64] [--new-tokens 64] [--repeats 3]
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


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="smollm2 (real weights) or a random shape: qwen2.5-0.5b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, default=16, help="B x G rows; groups of 8 share a prompt")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from vs_trl import model_folder

    from grpo_cli.algo.logprobs import token_logprobs
    from grpo_cli.models.loading import load_model
    from grpo_cli.recipe.schema import ModelConfig

    folder = model_folder(a.model, Path(tempfile.mkdtemp()))
    models = {impl: load_model(ModelConfig(name_or_path=str(folder), dtype=a.dtype, attn_implementation=impl),
                               device=a.device) for impl in ("sdpa", None)}
    name = {impl: m.config._attn_implementation for impl, m in models.items()}
    cfg = models["sdpa"].config
    g = torch.Generator().manual_seed(0)
    groups = max(1, a.rows // 8)
    ids = torch.randint(3, cfg.vocab_size, (groups, a.prompt), generator=g).repeat_interleave(a.rows // groups, 0)
    mask = torch.ones_like(ids)
    mask[: a.rows // groups, : a.prompt // 4] = 0  # the first group's prompt is shorter: left padding
    ids, mask = ids.to(a.device), mask.to(a.device)

    decode: dict = {impl: [] for impl in models}
    train: dict = {impl: [] for impl in models}
    tokens: dict = {}
    for _ in range(a.repeats):
        for impl, model in models.items():
            model.eval()
            torch.manual_seed(1)
            sync(a.device)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=a.new_tokens,
                                     min_new_tokens=a.new_tokens, do_sample=True, top_k=0, top_p=1.0,
                                     pad_token_id=cfg.pad_token_id or 0)
            sync(a.device)
            decode[impl].append(time.perf_counter() - t0)
            tokens[impl] = out[:, a.prompt:].cpu()
            completions = out[:, a.prompt:]
            model.train()
            model.zero_grad(set_to_none=True)
            sync(a.device)
            t0 = time.perf_counter()
            logps, _ = token_logprobs(model, ids, mask, completions, torch.ones_like(completions), with_entropy=True)
            logps.sum().backward()
            sync(a.device)
            train[impl].append(time.perf_counter() - t0)
    same = torch.equal(tokens["sdpa"], tokens[None])
    print(f"{a.model} ({cfg.num_attention_heads} query heads on {cfg.num_key_value_heads} key/value heads), "
          f"{a.rows} rows x ({a.prompt} prompt + {a.new_tokens} new) tokens, {a.dtype} on {a.device}, "
          f"{a.repeats} repeats alternating")
    print("| attention | generate s (median) | forward + backward s (median) |")
    print("|---|---|---|")
    for impl in models:
        print(f"| {name[impl]} | {statistics.median(decode[impl]):.3f} | {statistics.median(train[impl]):.3f} |")
    print(f"sampled tokens equal: {same}")
    ratio = statistics.median(decode[None]) / statistics.median(decode["sdpa"])
    ratio_train = statistics.median(train[None]) / statistics.median(train["sdpa"])
    print(f"{name[None]} / sdpa: generate {ratio:.2f}x, forward + backward {ratio_train:.2f}x ({a.model}, {a.device})")


if __name__ == "__main__":
    main()
