"""An optimizer step with AdamW's state on the device against train.offload_optimizer's (trainer/offload.py): the
step's time and the device memory the optimizer holds, on a random model of a real shape.

The weights get random gradients (as a backward leaves them); each side is timed over `--steps` steps after one
warm-up step (which creates the moments), the device synchronised around each. "held" is the device memory after
the step less the weights and gradients: the moments (and nothing, offloaded). The offloaded step is the gradients'
copy to host memory, the host's fused AdamW over its copies, and the weights' copy back.

    python bench/offload_step.py --device cuda --dtype bfloat16 --threads 4     # Qwen2.5-0.5B's shape on a GPU
    python bench/offload_step.py --shape tiny                                    # seconds, to try the script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from train_memory import SHAPES  # noqa: E402

from grpo_cli.trainer.offload import HostOptimizer  # noqa: E402

GIB = 2**30


def model_of(shape: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPES[shape]), dtype=dtype)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(model, optimizer, device: str, steps: int) -> tuple[list[float], float]:
    """Step times after a warm-up step, and the device memory the optimizer holds after them (bytes)."""
    params = list(model.parameters())
    base = sum(p.numel() * p.element_size() * 2 for p in params)  # weights and their gradients
    optimizer.step()
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        optimizer.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    held = torch.cuda.memory_allocated() - base if device == "cuda" else float("nan")
    return times, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="qwen2.5-0.5b")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the host's step)")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    rows, n = [], 0
    for side in ("state on the device", "offloaded (host memory)"):
        model = model_of(a.shape, a.device, dtype)
        params = list(model.parameters())
        n = sum(p.numel() for p in params)
        fused = a.device in ("cpu", "cuda")

        def adamw(ps):
            return torch.optim.AdamW(ps, lr=1e-6, betas=(0.9, 0.99), fused=fused)

        optimizer = adamw(params) if side.startswith("state") else HostOptimizer(params, adamw)
        times, held = measure(model, optimizer, a.device, a.steps)
        rows.append((side, statistics.median(times), held))
        del model, optimizer, params
        if a.device == "cuda":
            torch.cuda.empty_cache()
    print(f"{a.shape}: {n / 1e6:.0f}M parameters, {a.dtype} on {a.device}, {a.threads} host threads, "
          f"median of {a.steps} steps")
    print("| optimizer | step s | device memory it holds, GiB |\n|---|---|---|")
    for side, t, held in rows:
        print(f"| {side} | {t:.3f} | {held / GIB:.2f} |")
    (_, t0, h0), (_, t1, h1) = rows
    print(f"offloaded step {t1:.3f} s against {t0:.3f} s on the device (+{t1 - t0:.3f} s), device memory held "
          f"{h0 / GIB:.2f} -> {h1 / GIB:.2f} GiB")


if __name__ == "__main__":
    main()
