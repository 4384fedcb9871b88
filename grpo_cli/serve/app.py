"""`grpo serve-vllm`: one vLLM engine behind a small HTTP API that a GRPO trainer drives.

Routes (JSON; every route but /health needs `Authorization: Bearer <token>`: $GRPO_SERVER_TOKEN, or on loopback
without it a token the server makes and writes to a file only its user can read, grpo_cli/serve/auth.py):
  GET  /health              200 {"status": "ok", "model": ..., "weight_version": v, "activity": k}; 503
                            {"status": "dead"} once the engine died (the server then exits with code 3).
                            `activity` counts engine steps and weight loads: it answers while a request
                            runs, so a client's watchdog sees a long generate progress
  GET  /info                weights directory, limits, context length, vocabulary size, KV cache
  POST /generate            token ids in, n completions per prompt out (token ids + sampler log-probs);
                            409 when `expected_version` is not the loaded weight version
  POST /update_weights      {"path": "<weights dir>/file.safetensors", "version": v, "partial": false}, or
                            the raw safetensors bytes (application/octet-stream, headers X-Weight-Version
                            and optionally X-Weight-Partial: true); re-sending the loaded version is a
                            no-op; resets the prefix cache
  POST /update_adapter      a LoRA adapter instead (servers started with --lora-rank; serve/adapters.py):
                            {"path": "<weights dir>/adapter.safetensors", "version": v} or its bytes (header
                            X-Weight-Version); every generate samples base + adapter until the next update
  POST /reset_prefix_cache

Nothing a client sends can break the engine: requests are checked field by field (requests.py) and
weight files tensor by tensor (weights.py) before vLLM sees them; a refusal is a 4xx whose `detail`
starts with the field or names the tensor. Log-probs are vLLM's `processed_logprobs`: after
temperature and top-k/top-p/min-p, i.e. log pi_K(. | T), what the trainer's `token_logprobs(...,
temperature=T, truncation=...)` computes. vLLM's own API server is not used: its dev routes (/collective_rpc, ...)
are not guarded by its --api-key. Requests are served one at a time (a lock around the engine);
/health answers while a request runs. Exit codes: 1 vLLM failed to start, 2 refused options
(nothing loaded), 3 the engine died while serving, 130 / 143 stopped by SIGINT / SIGTERM.

The engine and its start-up are engine.py's; the options are grpo_cli/commands/serve_vllm.py's.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at run time
import asyncio
import hmac
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from grpo_cli.errors import RequestError, UsageError
from grpo_cli.serve.auth import TOKEN_ENV, is_loopback, make_token, remove_token
from grpo_cli.serve.engine import say

if TYPE_CHECKING:
    from grpo_cli.serve.engine import ServedEngine

EXIT_ENGINE_DEAD = 3
UPLOAD_HEADROOM = 256 * 2**20  # an upload must leave this much free on its disk (the server's logs, vLLM's files)
DEAD_EXIT_DELAY_S = 2.0  # /health answers 503 this long before the server exits


# ---------------------------------------------------------------- start-up checks (no vLLM needed)


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


# ---------------------------------------------------------------- HTTP


def build_app(engine: "ServedEngine", token: str):
    """The FastAPI app; `engine` only needs the methods of `ServedEngine` (tests may pass another)."""
    from fastapi import Depends, FastAPI, Header, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    from grpo_cli.serve.requests import (
        MAX_BODY_BYTES,
        AdapterFileRequest,
        GenerateRequest,
        WeightsFileRequest,
        parse_json,
    )

    app = FastAPI(title="grpo serve-vllm", docs_url=None, redoc_url=None, openapi_url=None)

    def authorize(authorization: Optional[str] = Header(None)) -> None:
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, f"missing or wrong bearer token (the server's {TOKEN_ENV}, or the token file it "
                                     "wrote for this port)")

    @app.exception_handler(RequestError)
    async def _refused(_request, exc: RequestError):
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=exc.status)

    @app.exception_handler(Exception)
    async def _bug(_request, exc: Exception):  # a bug of ours: the details go to the server's log, not to clients
        ref = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
        logging.getLogger("grpo.serve").error("unexpected error %s", ref, exc_info=exc)
        return JSONResponse({"detail": f"internal error {ref}; the server's log has the details"}, status_code=500)

    guarded = [Depends(authorize)]
    uploads = asyncio.Lock()  # one raw weights upload at a time: a second could fill the disk beside the first

    @app.get("/health")
    def health():
        body = {"status": "ok", "model": engine.model, "weight_version": engine.version,
                "activity": engine.activity}
        reason = engine.dead_reason()
        return JSONResponse({**body, "status": "dead", "detail": reason}, status_code=503) if reason else body

    @app.get("/info", dependencies=guarded)
    def info() -> dict:
        return engine.info()

    @app.post("/generate", dependencies=guarded)
    async def generate(request: Request) -> dict:
        req = parse_json(await _read_body(request, engine.limits.max_body_bytes), GenerateRequest)
        return await run_in_threadpool(engine.generate, req)

    @app.post("/reset_prefix_cache", dependencies=guarded)
    def reset_prefix_cache() -> dict:
        return engine.reset_prefix_cache()

    @app.post("/update_weights", dependencies=guarded)
    async def update_weights(request: Request) -> dict:
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            return await _update_from_body(engine, request, run_in_threadpool, uploads)
        body = parse_json(await _read_body(request, MAX_BODY_BYTES), WeightsFileRequest)
        return await run_in_threadpool(engine.update_weights, body.path, body.version, body.partial)

    @app.post("/update_adapter", dependencies=guarded)
    async def update_adapter(request: Request) -> dict:
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            return await _update_from_body(engine, request, run_in_threadpool, uploads, adapter=True)
        body = parse_json(await _read_body(request, MAX_BODY_BYTES), AdapterFileRequest)
        return await run_in_threadpool(engine.update_adapter, body.path, body.version)

    return app


def _declared(request, limit: int) -> int | None:
    """The body's Content-Length (None when it declares none); 413 past `limit` or unreadable."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(413, f"the body declares {declared} bytes; this route takes at most {limit:,} bytes", "body")
    return None if declared is None else int(declared)


async def _read_body(request, limit: int, sink=None) -> bytes:
    """The body, refused (413) past `limit` bytes whether or not it declares its length; into `sink` if given."""
    _declared(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit:,} bytes, the limit of this route", "body")
        sink.write(chunk) if sink else chunks.append(chunk)
    return b"".join(chunks)


async def _update_from_body(engine: "ServedEngine", request, run_in_threadpool, uploads: asyncio.Lock,
                            adapter: bool = False) -> dict:
    """Raw safetensors bytes -> a file in the server's upload directory (streamed) -> checked -> loaded. One upload
    at a time (409 while another runs), of a declared size that fits the upload directory's disk (507 if not)."""
    from grpo_cli.serve.requests import weight_upload_headers

    version, partial = weight_upload_headers(request.headers)
    if version == engine.version:  # idempotent: do not even read the body
        return {"weight_version": version, "updated": False, "seconds": 0.0}
    if uploads.locked():
        raise RequestError(409, "another weights upload is in progress; the server takes one at a time", "body")
    async with uploads:
        size = _declared(request, engine.limits.max_upload_bytes)
        if size is None:  # the free space is checked before a byte is written
            raise RequestError(411, "a raw weights upload needs a Content-Length header", "Content-Length")
        free = shutil.disk_usage(engine.upload_dir).free
        if size + UPLOAD_HEADROOM > free:
            raise RequestError(507, f"an upload of {size:,} bytes does not fit: {free:,} bytes are free where the "
                                    f"server keeps uploads ({engine.upload_dir}), with {UPLOAD_HEADROOM:,} kept free",
                               "Content-Length")
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=engine.upload_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                await _read_body(request, engine.limits.max_upload_bytes, sink=f)
            if adapter:
                return await run_in_threadpool(engine.update_adapter, path, version, True)
            return await run_in_threadpool(engine.update_weights, path, version, partial, True)
        finally:
            os.unlink(path)


# ---------------------------------------------------------------- serving


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, taken before vLLM loads: a busy port fails in a second, not after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None
    return sock


def _exit_when_dead(engine: "ServedEngine", server, log_path: Path) -> None:
    """Watch the engine; once it is dead, let /health say so for a moment, then stop serving (exit 3)."""
    while not engine.dead_reason():
        if server.should_exit:
            return
        time.sleep(0.5)
    say(f"error: vLLM's engine died ({engine.dead}); /health answers 503; exiting with code {EXIT_ENGINE_DEAD} so "
         f"that a supervisor can restart the server. vLLM's log: {log_path}")
    time.sleep(DEAD_EXIT_DELAY_S)
    server.should_exit = True


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `run_server`, which removes the work directory


def serve(engine: "ServedEngine", sock: socket.socket, token: str, log_path: Path) -> bool:
    """Answer requests until stopped; -> whether the engine died."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(build_app(engine, token), log_level="info"))
    threading.Thread(target=_exit_when_dead, args=(engine, server, log_path), daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn re-raises them once it has stopped: exit 130 / 143
        signal.signal(sig, _exit_on_signal)
    # uvicorn's access log prints method, path and status only, never request headers.
    server.run(sockets=[sock])
    return engine.dead is not None


def run_server(model: str, tp: int, dp: int, host: str, port: int, gpu_memory_utilization: float,
               kv_cache_gib: float | None, max_model_len: int | None, dtype: str, enforce_eager: bool | None, seed: int,
               weights_dir: Path | None, verbose: bool, lora_rank: int = 0) -> None:
    """`grpo serve-vllm`: refuse bad options before vLLM is imported (UsageError, exit 2), start the engine, serve
    until stopped. Exits the process itself with the code of a failure (vLLM's shutdown would wait on processes
    that failed; they die with this one)."""
    token = os.environ.get(TOKEN_ENV) or None
    problem = bind_problem(host, token, dp)
    if weights_dir is not None and not weights_dir.is_dir():
        problem = f"--weights-dir {weights_dir} is not a directory"
    if lora_rank:
        from grpo_cli.serve.adapters import served_rank

        try:
            lora_rank = served_rank(lora_rank)
        except ValueError as e:
            problem = str(e)
    if problem:
        raise UsageError(problem)
    from grpo_cli.errors import UserError
    from grpo_cli.models.loading import VERBOSE_ENV, resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig
    from grpo_cli.serve.engine import start_engine
    from grpo_cli.serve.startup import log_path_for, make_workdir

    if verbose:  # vLLM's engine processes read it too
        os.environ[VERBOSE_ENV] = "1"
    sock = _bind(host, port)
    workdir = make_workdir()  # 0700: the launcher, uploads, the default weights dir
    own_weights_dir = workdir / "weights"
    own_weights_dir.mkdir(mode=0o700)
    wdir = Path(os.path.realpath(weights_dir or own_weights_dir))
    log_path = log_path_for(port)
    code, token_path = 0, None
    try:
        model = resolve_model_source(ModelConfig(name_or_path=model))  # builtin:..., pkg:... as in recipes
        if token:
            auth = f"bearer token from ${TOKEN_ENV}"
        else:  # loopback: a token of its own, in a file only this user can read (grpo_cli/serve/auth.py)
            token, token_path = make_token(port)
            auth = f"bearer token in {token_path} (yours only; a trainer of yours on this machine reads it)"
        engine = start_engine(model, tp, gpu_memory_utilization, max_model_len, dtype, enforce_eager, seed,
                              kv_cache_gib, workdir, wdir, log_path, lora_rank)
        adapters = f"; LoRA adapters up to rank {lora_rank} (POST /update_adapter)" if lora_rank else ""
        say(f"{model} on http://{host}:{port} ({auth}); weight files are read from {wdir}{adapters}")
        code = EXIT_ENGINE_DEAD if serve(engine, sock, token, log_path) else 0
    except UserError as e:  # the work directory goes, and no vLLM shutdown: not the CLI's usual exit
        print(str(e) if str(e).startswith("error:") else f"error: {e}", file=sys.stderr)
        code = e.exit_code
    except KeyboardInterrupt:  # Ctrl-C while vLLM loads
        print("interrupted", file=sys.stderr)
        code = 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if token_path is not None:
            remove_token(token_path, token)
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
