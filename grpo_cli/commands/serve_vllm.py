"""`grpo serve-vllm --model M`: the rollout server (grpo_cli/serve/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def command(
    model: Annotated[str, typer.Option("--model", help="HF model folder, hub id or builtin:tiny-qwen2 (as model.name_or_path).", show_default=False)],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel ranks: GPUs, or on CPU workers with their own cores (needs N cores).")] = 1,
    dp: Annotated[int, typer.Option("--dp", min=1, help="Data-parallel replicas (only 1: start one server per replica).")] = 1,
    host: Annotated[str, typer.Option("--host", help="Address to bind; a non-loopback one requires $GRPO_SERVER_TOKEN.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization", min=0.01, max=1.0, help="GPU: share of its memory for vLLM. Not used on CPU (see --kv-cache-gib).")] = 0.9,
    kv_cache_gib: Annotated[Optional[float], typer.Option("--kv-cache-gib", min=0.001, help="KV cache size per worker. Default on CPU: 8 full-context sequences of this model (at most a quarter of the free RAM); on GPU: what --gpu-memory-utilization leaves.")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=2, help="Context length; default: the model's.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, bfloat16, float16 or float32.")] = "auto",
    enforce_eager: Annotated[Optional[bool], typer.Option("--enforce-eager/--compile", help="Skip compilation and CUDA graphs: faster start, slower decode. Default: eager on CPU, compiled on GPU.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    weights_dir: Annotated[Optional[Path], typer.Option("--weights-dir", help="The only directory /update_weights reads files from (a trainer on this machine writes there). Default: a private temporary directory, announced on GET /info.")] = None,
    lora_rank: Annotated[int, typer.Option("--lora-rank", min=0, help="Serve LoRA adapters up to this rank (a trainer with model.lora syncs the adapter, not the merged model; rounded up to a rank vLLM takes: 1, 8, 16, 32, ...). 0: off.")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", help="Every line vLLM logs (default: each distinct line once; vLLM repeats some at every request and weight update).")] = False,
) -> None:
    """Serve a vLLM engine for `rollout.backend: vllm` with `rollout.vllm.mode: server`.

    Examples:

      grpo serve-vllm --model Qwen/Qwen2.5-0.5B-Instruct

      GRPO_SERVER_TOKEN=$SECRET grpo serve-vllm --model /models/qwen --host 0.0.0.0 --tp 2

      grpo serve-vllm --model ./my-model --dtype bfloat16 --kv-cache-gib 2

      grpo serve-vllm --model Qwen/Qwen2.5-0.5B-Instruct --lora-rank 16

    Every route but /health needs a token. Without GRPO_SERVER_TOKEN a loopback server writes its own to
    a file only you can read, which your trainer on this machine finds; another address needs the
    variable (a secret: python -c 'import secrets; print(secrets.token_urlsafe(32))') and the trainer
    the same one, with rollout.vllm.server_url=http://HOST:PORT. Exit codes: 1 vLLM failed to
    start (the message names the log), 2 refused options, 3 the engine died while serving (/health
    answered 503 before), 130 / 143 stopped by SIGINT / SIGTERM.
    """
    from grpo_cli.serve.app import run_server

    run_server(model, tp, dp, host, port, gpu_memory_utilization, kv_cache_gib, max_model_len, dtype, enforce_eager,
               seed, weights_dir, verbose, lora_rank)
