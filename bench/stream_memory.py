"""Peak memory of a 1 GB JSON Lines dataset streamed (data.streaming) against loaded (the default), CPU.

Writes a JSON Lines file of math problems (a `prompt` padded with context text, an `answer`; --gb of it), then in a
fresh process per mode runs what `grpo train` runs on the data side: `load_rows` and a `PromptStream` with the
tiny model's tokenizer handing out --batches batches of --batch prompts (rendered with the chat template and
tokenized), a checkpoint's state_dict, a restore of that state into a fresh stream, and a restore three quarters
into the file (the stream skips to the row without decoding the rows before it). Each child reports its peak
resident memory (ru_maxrss) and the resident memory after its imports (the difference is what the data costs),
the time to the first batch, the time of the batches, the restores' times and what it wrote to the datasets cache.
Prints the table and ends with one line: the peak memory ratio.

  python bench/stream_memory.py [--gb 1.0] [--batch 16] [--batches 200] [--keep PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
import datasets, numpy, torch, transformers  # the imports a trainer has anyway, before the data
from grpo_cli.data.prompts import PromptStream
from grpo_cli.data.sources import load_rows
from grpo_cli.models.loading import load_tokenizer
from grpo_cli.recipe.schema import DataConfig, ModelConfig
torch.set_num_threads(1)

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

path, streaming, batch, batches, rows = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tok = load_tokenizer(ModelConfig(name_or_path="builtin:tiny-qwen2"))
cfg = DataConfig(files=[path], streaming=streaming, answer_column="answer", max_prompt_length=256)
base = rss_mb()
t0 = time.perf_counter()
stream = PromptStream(load_rows(cfg, 0), cfg, tok, batch, 0)
first = stream.next_batch()
t_first = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(batches - 1):
    last = stream.next_batch()
t_rest = time.perf_counter() - t0
state = json.loads(json.dumps(stream.state_dict()))
stream.close()
t0 = time.perf_counter()
again = PromptStream(load_rows(cfg, 0), cfg, tok, batch, 0)
again.load_state_dict(state)
resumed = again.next_batch()
t_resume = time.perf_counter() - t0
again.close()
# a resume three quarters into the file: the state the stream has there (one shard: block k starts at row k x size)
deep = (3 * rows // 4) // cfg.shuffle_buffer
if streaming:
    at = deep * cfg.shuffle_buffer
    block = {"epoch": 0, "number": deep, "shard": 0, "row": at, "read": at, "first": at}
    far_state = {"epoch": 0, "taken": 0, "shards": 1, "blocks": [block]}
else:
    far_state = {"epoch": 0, "index": deep * cfg.shuffle_buffer}
t0 = time.perf_counter()
far = PromptStream(load_rows(cfg, 0), cfg, tok, batch, 0)
far.load_state_dict(far_state)
far.next_batch()
t_deep = time.perf_counter() - t0
far.close()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"base_mb": base, "peak_mb": peak, "first_s": t_first, "per_batch_ms": 1000 * t_rest / max(1, batches - 1),
                  "resume_s": t_resume, "deep_s": t_deep, "state_bytes": len(json.dumps(state))}))
"""


def write_jsonl(path: Path, gb: float, seed: int = 0) -> int:
    """Math problems with ~450 bytes of context each until the file holds `gb` GB; -> rows written."""
    rng = random.Random(seed)
    words = "the of a train station leaves at noon with apples oranges each costs more than twice as many".split()
    target, rows, size = int(gb * 1e9), 0, 0
    with open(path, "w") as f:
        while size < target:
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            context = " ".join(rng.choice(words) for _ in range(80))
            line = json.dumps({"prompt": f"{context}. What is {a} + {b}?", "answer": str(a + b), "id": rows}) + "\n"
            f.write(line)
            size += len(line)
            rows += 1
    return rows


def du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--keep", type=Path, help="write (or reuse) the JSON Lines file here instead of a temporary one")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="grpo-stream-bench-"))
    try:
        data = args.keep or work / "train.jsonl"
        t0 = time.perf_counter()
        if not data.exists():
            rows = write_jsonl(data, args.gb)
            print(f"wrote {data}: {data.stat().st_size / 1e9:.2f} GB, {rows:,} rows ({time.perf_counter() - t0:.0f} s)")
        else:
            with open(data, "rb") as f:
                rows = sum(1 for _ in f)
        results = {}
        for name, streaming in (("loaded", "0"), ("streamed", "1")):
            cache = work / f"hf-cache-{name}"
            env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "GRPO_CACHE_DIR": str(work / "grpo-cache"),
                   "OMP_NUM_THREADS": "1"}
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", CHILD, str(data), streaming, str(args.batch), str(args.batches),
                                str(rows)],
                               capture_output=True, text=True, env=env)
            if p.returncode != 0:
                sys.exit(f"{name} failed:\n{p.stderr[-3000:]}")
            results[name] = {**json.loads(p.stdout.strip().splitlines()[-1]), "cache_gb": du(cache) / 1e9,
                             "wall_s": time.perf_counter() - t0}
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    size = data.stat().st_size / 1e9 if data.exists() else args.gb
    print(f"\n{size:.2f} GB JSON Lines, {args.batches} batches of {args.batch} prompts (render + tokenize), then a "
          f"resume from the stream's state, and one at row {3 * rows // 4:,} (three quarters in)")
    print(f"{'':10} {'peak RSS':>9} {'after imports':>14} {'data cost':>10} {'1st batch':>10} {'per batch':>10} "
          f"{'resume':>8} {'at 3/4':>8} {'state':>8} {'datasets cache':>15}")
    for name, r in results.items():
        print(f"{name:10} {r['peak_mb']:7.0f} MB {r['base_mb']:11.0f} MB {r['peak_mb'] - r['base_mb']:7.0f} MB "
              f"{r['first_s']:8.1f} s {r['per_batch_ms']:7.1f} ms {r['resume_s']:6.1f} s {r['deep_s']:6.1f} s "
              f"{r['state_bytes']:6d} B "
              f"{r['cache_gb']:12.2f} GB")
    lo, st = results["loaded"], results["streamed"]
    print(f"streamed / loaded peak memory: {st['peak_mb']:.0f} / {lo['peak_mb']:.0f} MB = "
          f"{st['peak_mb'] / lo['peak_mb']:.2f}x (data cost {st['peak_mb'] - st['base_mb']:.0f} vs "
          f"{lo['peak_mb'] - lo['base_mb']:.0f} MB); first batch {st['first_s']:.1f} vs {lo['first_s']:.1f} s")


if __name__ == "__main__":
    main()
