"""`grpo serve-vllm`: one vLLM engine behind a small HTTP API that a GRPO trainer drives.

Routes (JSON; every route but /health needs `Authorization: Bearer $GRPO_SERVER_TOKEN` when the
variable is set):
  GET  /health              {"status": "ok", "model": ..., "weight_version": v}
  POST /generate            token ids in, n completions per prompt out (token ids + sampler log-probs);
                            409 when `expected_version` is not the loaded weight version
  POST /update_weights      {"path": "/abs/file.safetensors", "version": v} (same machine), or the raw
                            safetensors bytes (application/octet-stream, header X-Weight-Version);
                            re-sending the loaded version is a no-op; resets the prefix cache
  POST /reset_prefix_cache

Log-probs are vLLM's `processed_logprobs`: after temperature (and top-k/top-p), i.e. log pi(. | T),
the distribution the trainer's `token_logprobs(..., temperature=T)` computes. vLLM's own API server
is not used: its dev routes (/collective_rpc, ...) are not guarded by its --api-key. Requests are
served one at a time (a lock around the engine); /health answers while a request runs.
"""

import hmac
import ipaddress
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

log = logging.getLogger("grpo.serve")

TOKEN_ENV = "GRPO_SERVER_TOKEN"
WORKER_EXTENSION = "grpo_cli.rollout.vllm_worker.WeightSyncExtension"


class ServeError(RuntimeError):
    """A request the server refuses; `status` is the HTTP status code sent back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- start-up checks (no vLLM needed)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, token: str | None, dp: int) -> str | None:
    """Why the server must not start with these options, or None."""
    if not is_loopback(host) and not token:
        return (
            f"refusing to listen on {host} without authentication: anyone who can reach it could "
            f"generate and replace the weights. Set a secret first, e.g.\n"
            f"  export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')\n"
            f"and give the trainer the same variable; or keep the default --host 127.0.0.1"
        )
    if dp != 1:
        return (
            f"--dp {dp}: one server holds one vLLM engine (data parallel inside one LLM is not supported "
            "by vLLM); start one `grpo serve-vllm` per replica on its own port instead"
        )
    return None


# ---------------------------------------------------------------- the engine, one request at a time


class Engine:
    """A vLLM `LLM` with a lock and the version of the weights it holds (0 = the model folder's)."""

    def __init__(self, llm: Any, model: str) -> None:
        self.llm, self.model = llm, model
        self.version = 0
        self.lock = threading.Lock()
        self.tmpdir = Path(tempfile.mkdtemp(prefix="grpo-serve-"))  # 0700: uploaded weights land here

    def generate(self, req: dict) -> dict:
        with self.lock:
            self._check_version(req.get("expected_version"))
            prompts = [{"prompt_token_ids": ids} for ids in req["prompt_token_ids"]]
            params = [_sampling_params(req, seed_offset=i * req["n"]) for i in range(len(prompts))]
            try:
                outs = self.llm.generate(prompts, params, use_tqdm=False)
            except ValueError as e:  # e.g. a prompt longer than max_model_len
                raise ServeError(400, f"vLLM refused the request: {e}") from e
            except Exception as e:  # the engine itself failed: say how, not just "Internal Server Error"
                log.exception("generate failed")
                raise ServeError(500, f"vLLM failed while generating: {type(e).__name__}: {e}") from e
            return {"weight_version": self.version, "outputs": [_completions(o) for o in outs]}

    def _check_version(self, expected: int | None) -> None:
        if expected is not None and expected != self.version:
            raise ServeError(
                409,
                f"stale weights: the request expects weight version {expected} but the server holds "
                f"version {self.version}; sync the weights (POST /update_weights) before generating",
            )

    def update_from_file(self, path: str, version: int) -> dict:
        with self.lock:
            if version == self.version:
                return {"weight_version": self.version, "updated": False, "seconds": 0.0}
            if version < self.version:
                raise ServeError(409, f"weight version {version} is older than the loaded version {self.version}")
            p = Path(path)
            if not p.is_absolute() or not p.is_file():
                raise ServeError(400, f"weights file {path!r} is not an absolute path to an existing file on the server")
            t0 = time.perf_counter()
            self.llm.collective_rpc("grpo_load_weights_from_file", args=(str(p), version))
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            self.version = version
            return {"weight_version": version, "updated": True, "seconds": time.perf_counter() - t0}

    def reset_prefix_cache(self) -> dict:
        with self.lock:
            return {"reset": bool(self.llm.reset_prefix_cache())}


def _sampling_params(req: dict, seed_offset: int):
    """One prompt's SamplingParams. vLLM seeds the n samples seed, seed+1, ... so rows never share a seed."""
    from vllm import SamplingParams

    seed = req.get("seed")
    return SamplingParams(
        n=req["n"], temperature=req["temperature"], top_p=req["top_p"], top_k=req.get("top_k") or 0,
        min_p=req.get("min_p") or 0.0, repetition_penalty=req["repetition_penalty"],
        max_tokens=req["max_tokens"], seed=None if seed is None else seed + seed_offset,
        stop_token_ids=req.get("stop_token_ids") or None, logprobs=0, detokenize=False,
    )


def _completions(out: Any) -> list[dict]:
    """vLLM RequestOutput -> n dicts of token ids, the sampled tokens' log-probs, finish reason."""
    rows = []
    for c in sorted(out.outputs, key=lambda c: c.index):
        ids = list(c.token_ids)
        logps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids)]
        rows.append({"token_ids": ids, "logprobs": logps, "finish_reason": c.finish_reason})
    return rows


# ---------------------------------------------------------------- HTTP


def build_app(engine: Engine, token: str | None):
    """The FastAPI app; `engine` only needs the methods of `Engine` (tests may pass another)."""
    from fastapi import Depends, FastAPI, Header, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    app = FastAPI(title="grpo serve-vllm", docs_url=None, redoc_url=None, openapi_url=None)

    def authorize(authorization: Optional[str] = Header(None)) -> None:
        if token is None:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, f"missing or wrong bearer token (the server's {TOKEN_ENV})")

    @app.exception_handler(ServeError)
    async def _serve_error(_request, exc: ServeError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    class GenerateRequest(BaseModel):
        prompt_token_ids: list[list[int]] = Field(..., min_length=1)
        n: int = Field(1, ge=1)
        temperature: float = Field(1.0, ge=0)
        top_p: float = Field(1.0, gt=0, le=1)
        top_k: Optional[int] = Field(None, ge=1)
        min_p: Optional[float] = Field(None, ge=0, le=1)
        repetition_penalty: float = Field(1.0, gt=0)
        max_tokens: int = Field(256, ge=1)
        seed: Optional[int] = None
        stop_token_ids: Optional[list[int]] = None
        expected_version: Optional[int] = None

    class WeightsFile(BaseModel):
        path: str
        version: int = Field(..., ge=0)

    guarded = [Depends(authorize)]

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": engine.model, "weight_version": engine.version}

    @app.post("/generate", dependencies=guarded)
    def generate(req: GenerateRequest) -> dict:
        return engine.generate(req.model_dump())

    @app.post("/reset_prefix_cache", dependencies=guarded)
    def reset_prefix_cache() -> dict:
        return engine.reset_prefix_cache()

    @app.post("/update_weights", dependencies=guarded)
    async def update_weights(request: Request) -> dict:
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            return await _update_from_body(engine, request, run_in_threadpool)
        body = WeightsFile.model_validate(await request.json())
        return await run_in_threadpool(engine.update_from_file, body.path, body.version)

    return app


async def _update_from_body(engine: Engine, request, run_in_threadpool) -> dict:
    """Raw safetensors bytes -> a temporary file on the server (streamed, never whole in memory) -> load."""
    raw = request.headers.get("x-weight-version")
    if raw is None or not raw.isdigit():
        raise ServeError(400, "a raw weights upload needs the header X-Weight-Version: <non-negative int>")
    version = int(raw)
    if version == engine.version:  # idempotent: do not even read the body
        return {"weight_version": version, "updated": False, "seconds": 0.0}
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=engine.tmpdir)
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                f.write(chunk)
        return await run_in_threadpool(engine.update_from_file, path, version)
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- the command


def load_engine(model: str, tp: int, gpu_memory_utilization: float, max_model_len: int | None,
                dtype: str, enforce_eager: bool, seed: int) -> Engine:
    from vllm import LLM

    llm = LLM(
        model=model, tensor_parallel_size=tp, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
        worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs",
    )
    return Engine(llm, model)


def command(
    model: Annotated[str, typer.Option("--model", help="HF model folder, hub id or builtin:tiny-qwen2 (as model.name_or_path).", show_default=False)],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel GPUs.")] = 1,
    dp: Annotated[int, typer.Option("--dp", min=1, help="Data-parallel replicas (only 1: start one server per replica).")] = 1,
    host: Annotated[str, typer.Option("--host", help="Address to bind; a non-loopback one requires $GRPO_SERVER_TOKEN.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization", min=0.01, max=1.0)] = 0.9,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=1, help="Context length; default: the model's.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, bfloat16, float16 or float32.")] = "auto",
    enforce_eager: Annotated[Optional[bool], typer.Option("--enforce-eager/--compile", help="Skip compilation and CUDA graphs: faster start, slower decode. Default: eager on CPU, compiled on GPU.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Serve a vLLM engine for `rollout.backend: vllm` with `rollout.vllm.mode: server`.

    Examples:

      grpo serve-vllm --model Qwen/Qwen2.5-0.5B-Instruct

      GRPO_SERVER_TOKEN=$SECRET grpo serve-vllm --model /models/qwen --host 0.0.0.0 --tp 2

      VLLM_CPU_KVCACHE_SPACE=1 grpo serve-vllm --model ./my-model --dtype bfloat16

    A secret: python -c 'import secrets; print(secrets.token_urlsafe(32))'. The trainer needs the
    same GRPO_SERVER_TOKEN and rollout.vllm.server_url=http://HOST:PORT.
    """
    token = os.environ.get(TOKEN_ENV) or None
    problem = bind_problem(host, token, dp)
    if problem:  # checked before vLLM is even imported
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    import uvicorn

    from grpo_cli.models import resolve_model_source
    from grpo_cli.recipe import ModelConfig
    from grpo_cli.rollout.vllm_colocate import eager_default

    model = resolve_model_source(ModelConfig(name_or_path=model))  # builtin:..., pkg:... as in recipes
    engine = load_engine(model, tp, gpu_memory_utilization, max_model_len, dtype, eager_default(enforce_eager), seed)
    auth = "bearer token from $GRPO_SERVER_TOKEN" if token else "no authentication (loopback only)"
    typer.echo(f"grpo serve-vllm: {model} on http://{host}:{port} ({auth})", err=True)
    # uvicorn's access log prints method, path and status only, never request headers.
    uvicorn.run(build_app(engine, token), host=host, port=port, log_level="info")


def main() -> None:
    """`python -m grpo_cli.serve.server --model ...` without the grpo CLI."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    app()


if __name__ == "__main__":
    main()
