"""Rollouts from a `grpo serve-vllm` process over HTTP ("server" mode), weights pushed after each step.

Every request carries a timeout (`rollout.vllm.request_timeout_s`; /health a short one) and the server's bearer
token (the transport: rollout/server_http.py). Retries, with exponential backoff and never past the request's own
timeout in total:
  - /health, /reset_prefix_cache and /update_weights (re-sending the same version is a no-op on the
    server): retried on connection errors and timeouts;
  - /generate: retried only when the connection was refused, i.e. the request never reached the
    server; a timeout or a dropped connection after sending is an error, since the server may still
    be sampling and a retry would silently double the work.
Each generate names the weight version it expects; the server answers 409 instead of sampling from
stale weights. Weights go by file when the server is on this machine: the client writes them into
the directory the server announces (GET /info) and reads files from; when it cannot write there (a
server run by another user, in a container) or the server cannot see the file, the bytes are uploaded.
With LoRA and a server started with --lora-rank, only the adapter goes (POST /update_adapter, a few MB instead of
the merged model; rollout.vllm.lora_sync), the same two ways.
Sampler log-probs are vLLM's processed log-probs, log pi(token | T) (see serve/server.py).
The stdlib (urllib) only: no HTTP client to install in the trainer's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from grpo_cli.datatypes import Rollout
from grpo_cli.errors import VLLMServerError
from grpo_cli.models.lora import export_state_dict, is_peft_model
from grpo_cli.process.watchdog import progress_of
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.common import (
    GenerationConfigOf,
    Samples,
    build_rollout,
    completion_mask_from_eos,
    eos_token_ids,
    pad_completions,
    pad_id_of,
    request_seed,
    samples_from,
)
from grpo_cli.rollout.server_http import ServerHTTP
from grpo_cli.serve.adapters import CONFIG_KEY, base_mismatch, fingerprint, unservable
from grpo_cli.serve.auth import is_loopback

ADAPTER_PREFIX = "grpo-adapter-"  # an adapter's file name starts so (load_weights sends it to /update_adapter)


class SamplesElsewhere:
    """A generator whose engine runs in another process (`grpo serve-vllm`): nothing to free while the trainer
    updates, and a sync is a weight file written (`write_weights`) and then loaded (`load_weights`)."""

    sync_note: str | None = None  # the start line's words about how weights travel

    def prepare(self, rows: int, prompt_width: int | None) -> str | None:
        """The start line's words about how weights travel (LoRA: the adapter alone or merged, and why)."""
        return self.sync_note

    def sleep(self) -> None:
        """Only the colocated vLLM engine frees memory during the update."""

    def wake_up(self) -> None:
        pass

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> float:
        """Push the trainer's weights (the unwrapped HF model) as the next version; -> seconds."""
        t0 = time.perf_counter()
        self.load_weights(self.write_weights(model))
        return time.perf_counter() - t0


class VLLMServerGenerator(SamplesElsewhere):
    """Same contract as HFGenerator.generate, sampling on a `grpo serve-vllm` server."""

    def __init__(self, tokenizer, rollout_cfg: RolloutConfig, seed: int, url: str | None = None) -> None:
        """`url`: the server's (default: rollout.vllm.server_url's first)."""
        self.tokenizer, self.cfg, self.seed = tokenizer, rollout_cfg, seed
        self.model_hint = getattr(tokenizer, "name_or_path", None) or "MODEL"
        url = url or rollout_cfg.vllm.server_urls[0]
        self.http = ServerHTTP(url, rollout_cfg.vllm.request_timeout_s, self.model_hint)
        self.url = self.http.url
        self.loopback = is_loopback(urlparse(self.url).hostname or "")
        self.eos_ids = eos_token_ids(GenerationConfigOf(self.model_hint), tokenizer)
        self.pad_id = pad_id_of(tokenizer, self.eos_ids)
        self.calls = 0  # generate() calls so far: request seeds derive from (seed, calls)
        self.weights_dir: str | None = None  # where the (loopback) server reads weight files from
        self._asked_weights_dir = False
        self._info: dict | None = None  # GET /info, asked once
        self.sync_bytes = 0  # the weight file the last sync sent (by path or uploaded)
        self.adapter_sync: bool | None = None  # LoRA adapter alone (True) or merged weights; chosen at the first sync
        self.sync_note: str | None = None  # the start line's words about that choice
        # The server's weights are the trainer's only after a sync: a resumed run must call sync_weights first.
        self.version = int(self.health()["weight_version"])

    # ------------------------------------------------------------ public API

    def health(self) -> dict:
        return self.http.request("GET", "/health", doing="checking its health", timeout=self.http.short_timeout)

    def generate(
        self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
        temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
    ) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows (as HFGenerator)."""
        seed = request_seed(self.seed, self.calls)
        self.calls += 1
        samples = self.samples(prompt_ids, n, seed, greedy=greedy, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens)
        return self.rollout_of(prompt_ids, prompts, n, samples)

    def samples(self, prompt_ids: list[list[int]], n: int, seed: int, **sampling: Any) -> list[dict]:
        """One /generate request: B prompts -> their B*n samples ({"token_ids", "logprobs"}), prompt i's k-th drawn
        with seed + i*n + k (serve/engine.py)."""
        body = self._generate_body(prompt_ids, n, seed=seed, **sampling)
        out = self.http.request("POST", "/generate", doing="generating", payload=body, idempotent=False)
        return [s for per_prompt in out["outputs"] for s in per_prompt]  # [B*n]

    def rollout_of(self, prompt_ids: list[list[int]], prompts: list[str], n: int, samples: list[dict]) -> Rollout:
        completion_ids, cmask, logps = self._pad_completions(samples)
        truncated = completion_mask_from_eos(completion_ids, self.eos_ids)[1]
        return build_rollout(prompt_ids, prompts, n, completion_ids, cmask, truncated, self.tokenizer, self.pad_id, logps)

    def sample(self, token_ids: list[list[int]], max_new_tokens: list[int], *, greedy: bool = False,
               temperature: float | None = None, top_p: float | None = None, logprobs: bool = True) -> Samples:
        """Each token sequence continued by at most its own budget (multi-turn episodes): one request to the
        largest budget, each row cut to its own."""
        seed = request_seed(self.seed, self.calls)
        self.calls += 1
        samples = self.samples(token_ids, 1, seed, greedy=greedy, temperature=temperature, top_p=top_p,
                               max_new_tokens=max(max_new_tokens))
        return self.samples_of(samples, max_new_tokens)

    def samples_of(self, samples: list[dict], max_new_tokens: list[int]) -> Samples:
        return samples_from([s["token_ids"] for s in samples], [s["logprobs"] for s in samples], max_new_tokens,
                            self.eos_ids)

    @torch.no_grad()
    def write_weights(self, model: torch.nn.Module) -> str:
        """First half of a sync: the weights as they are now, in a file (in the server's weights directory when
        it is on this machine and lets us write there) -> its path, for `load_weights`, which deletes it."""
        from safetensors.torch import save_file

        adapter = self._syncs_adapter(model)
        state, metadata = _adapter_state(model) if adapter else (_unshared_cpu_state(model), None)
        prefix = ADAPTER_PREFIX if adapter else "grpo-weights-"
        wdir = self._server_weights_dir() if self.loopback else None
        path = None
        if wdir is not None:
            try:
                fd, path = tempfile.mkstemp(prefix=prefix, suffix=".safetensors", dir=wdir)
                os.close(fd)
            except OSError:  # not writable by this user, or gone (a restarted server): ask again next time
                self._asked_weights_dir, path = False, None
        if path is None:
            fd, path = tempfile.mkstemp(prefix=prefix, suffix=".safetensors")
            os.close(fd)
        try:
            with progress_of(lambda: os.path.getsize(path)):  # a slow disk: the file grows all the while
                save_file(state, path, metadata=metadata)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return path

    def load_weights(self, path: str) -> None:
        """Second half: the server loads the file as version+1 (by path when it can see it, else uploaded); an
        adapter's file (its name says so) goes to /update_adapter."""
        version, size = self.version + 1, os.path.getsize(path)
        route = "/update_adapter" if Path(path).name.startswith(ADAPTER_PREFIX) else "/update_weights"
        try:
            out = None
            if self.weights_dir is not None and Path(path).parent == Path(self.weights_dir):
                try:
                    out = self.http.request("POST", route, doing="updating the weights",
                                            payload={"path": path, "version": version})
                except VLLMServerError as e:
                    if e.status not in (400, 403):
                        raise
                    self._asked_weights_dir = False  # the server does not see this file (another mount namespace)
            if out is None:
                out = self.http.upload(path, version, route)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.version, self.sync_bytes = int(out["weight_version"]), size

    def state_dict(self) -> dict:
        """What a resumed run needs to sample as this one would have: the request seeds' counter."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state.get("calls", 0))

    def _server_weights_dir(self) -> str | None:
        if not self._asked_weights_dir:
            self.weights_dir = self.info().get("weights_dir")
            self._asked_weights_dir = True
        return self.weights_dir

    def info(self) -> dict:
        """GET /info, asked once ({} from a server without it, which takes uploads and no adapters)."""
        if self._info is None:
            try:
                self._info = self.http.request("GET", "/info", doing="asking what it accepts",
                                               timeout=self.http.short_timeout)
            except VLLMServerError as e:
                if e.status != 404:
                    raise
                self._info = {}
        return self._info

    def _syncs_adapter(self, model: torch.nn.Module) -> bool:
        """Whether syncs send the LoRA adapter alone: decided at the first sync (rollout.vllm.lora_sync, the
        server's --lora-rank, what vLLM can serve); `sync_note` says which and why."""
        if self.adapter_sync is None:
            setting = self.cfg.vllm.lora_sync
            if not is_peft_model(model) or setting == "merged":
                self.adapter_sync = False
                if is_peft_model(model):
                    self.sync_note = "merged weights synced (rollout.vllm.lora_sync: merged)"
                return False
            info = self.info()
            why = unservable(model.peft_config["default"].to_dict(), int(info.get("lora_rank") or 0),
                             bool(info.get("base_replaced")))
            base = model.get_base_model().get_input_embeddings().weight
            if why is None and (differs := base_mismatch(fingerprint(base), info.get("base_fingerprint"))):
                why = (f"the server's base model ({info.get('model')}) is not the trainer's ({self.model_hint}): "
                       f"{differs}; an adapter on it would sample another policy")
            if why is not None and setting == "adapter":
                raise VLLMServerError(f"rollout.vllm.lora_sync adapter: grpo serve-vllm at {self.url} cannot take "
                                      f"this adapter ({why}); start it with --lora-rank "
                                      f"{model.peft_config['default'].r}, or set rollout.vllm.lora_sync merged")
            self.adapter_sync = why is None
            self.sync_note = "the LoRA adapter synced alone" if why is None else \
                f"merged weights synced ({why}; `grpo serve-vllm --lora-rank R` takes the adapter alone)"
        return self.adapter_sync

    def reset_prefix_cache(self) -> None:
        self.http.request("POST", "/reset_prefix_cache", doing="resetting the prefix cache", payload={})

    def close(self) -> None:
        """Nothing held between requests (one connection per request); the server keeps running."""

    # ------------------------------------------------------------ request bodies and responses

    def _generate_body(self, prompt_ids, n, *, seed: int, greedy: bool = False, temperature: float | None = None,
                       top_p: float | None = None, max_new_tokens: int | None = None) -> dict:
        """vLLM seeds prompt i's k-th sample with seed + i*n + k, so no two rows share a seed."""
        c = self.cfg
        return {
            "prompt_token_ids": [list(map(int, p)) for p in prompt_ids], "n": n,
            "temperature": 0.0 if greedy else (temperature or c.temperature),
            "top_p": 1.0 if greedy else (top_p or c.top_p),
            "top_k": None if greedy else c.top_k, "min_p": None if greedy else c.min_p,
            "repetition_penalty": c.repetition_penalty, "max_tokens": max_new_tokens or c.max_completion_length,
            "seed": seed,
            "stop_token_ids": self.eos_ids, "expected_version": self.version,
            **({"sampling_kwargs": c.generation_kwargs} if c.generation_kwargs else {}),
            **({"structured_outputs_regex": c.vllm.structured_outputs_regex} if c.vllm.structured_outputs_regex else {}),
        }

    def _pad_completions(self, samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Server samples -> ids [N, T] (pad after the first EOS), mask [N, T], sampler logps [N, T] float32."""
        return pad_completions([s["token_ids"] for s in samples], [s["logprobs"] for s in samples], self.pad_id, self.eos_ids)


def _adapter_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """peft's adapter tensors on the CPU (its save_pretrained names) and its adapter_config.json as the file's
    metadata (grpo_cli/serve/adapters.py)."""
    from peft import get_peft_model_state_dict

    state = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    return state, {CONFIG_KEY: json.dumps(config, default=lambda x: sorted(x) if isinstance(x, set) else str(x))}


def _unshared_cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict on the CPU, tied tensors (embed_tokens / lm_head) copied: safetensors refuses shared storage."""
    out, seen = {}, set()
    for k, v in export_state_dict(model).items():  # LoRA adapters merged
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out
