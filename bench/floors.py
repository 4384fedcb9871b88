"""What a GRPO step's phases cost at the machine's own limits (issue 40 item 1): each phase's floor on this machine.

    sampling  the weight-read floor: every decode step reads every product's weights once (the LM head's too) and
              each row's KV cache so far, at the measured read bandwidth, or does the step's products (2 FLOPs per
              weight and row) at the measured matmul throughput, whichever takes longer (a roofline: on a 2-core
              CPU, 16 rows of float32 products come close to both); plus the prefill's products (each prompt once).
              Also given: the same steps at the rate `rows` rows times a large weight reach here (what the products
              of a decode step achieve, bench/RESULTS.md's 2.4 s for SmolLM2 on the 2-core CPU)
    training  the compute floor: the products of the forward (2 FLOPs per weight and token) and backward (4) over
              the step's real tokens (no padding; the LM head on completion tokens only), plus causal attention's
              (2 x S^2 x heads x head_dim per layer and row, times 3), at the matmul throughput measured at the
              micro-batch's shape; plus the optimizer's memory floor: AdamW reads weight, gradient and two moments
              and writes three of them (7 x the bytes of the weights) at the read bandwidth

Read bandwidth is the best of a streaming pass over a buffer far larger than the caches (`sum`) and a product of
`rows` rows by a weight matrix of the same size (what a decode step does); matmul throughput is the best of timed
products at the shape over a second. Both are measured with the threads (CPU) or the device (CUDA) the bench uses,
so a phase's time over its floor says how far it is from what this machine can do, not from a datasheet.

    python bench/floors.py --model smollm2                       # the floors of bench/vs_trl.py's default shape
    python bench/floors.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --new-tokens 64

bench/vs_trl.py prints the same floors beside both sides' phase times.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """A causal LM's sizes as the floors need them (from its config, weights never loaded)."""

    linear: int  # weights of every product, the LM head included (a tied head counted once, as a product)
    head: int  # the LM head's weights
    params: int  # every trainable parameter (embeddings and norms too): what the optimizer updates
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, folder) -> Shape:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        linears = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
        head = model.get_output_embeddings().weight.numel()
        heads = config.num_attention_heads
        return cls(linear=sum(linears.values()), head=head, params=sum(p.numel() for p in model.parameters()),
                   layers=config.num_hidden_layers, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   hidden=config.hidden_size, intermediate=config.intermediate_size)


@dataclass(frozen=True)
class Machine:
    """What this machine does, measured: read bandwidth (bytes/s) and matmul throughput (FLOP/s) at a shape."""

    bandwidth: float
    flops: float
    gemv: float  # bytes/s of `rows` rows times a weight far larger than the caches
    how: str


def _timed(fn, sync, repeats: int, seconds: float = 1.0) -> float:
    """The best timing of fn() (seconds) over at least `repeats` calls and `seconds`, after one untimed call: on a
    shared VM a few calls of 8 ms can all fall in another tenant's burst (a matmul rate of 84 GFLOP/s in one bench
    where the next measured 120, and the training phase then ran at 0.73x its "floor")."""
    fn()
    sync()
    best, start, n = float("inf"), time.perf_counter(), 0
    while n < repeats or (time.perf_counter() - start < seconds and n < 1000):
        t0 = time.perf_counter()
        fn()
        sync()
        best, n = min(best, time.perf_counter() - t0), n + 1
    return best


def _read_bandwidth(torch, dt, width: int, device: str, rows: int, gib: float, sync, repeats: int):
    """Bytes/s of a streaming sum over `gib` GiB and of `rows` rows times a weight that size (freed on return)."""
    k = 4096
    buffer = torch.ones(int(gib * 2**30) // width // k * k, dtype=dt, device=device)
    stream = buffer.numel() * width / _timed(lambda: buffer.sum(), sync, repeats)
    weight = buffer.view(-1, k)  # [n, k]: rows x weight^T reads every weight once, as a decode step does
    x = torch.randn(rows, k, dtype=dt, device=device)
    return stream, weight.numel() * width / _timed(lambda: x @ weight.T, sync, repeats)


def measure(device: str, dtype: str, rows: int, matmul: tuple[int, int, int], gib: float = 1.0,
            threads: int | None = None, repeats: int = 5) -> Machine:
    """Read bandwidth over `gib` GiB (a streaming sum, and `rows` rows times a weight of that size) and the
    throughput of an [m, k] x [k, n] product, in `dtype` on `device`."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    stream, gemv = _read_bandwidth(torch, dt, DTYPE_BYTES[dtype], device, rows, gib, sync, repeats)
    m, kk, n = matmul
    a, b = torch.randn(m, kk, dtype=dt, device=device), torch.randn(kk, n, dtype=dt, device=device)
    flops = 2 * m * kk * n / _timed(lambda: a @ b, sync, repeats)
    how = (f"read {max(stream, gemv) / 1e9:.1f} GB/s (best of a streaming sum over {gib:g} GiB, {stream / 1e9:.1f}, "
           f"and {rows} rows x a {gib:g} GiB weight, {gemv / 1e9:.1f}); products {flops / 1e9:.0f} GFLOP/s at "
           f"[{m}, {kk}] x [{kk}, {n}], {dtype} on {device}")
    return Machine(bandwidth=max(stream, gemv), flops=flops, gemv=gemv, how=how)


def sampling_floor(shape: Shape, machine: Machine, dtype: str, prompts: int, rows: int, prompt_tokens: float,
                   decode_steps: float) -> dict:
    """The weight-read floor of one generate: `decode_steps` steps over `rows` rows, `prompts` distinct prompts of
    `prompt_tokens` tokens prefilled once each."""
    width = DTYPE_BYTES[dtype]
    weights = shape.linear * width
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * width * rows
    steps = int(round(decode_steps))
    kv = sum(kv_per_token * (prompt_tokens + t) for t in range(steps))
    prefill = 2 * (shape.linear - shape.head) * prompts * prompt_tokens + 2 * shape.head * rows
    step = max(weights / machine.bandwidth, 2 * shape.linear * rows / machine.flops)
    bound = "read" if weights / machine.bandwidth >= 2 * shape.linear * rows / machine.flops else "compute"
    decode = steps * step + kv / machine.bandwidth
    at_products = steps * weights / machine.gemv + kv / machine.bandwidth + prefill / machine.flops
    return {"seconds": decode + prefill / machine.flops, "decode_s": decode, "prefill_s": prefill / machine.flops,
            "at_products_s": at_products,
            "what": f"{steps} decode steps x {step * 1e3:.1f} ms ({weights / 1e9:.2f} GB of weights at "
                    f"{machine.bandwidth / 1e9:.1f} GB/s or their products at {machine.flops / 1e9:.0f} GFLOP/s: "
                    f"{bound}-bound) + the KV cache + the prefill; at the {rows}-row products' "
                    f"{machine.gemv / 1e9:.1f} GB/s: {at_products:.2f} s"}


def training_floor(shape: Shape, machine: Machine, dtype: str, rows: int, prompt_tokens: float,
                   completion_tokens: float) -> dict:
    """The compute floor of one step's forwards and backward over `rows` rows, plus AdamW's memory floor."""
    seq = prompt_tokens + completion_tokens
    body = 6 * (shape.linear - shape.head) * rows * seq
    head = 6 * shape.head * rows * completion_tokens
    attention = 3 * 2 * seq**2 * shape.heads * shape.head_dim * shape.layers * rows
    compute = (body + head + attention) / machine.flops
    optimizer = 7 * shape.params * DTYPE_BYTES[dtype] / machine.bandwidth
    return {"seconds": compute + optimizer, "compute_s": compute, "optimizer_s": optimizer,
            "what": f"{(body + head + attention) / 1e12:.2f} TFLOP / {machine.flops / 1e9:.0f} GFLOP/s + AdamW "
                    f"{7 * shape.params * DTYPE_BYTES[dtype] / 1e9:.2f} GB / {machine.bandwidth / 1e9:.1f} GB/s"}


def micro_batch_matmul(shape: Shape, micro_batch: int, seq: float) -> tuple[int, int, int]:
    """The MLP's up product at the micro-batch's shape: [micro_batch x seq, hidden] x [hidden, intermediate]."""
    return int(micro_batch * seq), shape.hidden, shape.intermediate


def main() -> None:
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_trl import MODEL_NAMES, model_folder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODEL_NAMES, default="smollm2")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=list(DTYPE_BYTES), default="float32")
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=float, default=30.0)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shape = Shape.of(model_folder(a.model, Path(tmp)))
    rows, seq = a.B * a.G, a.prompt_tokens + a.new_tokens
    machine = measure(a.device, a.dtype, rows, micro_batch_matmul(shape, a.micro_batch, seq), threads=a.threads)
    sampling = sampling_floor(shape, machine, a.dtype, a.B, rows, a.prompt_tokens, a.new_tokens)
    training = training_floor(shape, machine, a.dtype, rows, a.prompt_tokens, a.new_tokens)
    print(f"{MODEL_NAMES[a.model]}: {shape.linear / 1e6:.0f}M weights in products, {shape.params / 1e6:.0f}M "
          f"parameters; {rows} rows, {a.prompt_tokens:g} prompt + {a.new_tokens} new tokens; {machine.how}")
    print("| phase | floor s | what |\n|---|---|---|")
    print(f"| generate | {sampling['seconds']:.3f} | {sampling['what']} |")
    print(f"| train | {training['seconds']:.3f} | {training['what']} |")
    print(f"floor of a step: {sampling['seconds'] + training['seconds']:.3f} s")


if __name__ == "__main__":
    main()
