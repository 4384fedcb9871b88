"""Peak memory of per-token log-probs (forward + backward): ours vs a full-vocabulary fp32 log_softmax.

Measures the logits -> log-prob part that dominates memory at large vocabularies, on CPU with
torch's allocator statistics unavailable, so it tracks the peak of live tensor bytes through a
TorchDispatchMode. Prints a table and ends with one line: the memory ratio naive / ours.

  python bench/logprobs_memory.py [--batch 8] [--length 256] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_cli.algo.logprobs import logps_from_logits


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=49152)  # SmolLM2; Qwen2.5 is 151936
    ap.add_argument("--dtype", default="bfloat16")
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
    print(f"peak memory naive / ours: {p_naive / max(p_ours, 1):.1f}x")


if __name__ == "__main__":
    main()
