"""Several `grpo serve-vllm` servers as one generator (rollout.vllm.server_url a list), as TRL, verl and OpenRLHF
spread sampling over replicas.

- **Spread.** A generate's rows are cut into one contiguous block per server, as equal as they can be without
  cutting a run of identical prompts (a group's G rows, whose prompt the server's prefix cache then holds once).
  The blocks are requested at once, one thread each, and put back in order.
- **Seeds.** One server seeds prompt i's k-th sample with seed + i*n + k (serve/engine.py); the block that starts
  at prompt j is sent seed + j*n, so every row gets the seed one server would have given it: with the same weights,
  two servers sample what one samples (`tests/rollout/test_vllm_servers.py`). The request seed is the pool's
  (calls counted once per generate), so a resumed run continues it whatever the number of servers.
- **Weights.** Written once (a file, or the LoRA adapter alone where every server takes it), then loaded by every
  server under one version, all at once: by path where a server on this machine can read the file (a hard link into
  its weights directory, a copy where linking fails), else uploaded. After a sync every server answers the same
  version, or the run stops naming the one that does not.
- **Failures.** A request that fails (the server refused it, or never answered within the request timeout; the stall
  watchdog names a server that goes quiet, since each request runs in a thread of its own) stops the run with an
  error naming the server; with rollout.vllm.drop_failed_servers the server is dropped instead, its block sent to the
  next live one (the same seed: the same rows), and `servers/live` logged, until none is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from grpo_cli.datatypes import Rollout
from grpo_cli.errors import VLLMServerError
from grpo_cli.process.watchdog import tick
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.common import Samples, request_seed
from grpo_cli.rollout.vllm_server import SamplesElsewhere, VLLMServerGenerator

log = logging.getLogger(__name__)


def blocks(rows: list[list[int]], parts: int) -> list[tuple[int, int]]:
    """Rows -> at most `parts` contiguous (start, stop) blocks, as equal in size as cuts between runs of identical
    rows allow."""
    starts = [i for i in range(1, len(rows)) if rows[i] != rows[i - 1]]  # where a cut may go
    cuts: list[int] = []
    for k in range(1, parts):
        target = k * len(rows) / parts
        free = [s for s in starts if s > (cuts[-1] if cuts else 0)]
        if free:
            cuts.append(min(free, key=lambda s: (abs(s - target), s)))
    edges = [0, *cuts, len(rows)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


class ServerPool(SamplesElsewhere):
    """Same contract as VLLMServerGenerator, over every server of rollout.vllm.server_url."""

    def __init__(self, tokenizer, rollout_cfg: RolloutConfig, seed: int) -> None:
        self.tokenizer, self.cfg, self.seed = tokenizer, rollout_cfg, seed
        self.drop = rollout_cfg.vllm.drop_failed_servers
        self.live: list[VLLMServerGenerator] = []
        for url in rollout_cfg.vllm.server_urls:
            try:
                self.live.append(VLLMServerGenerator(tokenizer, rollout_cfg, seed, url=url))
            except VLLMServerError as e:
                self._failed(None, e)
        if not self.live:
            raise VLLMServerError("none of rollout.vllm.server_url's servers answered")
        first = self.live[0]
        self.eos_ids, self.pad_id, self.model_hint = first.eos_ids, first.pad_id, first.model_hint
        self.calls = 0  # generate() and sample() calls: request seeds derive from (seed, calls)
        self.sync_bytes = 0
        self.sync_note: str | None = None
        self._threads = ThreadPoolExecutor(max_workers=len(rollout_cfg.vllm.server_urls),
                                           thread_name_prefix="grpo-servers")

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self.live]

    @property
    def version(self) -> int:
        return max(c.version for c in self.live)

    def metrics(self) -> dict[str, float]:
        return {"servers/live": float(len(self.live))}

    # ------------------------------------------------------------ sampling
    def generate(self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
                 temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows, the prompts spread over the
        servers."""
        seed = request_seed(self.seed, self.calls)
        self.calls += 1
        sampling = dict(greedy=greedy, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        parts = self._spread(prompt_ids, lambda c, a, b: c.samples(prompt_ids[a:b], n, seed + a * n, **sampling))
        return self.live[0].rollout_of(prompt_ids, prompts, n, [s for part in parts for s in part])

    def sample(self, token_ids: list[list[int]], max_new_tokens: list[int], *, greedy: bool = False,
               temperature: float | None = None, top_p: float | None = None, logprobs: bool = True) -> Samples:
        """Each token sequence continued by at most its own budget (multi-turn episodes), spread as generate."""
        seed = request_seed(self.seed, self.calls)
        self.calls += 1
        sampling = dict(greedy=greedy, temperature=temperature, top_p=top_p, max_new_tokens=max(max_new_tokens))
        parts = self._spread(token_ids, lambda c, a, b: c.samples(token_ids[a:b], 1, seed + a, **sampling))
        return self.live[0].samples_of([s for part in parts for s in part], max_new_tokens)

    def _spread(self, rows: list[list[int]], request: Callable[[VLLMServerGenerator, int, int], list]) -> list[list]:
        """`request(server, start, stop)` for each block of `rows`, a server each, at once -> the results in order.
        A failed block goes to the next live server where failed servers are dropped."""
        spans = blocks(rows, len(self.live))
        results: dict[int, list] = {}
        pending = {self._threads.submit(request, server, a, b): (i, server)
                   for (i, (a, b)), server in zip(enumerate(spans), list(self.live))}
        for i, server, future in self._settled(pending):
            try:
                results[i] = future.result()
            except VLLMServerError as e:
                self._failed(server, e)  # raises unless the server can be dropped
                other = self.live[i % len(self.live)]
                pending[self._threads.submit(request, other, *spans[i])] = (i, other)
        return [results[i] for i in range(len(spans))]

    @staticmethod
    def _settled(pending: dict[Future, tuple[Any, VLLMServerGenerator]]) -> Iterator[tuple]:
        """(key, server, future) of each request of `pending` as it ends (a caller may add requests meanwhile). The
        calling thread waits on the requests' threads, which the watchdog watches, so its own wait is progress."""
        while pending:
            done, _ = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
            tick()
            for future in done:
                key, server = pending.pop(future)
                yield key, server, future

    def _failed(self, server: VLLMServerGenerator | None, error: VLLMServerError) -> None:
        """A server failed: raise, or (rollout.vllm.drop_failed_servers, another one left) drop it."""
        others = [c for c in self.live if c is not server]
        if not self.drop or (server is not None and not others):
            raise error
        if server is not None:
            self.live = others
        log.warning("dropped a vLLM server (rollout.vllm.drop_failed_servers): %s; %d left", error, len(self.live))

    # ------------------------------------------------------------ weights (SamplesElsewhere.sync_weights: write, load)
    @torch.no_grad()
    def write_weights(self, model: torch.nn.Module) -> str:
        """The weights in one file, in the first server's weights directory where it has one here: the LoRA adapter
        alone where every server takes it (rollout.vllm.lora_sync), else the merged weights."""
        first = self.live[0]
        if first.adapter_sync is None:
            choices = [c._syncs_adapter(model) for c in self.live]
            if len(set(choices)) > 1:  # one file for all: merged, which every server takes
                for c in self.live:
                    c.adapter_sync = False
                first.sync_note = "merged weights synced (not every server serves adapters of this rank)"
            self.sync_note = first.sync_note
        return first.write_weights(model)

    def load_weights(self, path: str) -> None:
        """Every live server loads the file as the same next version, at once; -> when all answer that version."""
        version, size = self.version + 1, os.path.getsize(path)
        copies = [path] + [self._copy_for(c, path) for c in self.live[1:]]
        servers = list(self.live)
        for c in servers:
            c.version = version - 1  # each asks for `version` (c.load_weights sends version + 1)
        pending = {self._threads.submit(c.load_weights, p): (None, c) for c, p in zip(servers, copies)}
        try:
            for _, server, future in self._settled(pending):
                try:
                    future.result()
                except VLLMServerError as e:
                    self._failed(server, e)  # dropped: it holds other weights now
        finally:
            for p in copies:
                with contextlib.suppress(OSError):
                    os.unlink(p)
        behind = [c for c in self.live if c.version != version]
        if behind:
            raise VLLMServerError(f"after the weight sync to version {version}, grpo serve-vllm at "
                                  f"{', '.join(f'{c.url} (version {c.version})' for c in behind)} does not hold it")
        self.sync_bytes = size

    @staticmethod
    def _copy_for(server: VLLMServerGenerator, path: str) -> str:
        """The weight file where `server` reads it: a hard link (or copy) into its weights directory on this machine;
        elsewhere a copy to upload (server.load_weights deletes the one it is given)."""
        folder = server._server_weights_dir() if server.loopback else None
        for where in ([folder] if folder else []) + [tempfile.gettempdir()]:
            fd, target = tempfile.mkstemp(prefix=Path(path).name.split(".")[0] + "-", suffix=".safetensors", dir=where)
            os.close(fd)
            os.unlink(target)
            try:
                os.link(path, target)
                return target
            except OSError:
                try:
                    shutil.copyfile(path, target)
                    return target
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(target)
        raise VLLMServerError(f"could not copy the weight file {path} for grpo serve-vllm at {server.url}")

    # ------------------------------------------------------------ the rest of the contract
    def reset_prefix_cache(self) -> None:
        for c in self.live:
            c.reset_prefix_cache()

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state.get("calls", 0))

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    def __getattr__(self, name: str) -> Any:  # e.g. `info`, `health`: the first live server's
        if name.startswith("__") or name in ("live",):
            raise AttributeError(name)
        return getattr(self.live[0], name)


def build_server_generator(cfg: RolloutConfig, *, tokenizer, seed: int, **_: Any):
    """BACKENDS["vllm-server"]'s builder: a client of `grpo serve-vllm` (rollout.vllm.server_url), or a pool of one
    for each of several."""
    if len(cfg.vllm.server_urls) == 1:
        return VLLMServerGenerator(tokenizer, cfg, seed)
    return ServerPool(tokenizer, cfg, seed)
