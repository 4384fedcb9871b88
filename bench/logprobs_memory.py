"""Peak memory of per-token log-probs (forward + backward): ours vs a full-vocabulary fp32 log_softmax.

Measures the logits -> log-prob part that dominates memory at large vocabularies, on CPU with
torch's allocator statistics unavailable, so it tracks the peak of live tensor bytes through a
TorchDispatchMode. Then the same from the hidden states, the LM head included (`--hidden`, 0 to skip): the
model's head over the micro-batch then the row chunks, against the head inside the chunks (`head_logps`, what
the training forward of a Llama/Qwen-type model runs). Prints the tables and ends with one line: the memory
ratios.

  python bench/logprobs_memory.py [--batch 8] [--length 256] [--vocab 151936] [--hidden 896]
"""

from __future__ import annotations

import argparse
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_cli.algo.logprobs import head_logps, logps_from_logits


class PeakLiveBytes(TorchDispatchMode):
    """Peak bytes of tensors created inside the mode that are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live, self.peak, self._seen = 0, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._seen:
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                self._seen[key] = size
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key) -> None:
        self.live -= self._seen.pop(key, 0)


def naive(logits, ids, temperature):
    return torch.gather(torch.log_softmax(logits.float() / temperature, -1), -1, ids.unsqueeze(-1)).squeeze(-1)


def ours(logits, ids, temperature):
    return logps_from_logits(logits, ids, temperature, chunk_rows=1)


def measure(fn, logits, ids) -> tuple[int, float, torch.Tensor]:
    leaf = logits.detach().clone().requires_grad_(True)
    t0 = time.perf_counter()
    with PeakLiveBytes() as mode:
        out = fn(leaf, ids, 0.7)
        out.sum().backward()
    return mode.peak, time.perf_counter() - t0, leaf.grad


def measure_head(fn, hidden, weight, ids) -> tuple[int, float, torch.Tensor, torch.Tensor]:
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    t0 = time.perf_counter()
    with PeakLiveBytes() as mode:
        out = fn(h, w, ids)
        out.sum().backward()
    return mode.peak, time.perf_counter() - t0, h.grad, w.grad


def head_then_chunks(h, w, ids):
    return logps_from_logits(torch.nn.functional.linear(h, w), ids, 0.7, chunk_rows=1)


def head_in_chunks(h, w, ids):  # each row's chunk under checkpointing: autograd sums the chunks' weight gradients
    return head_logps(lambda x: torch.nn.functional.linear(x, w), h, ids, 0.7, chunk_rows=1)[..., 0]


def head_in_chunks_one_gradient(h, w, ids):  # what training runs for a plain head (algo/head_gradient.py)
    return head_logps(lambda x: torch.nn.functional.linear(x, w), h, ids, 0.7, chunk_rows=1, weight=w)[..., 0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=49152)  # SmolLM2; Qwen2.5 is 151936
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hidden", type=int, default=576, help="hidden size for the LM-head rows (SmolLM2 576, Qwen2.5-0.5B 896)")
    a = ap.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(a.batch, a.length, a.vocab, dtype=getattr(torch, a.dtype))
    ids = torch.randint(0, a.vocab, (a.batch, a.length))
    base = logits.numel() * logits.element_size()
    p_naive, t_naive, g_naive = measure(naive, logits, ids)
    p_ours, t_ours, g_ours = measure(ours, logits, ids)
    diff = (g_naive.float() - g_ours.float()).abs().max().item()
    print(f"logits [{a.batch}, {a.length}, {a.vocab}] {a.dtype} = {base / 2**20:.0f} MiB (not counted below)")
    print(f"{'method':<34}{'peak extra MiB':>16}{'seconds':>10}")
    print(f"{'full-vocab fp32 log_softmax':<34}{p_naive / 2**20:>16.1f}{t_naive:>10.2f}")
    print(f"{'grpo_cli (row chunks, recompute)':<34}{p_ours / 2**20:>16.1f}{t_ours:>10.2f}")
    print(f"max |grad difference| = {diff:.2e}")
    figure = f"peak memory naive / ours: {p_naive / max(p_ours, 1):.1f}x"
    if a.hidden:
        dtype = getattr(torch, a.dtype)
        hidden = torch.randn(a.batch, a.length, a.hidden, dtype=dtype)
        weight = torch.randn(a.vocab, a.hidden, dtype=dtype) / a.hidden**0.5
        del logits
        p_full, t_full, gh_full, gw_full = measure_head(head_then_chunks, hidden, weight, ids)
        p_in, t_in, gh_in, gw_in = measure_head(head_in_chunks, hidden, weight, ids)
        p_one, t_one, gh_one, gw_one = measure_head(head_in_chunks_one_gradient, hidden, weight, ids)
        scale = max(gw_full.float().abs().max().item(), 1e-12)
        diff = max((gh_full.float() - g[0].float()).abs().max().item() for g in ((gh_in, gw_in), (gh_one, gw_one)))
        diff = max(diff, *((gw_full.float() - g.float()).abs().max().item() for g in (gw_in, gw_one)))
        print(f"\nhidden [{a.batch}, {a.length}, {a.hidden}] through an LM head [{a.vocab}, {a.hidden}], {a.dtype} "
              f"(the head's weight and its gradient counted below: {2 * weight.numel() * weight.element_size() / 2**20:.0f} MiB)")
        print(f"{'method':<34}{'peak MiB':>16}{'seconds':>10}")
        print(f"{'head over the batch, then chunks':<34}{p_full / 2**20:>16.1f}{t_full:>10.2f}")
        print(f"{'head inside the chunks':<34}{p_in / 2**20:>16.1f}{t_in:>10.2f}")
        print(f"{'  its weight gradient in one tensor':<34}{p_one / 2**20:>16.1f}{t_one:>10.2f}")
        print(f"max |grad difference| = {diff:.2e} (largest weight gradient {scale:.2e})")
        figure += (f"; with the LM head, batch then chunks / inside the chunks: {p_full / max(p_in, 1):.1f}x, "
                   f"/ inside with one weight gradient: {p_full / max(p_one, 1):.1f}x")
    print(figure)


if __name__ == "__main__":
    main()
