"""`grpo serve-vllm`: one vLLM engine behind a small HTTP API that a GRPO trainer drives.

Routes (JSON; every route but /health needs `Authorization: Bearer $GRPO_SERVER_TOKEN` when the
variable is set):
  GET  /health              200 {"status": "ok", "model": ..., "weight_version": v}; 503 {"status": "dead"}
                            once the engine died (the server then exits with code 3)
  GET  /info                weights directory, limits, context length, vocabulary size, KV cache
  POST /generate            token ids in, n completions per prompt out (token ids + sampler log-probs);
                            409 when `expected_version` is not the loaded weight version
  POST /update_weights      {"path": "<weights dir>/file.safetensors", "version": v, "partial": false}, or
                            the raw safetensors bytes (application/octet-stream, headers X-Weight-Version
                            and optionally X-Weight-Partial: true); re-sending the loaded version is a
                            no-op; resets the prefix cache
  POST /reset_prefix_cache

Nothing a client sends can break the engine: requests are checked field by field (requests.py) and
weight files tensor by tensor (weights.py) before vLLM sees them; a refusal is a 4xx whose `detail`
starts with the field or names the tensor. Log-probs are vLLM's `processed_logprobs`: after
temperature (and top-k/top-p), i.e. log pi(. | T), what the trainer's `token_logprobs(...,
temperature=T)` computes. vLLM's own API server is not used: its dev routes (/collective_rpc, ...)
are not guarded by its --api-key. Requests are served one at a time (a lock around the engine);
/health answers while a request runs. Exit codes: 1 vLLM failed to start, 2 refused options
(nothing loaded), 3 the engine died while serving, 130 / 143 stopped by SIGINT / SIGTERM.
"""

import hmac
import ipaddress
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
from typing import Annotated, Any, Optional

import typer

from grpo_cli.serve.errors import RequestError

log = logging.getLogger("grpo.serve")

TOKEN_ENV = "GRPO_SERVER_TOKEN"
WORKER_EXTENSION = "grpo_cli.rollout.vllm_worker.WeightSyncExtension"
EXIT_ENGINE_DEAD = 3
DEAD_EXIT_DELAY_S = 2.0  # /health answers 503 this long before the server exits


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
    """A vLLM `LLM` with a lock, the version of the weights it holds (0 = the model folder's) and what
    it accepts. `spec` is None when the model's tensor names could not be read: updates are refused."""

    def __init__(self, llm: Any, model: str, limits: Any, spec: Any, weights_dir: Path,
                 upload_dir: Path, kv_cache_bytes: int | None = None, spec_problem: str = "") -> None:
        self.llm, self.model, self.limits, self.spec = llm, model, limits, spec
        self.weights_dir, self.upload_dir, self.kv_cache_bytes = weights_dir, upload_dir, kv_cache_bytes
        self.spec_problem = spec_problem
        self.version = 0
        self.lock = threading.Lock()
        self.dead: str | None = None  # why the engine is unusable

    def info(self) -> dict:
        lim = self.limits
        return {"model": self.model, "weight_version": self.version, "weights_dir": str(self.weights_dir),
                "max_model_len": lim.max_model_len, "vocab_size": lim.vocab_size, "kv_cache_bytes": self.kv_cache_bytes,
                "max_sequences": lim.max_sequences, "max_body_bytes": lim.max_body_bytes,
                "max_upload_bytes": lim.max_upload_bytes, "tensors": len(self.spec.shapes) if self.spec else None}

    def dead_reason(self) -> str | None:
        if self.dead is None:
            self.dead = _engine_dead(self.llm)
        return self.dead

    def generate(self, req: "GenerateRequest") -> dict:  # noqa: F821 (imported lazily: `grpo --help` stays fast)
        from grpo_cli.serve.requests import check_generate

        check_generate(req, self.limits)
        with self.lock:
            self._alive()
            self._check_version(req.expected_version)
            prompts = [{"prompt_token_ids": ids} for ids in req.prompt_token_ids]
            params = [_sampling_params(req, seed_offset=i * req.n) for i in range(len(prompts))]
            outs = self._call("generating", self.llm.generate, prompts, params, use_tqdm=False)
            return {"weight_version": self.version, "outputs": [_completions(o) for o in outs]}

    def update_weights(self, path: str, version: int, partial: bool = False, uploaded: bool = False) -> dict:
        """Load a safetensors file as weight version `version` once it passed every check (weights.py)."""
        from grpo_cli.serve.weights import authorize_path, check_weights_file

        with self.lock:
            self._alive()
            if version == self.version:
                return {"weight_version": self.version, "updated": False, "seconds": 0.0}
            if version < self.version:
                raise RequestError(409, f"weight version {version} is older than the loaded version {self.version}")
            real = Path(path) if uploaded else authorize_path(path, self.weights_dir)
            if self.spec is None:
                raise RequestError(422, f"weight updates are off: {self.spec_problem}", "weights")
            count = check_weights_file(real, self.spec, partial)
            t0 = time.perf_counter()
            self._call("loading weights", self.llm.collective_rpc, "grpo_load_weights_from_file",
                       args=(str(real), version))
            self._call("resetting the prefix cache", self.llm.reset_prefix_cache)  # KV computed with the old weights
            self.version = version
            return {"weight_version": version, "updated": True, "seconds": time.perf_counter() - t0, "tensors": count}

    def reset_prefix_cache(self) -> dict:
        with self.lock:
            self._alive()
            return {"reset": bool(self._call("resetting the prefix cache", self.llm.reset_prefix_cache))}

    def _alive(self) -> None:
        if self.dead_reason():
            raise RequestError(503, f"{self.dead}; the server is exiting so that it can be restarted")

    def _check_version(self, expected: int | None) -> None:
        if expected is not None and expected != self.version:
            raise RequestError(
                409,
                f"stale weights: the request expects weight version {expected} but the server holds "
                f"version {self.version}; sync the weights (POST /update_weights) before generating",
            )

    def _call(self, doing: str, fn, *args, **kwargs):
        """Call vLLM. A request it refuses up front is the client's (400); anything else may have left
        the engine with a half-done request or a dead process, so the engine counts as dead."""
        from vllm.exceptions import VLLMValidationError

        try:
            return fn(*args, **kwargs)
        except VLLMValidationError as e:
            raise RequestError(400, f"vLLM refused the request: {e}") from e
        except Exception as e:
            log.exception("vLLM failed while %s", doing)
            self.dead = _engine_dead(self.llm) or f"vLLM failed while {doing} ({type(e).__name__}: {str(e)[:300]})"
            raise RequestError(503, f"{self.dead}; the server is exiting so that it can be restarted") from e


def _engine_dead(llm: Any) -> str | None:
    """Whether vLLM itself knows its engine is gone: the engine-core process (multiprocess engine)
    or a worker process (tensor parallel) died."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if getattr(getattr(core, "resources", None), "engine_dead", False):
        return "vLLM's engine-core process died"
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    if getattr(executor, "is_failed", False):
        return "a vLLM worker process died"
    return None


def _sampling_params(req: "GenerateRequest", seed_offset: int):  # noqa: F821
    """One prompt's SamplingParams. vLLM seeds the n samples seed, seed+1, ... so rows never share a seed."""
    from vllm import SamplingParams

    own = dict(
        n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k or 0,
        min_p=req.min_p or 0.0, repetition_penalty=req.repetition_penalty,
        max_tokens=req.max_tokens, seed=None if req.seed is None else req.seed + seed_offset,
        stop_token_ids=req.stop_token_ids or None, logprobs=0, detokenize=False,
    )
    extra = req.sampling_kwargs or {}
    if clash := sorted(set(extra) & set(own)):
        raise RequestError(422, f"may not set {', '.join(clash)}: the request has fields for them", "sampling_kwargs")
    if req.structured_outputs_regex is not None:
        from grpo_cli.rollout.vllm_colocate import structured_outputs

        extra = {**extra, **structured_outputs(req.structured_outputs_regex)}
    try:
        return SamplingParams(**own, **extra)
    except (TypeError, ValueError) as e:
        raise RequestError(422, f"vLLM's SamplingParams refused them ({type(e).__name__}: {str(e)[:300]})",
                           "sampling_kwargs") from None


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

    from grpo_cli.serve.requests import MAX_BODY_BYTES, GenerateRequest, WeightsFileRequest, parse_json

    app = FastAPI(title="grpo serve-vllm", docs_url=None, redoc_url=None, openapi_url=None)

    def authorize(authorization: Optional[str] = Header(None)) -> None:
        if token is None:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, f"missing or wrong bearer token (the server's {TOKEN_ENV})")

    @app.exception_handler(RequestError)
    async def _refused(_request, exc: RequestError):
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=exc.status)

    @app.exception_handler(Exception)
    async def _bug(_request, exc: Exception):  # a bug of ours: say what, not just "Internal Server Error"
        log.error("unexpected error", exc_info=exc)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    guarded = [Depends(authorize)]

    @app.get("/health")
    def health():
        body = {"status": "ok", "model": engine.model, "weight_version": engine.version}
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
            return await _update_from_body(engine, request, run_in_threadpool)
        body = parse_json(await _read_body(request, MAX_BODY_BYTES), WeightsFileRequest)
        return await run_in_threadpool(engine.update_weights, body.path, body.version, body.partial)

    return app


async def _read_body(request, limit: int, sink=None) -> bytes:
    """The body, refused (413) past `limit` bytes whether or not it declares its length; into `sink` if given."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(413, f"the body declares {declared} bytes; this route takes at most {limit:,} bytes", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit:,} bytes, the limit of this route", "body")
        sink.write(chunk) if sink else chunks.append(chunk)
    return b"".join(chunks)


async def _update_from_body(engine: Engine, request, run_in_threadpool) -> dict:
    """Raw safetensors bytes -> a file in the server's upload directory (streamed) -> checked -> loaded."""
    from grpo_cli.serve.requests import weight_upload_headers

    version, partial = weight_upload_headers(request.headers)
    if version == engine.version:  # idempotent: do not even read the body
        return {"weight_version": version, "updated": False, "seconds": 0.0}
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=engine.upload_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            await _read_body(request, engine.limits.max_upload_bytes, sink=f)
        return await run_in_threadpool(engine.update_weights, path, version, partial, True)
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- the command


def start_engine(model: str, tp: int, gpu_memory_utilization: float, max_model_len: int | None, dtype: str,
                 enforce_eager: bool | None, seed: int, kv_cache_gib: float | None, workdir: Path,
                 weights_dir: Path, log_path: Path) -> Engine:
    """Checks that need no vLLM (exit 2), then vLLM with its output in `log_path` (failure: exit 1)."""
    import psutil
    import torch

    from grpo_cli.models.loading import quiet_vllm
    from grpo_cli.rollout.vllm_colocate import eager_default
    from grpo_cli.serve import startup

    quiet_vllm(level=None)  # vLLM's INFO lines stay (in its log file), each distinct one once (--verbose: all)

    on_gpu = torch.cuda.is_available()
    shape = startup.model_shape(model, max_model_len)
    os.environ.update(startup.check_tp(tp, shape, on_gpu, torch.cuda.device_count() if on_gpu else 0))
    if kv_cache_gib is not None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU platform would override the flag with it
    kv = startup.plan_kv_cache(shape, dtype, tp, kv_cache_gib, on_gpu, psutil.virtual_memory().available)
    _say(kv.message)
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ and tp > 1 and not on_gpu:
        _say(f"--tp {tp} on CPU: worker cores {os.environ['VLLM_CPU_OMP_THREADS_BIND']} (VLLM_CPU_OMP_THREADS_BIND)")
    warning = startup.die_with_this_process(workdir)
    if warning:
        _say(f"warning: {warning}")
    _say(f"starting vLLM (its output: {log_path}) ...")
    t0 = time.perf_counter()
    try:
        with startup.output_to(log_path):
            engine = _load(model, tp, gpu_memory_utilization, max_model_len, dtype, eager_default(enforce_eager),
                           seed, kv.bytes, workdir, weights_dir)
    except Exception as e:
        raise startup.StartError(startup.start_failure(model, e, log_path), code=1) from None
    engine.kv_cache_bytes = kv.size
    _say(f"vLLM ready in {time.perf_counter() - t0:.1f} s")
    return engine


def _load(model, tp, gpu_memory_utilization, max_model_len, dtype, enforce_eager, seed, kv_bytes,
          workdir: Path, weights_dir: Path) -> Engine:
    from vllm import LLM, SamplingParams

    from grpo_cli.serve.requests import ServerLimits
    from grpo_cli.serve.weights import weight_spec

    llm = LLM(
        model=model, tensor_parallel_size=tp, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
        worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs", kv_cache_memory_bytes=kv_bytes,
    )
    # the first request pays for lazy initialisation (seconds on CPU): not the trainer's first, with its timeout
    llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1), use_tqdm=False)
    config = llm.llm_engine.model_config
    spec, problem = None, ""
    try:
        spec = weight_spec(model, llm.collective_rpc("grpo_packed_modules")[0])
    except Exception as e:  # an architecture transformers cannot build: serving still works
        problem = f"the server could not list the model's tensors at start ({type(e).__name__}: {e})"
    limits = ServerLimits(vocab_size=config.get_vocab_size(), max_model_len=config.max_model_len,
                          max_upload_bytes=(spec.numel * 4 if spec else 0) + 16 * 2**20)
    upload_dir = workdir / "uploads"
    upload_dir.mkdir(mode=0o700)
    return Engine(llm, model, limits, spec, weights_dir, upload_dir, spec_problem=problem)


def _say(message: str) -> None:
    typer.echo(f"grpo serve-vllm: {message}", err=True)


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, taken before vLLM loads: a busy port fails in a second, not after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        typer.echo(f"error: cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host", err=True)
        raise typer.Exit(2)
    return sock


def _exit_when_dead(engine: Engine, server, log_path: Path) -> None:
    """Watch the engine; once it is dead, let /health say so for a moment, then stop serving (exit 3)."""
    while not engine.dead_reason():
        if server.should_exit:
            return
        time.sleep(0.5)
    _say(f"error: vLLM's engine died ({engine.dead}); /health answers 503; exiting with code {EXIT_ENGINE_DEAD} so "
         f"that a supervisor can restart the server. vLLM's log: {log_path}")
    time.sleep(DEAD_EXIT_DELAY_S)
    server.should_exit = True


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `command`, which removes the work directory


def serve(engine: Engine, sock: socket.socket, token: str | None, log_path: Path) -> bool:
    """Answer requests until stopped; -> whether the engine died."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(build_app(engine, token), log_level="info"))
    threading.Thread(target=_exit_when_dead, args=(engine, server, log_path), daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn re-raises them once it has stopped: exit 130 / 143
        signal.signal(sig, _exit_on_signal)
    # uvicorn's access log prints method, path and status only, never request headers.
    server.run(sockets=[sock])
    return engine.dead is not None


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
    verbose: Annotated[bool, typer.Option("--verbose", help="Every line vLLM logs (default: each distinct line once; vLLM repeats some at every request and weight update).")] = False,
) -> None:
    """Serve a vLLM engine for `rollout.backend: vllm` with `rollout.vllm.mode: server`.

    Examples:

      grpo serve-vllm --model Qwen/Qwen2.5-0.5B-Instruct

      GRPO_SERVER_TOKEN=$SECRET grpo serve-vllm --model /models/qwen --host 0.0.0.0 --tp 2

      grpo serve-vllm --model ./my-model --dtype bfloat16 --kv-cache-gib 2

    A secret: python -c 'import secrets; print(secrets.token_urlsafe(32))'. The trainer needs the
    same GRPO_SERVER_TOKEN and rollout.vllm.server_url=http://HOST:PORT. Exit codes: 1 vLLM failed to
    start (the message names the log), 2 refused options, 3 the engine died while serving (/health
    answered 503 before), 130 / 143 stopped by SIGINT / SIGTERM.
    """
    token = os.environ.get(TOKEN_ENV) or None
    problem = bind_problem(host, token, dp)
    if weights_dir is not None and not weights_dir.is_dir():
        problem = f"--weights-dir {weights_dir} is not a directory"
    if problem:  # checked before vLLM is even imported
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    from grpo_cli.models.loading import VERBOSE_ENV, ModelLoadError, resolve_model_source
    from grpo_cli.recipe.schema import ModelConfig

    if verbose:  # vLLM's engine processes read it too
        os.environ[VERBOSE_ENV] = "1"
    from grpo_cli.serve.startup import StartError, log_path_for, make_workdir

    sock = _bind(host, port)
    workdir = make_workdir()  # 0700: the launcher, uploads, the default weights dir
    own_weights_dir = workdir / "weights"
    own_weights_dir.mkdir(mode=0o700)
    wdir = Path(os.path.realpath(weights_dir or own_weights_dir))
    log_path = log_path_for(port)
    code = 0
    try:
        model = resolve_model_source(ModelConfig(name_or_path=model))  # builtin:..., pkg:... as in recipes
        engine = start_engine(model, tp, gpu_memory_utilization, max_model_len, dtype, enforce_eager, seed,
                              kv_cache_gib, workdir, wdir, log_path)
        auth = "bearer token from $GRPO_SERVER_TOKEN" if token else "no authentication (loopback only)"
        _say(f"{model} on http://{host}:{port} ({auth}); weight files are read from {wdir}")
        code = EXIT_ENGINE_DEAD if serve(engine, sock, token, log_path) else 0
    except (StartError, ModelLoadError) as e:
        typer.echo(str(e) if str(e).startswith("error:") else f"error: {e}", err=True)
        code = getattr(e, "code", 2)
    except KeyboardInterrupt:  # Ctrl-C while vLLM loads
        typer.echo("interrupted", err=True)
        code = 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if code:  # skip vLLM's shutdown, which waits on processes that failed; they die with this one
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """`python -m grpo_cli.serve.app --model ...` without the grpo CLI."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    app()


if __name__ == "__main__":
    main()
