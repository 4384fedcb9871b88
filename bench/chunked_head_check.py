"""The chunked LM head against the plain one on a device's own kernels (a GPU's where the CPU's tests cannot reach):
log-probs, entropy and every gradient of two micro-batches (the second adds into the gradients the first left, in
place: grpo_cli/algo/head_gradient.py), on a Qwen2 with its head tied to the embedding and a Llama with its own,
float32 and bfloat16 weights, the chunks cutting rows (a few positions each). Then the head's time on a larger shape,
plain and chunked. Prints a table per model and ends with one line: the largest differences and the time ratio; exits
1 where a difference is over its bound.

  python bench/chunked_head_check.py --device cuda
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from grpo_cli.algo import head_gradient
from grpo_cli.algo import logprobs as logprobs_module
from grpo_cli.algo.logprobs import token_logprobs

HEAD_CHUNKED = frozenset(logprobs_module.HEAD_CHUNKED)
BOUND = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # of the largest gradient entry of the plain head's


def model_of(kind: str, dtype: torch.dtype, device: str, vocab: int, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    model = (Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common)) if kind == "qwen2 tied"
             else LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common)))
    return model.to(device=device, dtype=dtype).train()


def batches(vocab: int, device: str, rows: int, prompt: int, completion: int, n: int = 2):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        p = torch.randint(1, vocab, (rows, prompt), generator=g)
        pm = torch.ones_like(p)
        p[0, :2], pm[0, :2] = 0, 0  # left padding: the padding id's row gets no gradient from the lookup
        c = torch.randint(1, vocab, (rows, completion), generator=g)
        cm = torch.ones_like(c)
        cm[1, completion // 2:] = 0
        out.append(tuple(t.to(device) for t in (p, pm, c, cm)))
    return out


def run(model, data, chunked: bool, **kw):
    logprobs_module.HEAD_CHUNKED = set(HEAD_CHUNKED) if chunked else set()
    model.zero_grad(set_to_none=True)
    values = []
    for args in data:
        logps, entropy = token_logprobs(model, *args, temperature=0.7, with_entropy=True, shared_prompts=False, **kw)
        weights = torch.linspace(-1, 1, logps.numel(), device=logps.device).view_as(logps)
        (logps * weights * args[3]).sum().backward()
        values.append((logps.detach().float(), entropy.float()))
    return values, {n: p.grad.float().clone() for n, p in model.named_parameters()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    failed, worst = False, {}
    print("| model | dtype | log-probs max diff | entropy max diff | gradient max diff / largest | bound |")
    print("|---|---|---|---|---|---|")
    for kind in ("qwen2 tied", "llama"):
        for dtype in (torch.float32, torch.bfloat16):
            model = model_of(kind, dtype, args.device, vocab=1000, hidden=64, layers=2)
            data = batches(1000, args.device, rows=8, prompt=6, completion=9)
            head_gradient.CHUNK_LOGITS = 4 * 1000 + 7  # 4 positions a chunk: chunks cut rows
            plain, plain_grads = run(model, data, False)
            chunked, chunked_grads = run(model, data, True, chunk_rows=2)
            head_gradient.CHUNK_LOGITS = 1 << 22
            dl = max((a[0] - b[0]).abs().max().item() for a, b in zip(plain, chunked))
            de = max((a[1] - b[1]).abs().max().item() for a, b in zip(plain, chunked))
            largest = max(g.abs().max().item() for g in plain_grads.values())
            dg = max((chunked_grads[n] - g).abs().max().item() for n, g in plain_grads.items()) / largest
            bad = dg > BOUND[dtype] or dl > 50 * BOUND[dtype]
            failed |= bad
            worst[(kind, str(dtype))] = dg
            print(f"| {kind} | {dtype} | {dl:.2e} | {de:.2e} | {dg:.2e}{' FAIL' if bad else ''} | {BOUND[dtype]:.0e} |")
    # time: a Qwen2.5-0.5B-wide head (151,936 x 896) over 8 rows x 256 completion tokens, one layer, bfloat16
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = model_of("qwen2 tied", dtype, args.device, vocab=151936, hidden=896, layers=1)
    data = batches(151936, args.device, rows=8, prompt=32, completion=256, n=1)
    times = {}
    for chunked in (False, True):
        run(model, data, chunked)  # warm-up
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(3):
            run(model, data, chunked)
        if args.device == "cuda":
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
        times[chunked] = (time.perf_counter() - t0) / 3
        print(f"{'chunked' if chunked else 'plain'} head: {times[chunked] * 1e3:.0f} ms a forward + backward "
              f"(8 x 256 tokens, 151,936 x 896, {dtype}), peak {peak:.2f} GiB")
    print(f"chunked head on {args.device}: largest gradient difference {max(worst.values()):.1e} of the largest entry "
          f"({'FAILED' if failed else 'within bounds'}); time {times[True] / times[False]:.2f}x the plain head's")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
