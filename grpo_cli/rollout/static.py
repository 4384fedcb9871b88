"""Compiled decoding for the hf backend (`rollout.compile`): a static key/value cache made once per run and
transformers' torch.compile of the decode step.

Decoding a small model with eager PyTorch is bound by kernel launches and Python, not by the GPU (44 ms a decode
step for Qwen2.5-0.5B's 32 rows on an H100, whose weights the GPU reads in 0.3 ms). transformers compiles the decode
step's forward when `generate` gets a compileable cache (a StaticCache) and a CompileConfig; on CUDA the default mode,
reduce-overhead, replays it as CUDA graphs. What has to hold for that to pay:

- nothing recompiles between steps: the cache has one shape for the whole run (this process's rows x capacity
  positions), made at start and zeroed in place before every generate (`StaticCache.reset`), so its tensors keep
  their addresses; a batch of another shape (evaluation, a multi-turn episode's later turns) samples eagerly with
  transformers' dynamic cache instead;
- the graphs read the weights the optimizer updates: AdamW updates parameters in place, so the captured addresses
  hold the new values (the sampling copy of `rollout.dtype` is then kept allocated, filled in place);
- prefill runs eagerly (its length differs every step); only the one-token decode steps are compiled.

Compiling happens once, before step 1, on a batch of the run's shape (the RNG state is restored after it, so the
run's samples are those of an eager run with the same cache); if it fails, sampling goes on eagerly and one line says
why.
"""

from __future__ import annotations

import time

import torch

from grpo_cli.errors import first_line


def compile_wanted(setting: bool | str, device: torch.device, cache_implementation: str | None = None) -> bool:
    """`rollout.compile` -> whether to compile: true, or auto on CUDA unless the recipe chose a cache
    (rollout.cache_implementation), which auto leaves alone."""
    return setting is True or (setting == "auto" and device.type == "cuda" and cache_implementation is None)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class StaticDecoding:
    """The run's static cache (`rows` x `capacity` positions) and the compile settings `generate` gets with it."""

    def __init__(self, model, rows: int, max_new_tokens: int, prompt_width: int | None, compile: bool) -> None:
        from transformers import CompileConfig

        self.rows, self.max_new_tokens = rows, max_new_tokens
        self.capacity = max_new_tokens + _round_up(prompt_width or 1, 64)
        self.config = model.config
        self.cache = None
        self.compile_config = None
        if compile:
            cuda = next(model.parameters()).device.type == "cuda"
            self.compile_config = CompileConfig(fullgraph=False, dynamic=False,
                                                mode="reduce-overhead" if cuda else "default")
            self.compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told

    def cache_for(self, rows: int, prompt_width: int, max_new_tokens: int):
        """The reset cache for a batch of `rows` prompts `prompt_width` wide, or None: that batch samples eagerly
        (another shape than the run's). A prompt longer than the capacity allows grows the cache once (one
        recompilation)."""
        from transformers import StaticCache

        if rows != self.rows or max_new_tokens > self.max_new_tokens:
            return None
        if prompt_width + max_new_tokens > self.capacity:
            self.capacity = max_new_tokens + _round_up(prompt_width, 64)
            self.cache = None
        if self.cache is None:
            self.cache = StaticCache(config=self.config, max_cache_len=self.capacity)
        else:
            self.cache.reset()  # zeroed in place: the same tensors, so the captured graphs stay valid
        return self.cache

    def generation_settings(self) -> dict:
        """GenerationConfig fields for a generate that uses the static cache."""
        if self.compile_config is None:
            return {"disable_compile": True}
        return {"compile_config": self.compile_config}

    def warm_up(self, generate, token_id: int) -> str:
        """Compile now: `generate(rows, n)` on the run's number of rows, n decode steps, with the RNG streams restored
        after; -> the start line's words for it. A failure turns compiling off (eager decoding with this cache) and
        says so."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        rows = [[token_id] * 8 for _ in range(self.rows)]
        t0 = time.perf_counter()
        try:
            with torch.random.fork_rng(devices=devices):
                generate(rows, min(4, self.max_new_tokens))  # the first decode step compiles, the next replay
        except Exception as e:  # noqa: BLE001 - any compiler error: decoding still works eagerly
            self.compile_config = None
            reason = f"{type(e).__name__}: {first_line(e)[:200]}"
            return f"compiled decoding failed ({reason}); sampling eagerly with the static cache"
        what = "compiled decoding" if self.compile_config is not None else "static cache"
        return f"{what} ({self.rows} rows x {self.capacity} positions), ready in {time.perf_counter() - t0:.1f} s"
