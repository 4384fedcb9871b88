"""The recipe's `rollout` section: the backend that samples (transformers `generate` or vLLM, colocated or a `grpo
serve-vllm` server), sampling settings, the importance-sampling correction, asynchronous rollouts, multi-turn
episodes and tools. Checks across sections are checks.py's. Never imports torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from grpo_cli.recipe.backends import BACKEND_CHOICES, MODE_CHOICES
from grpo_cli.recipe.section import Section

BackendName = Literal[BACKEND_CHOICES]  # type: ignore[valid-type]  (recipe/backends.py's entries)
ModeName = Literal[MODE_CHOICES]  # type: ignore[valid-type]


class VLLMConfig(Section):
    mode: ModeName = Field("colocate", description="`colocate`: a vLLM engine inside the trainer; `server`: `grpo serve-vllm`.")
    server_url: str | list[str] = Field("http://127.0.0.1:8000", description=(
        "Where `grpo serve-vllm` listens (server mode); a list: several servers, each step's prompts spread over "
        "them (a group's rows on one server), the weights synced to every one under one version."))
    drop_failed_servers: bool = Field(False, description=(
        "With several servers: one that fails a request (or cannot take the weights) is dropped and its requests go "
        "to the others, logged as servers/live; false: it stops the run, named."))
    request_timeout_s: float = Field(300.0, gt=0, description="Timeout of every request to the server.")
    structured_outputs_regex: str | None = Field(
        None, description="Constrain every completion to match this regular expression (vLLM structured outputs; "
        "TRL's vllm_structured_outputs_regex, formerly vllm_guided_decoding_regex).",
    )
    lora_sync: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="Server mode with model.lora: `adapter` syncs the LoRA adapter alone (a server started "
        "with `grpo serve-vllm --lora-rank R`), `merged` the merged weights; auto: the adapter when the server serves "
        "adapters of that rank, else merged (the start line says which and why).")
    tensor_parallel_size: int = Field(1, ge=1, description=(
        "Colocate with several training processes: each engine split over this many consecutive processes (TRL's "
        "vllm_tensor_parallel_size), which sample their rows together; it must divide the process count. Server "
        "mode: `grpo serve-vllm --tp N`."))
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Share of GPU memory vLLM may take (colocate).")
    max_model_len: int | None = Field(None, ge=1, description="vLLM's context length; default: the model's.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="vLLM weights dtype.")
    enforce_eager: bool | None = Field(
        None, description="Skip compilation / CUDA graphs (faster start, slower decode). None: eager on CPU, where "
        "compiling costs ~30 s for little gain, compiled on GPU."
    )
    sleep_mode: bool = Field(False, description="GPU: free vLLM's memory while the trainer updates (colocate).")
    cpu_kv_cache_gib: float = Field(1.0, gt=0, description="CPU builds: KV cache size (VLLM_CPU_KVCACHE_SPACE).")


    @field_validator("server_url")
    @classmethod
    def _distinct_servers(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and (not v or len({u.rstrip("/") for u in v}) < len(v)):
            raise ValueError("a list of servers needs at least one URL, each once" if v else "an empty list of servers")
        return v

    @property
    def server_urls(self) -> list[str]:
        return [self.server_url] if isinstance(self.server_url, str) else list(self.server_url)


class RolloutConfig(Section):
    backend: BackendName = Field("hf", description="Generation backend: `hf` (transformers generate) or `vllm`.")
    dtype: Literal["policy", "auto", "bfloat16", "float16"] = Field(
        "policy", description="`hf` backend: `policy` samples with the policy itself; bfloat16/float16 with a copy of "
        "it in that dtype, filled before every generate and freed after (~2x faster decoding on bf16 hardware; its "
        "log-probs feed importance_sampling, as vLLM's do); auto: bfloat16 for a full float32 policy on one process "
        "where the hardware computes bf16 natively (CUDA, CPUs with AVX512-BF16 or AMX), else policy.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="Used when backend is `vllm`.")
    importance_sampling: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"] = Field(
        "token_truncate",
        description="Correct the train/inference mismatch with sampler log-probs (vLLM): weight each token by "
        "pi_train/pi_sampler, truncated at or masked above importance_sampling_cap; per token or per sequence.",
    )
    importance_sampling_cap: float = Field(3.0, gt=1, description="C: the cap of the importance weight.")
    importance_sampling_min: float | None = Field(
        None, gt=0, lt=1, description="The importance weight's lower bound (TRL's vllm_importance_sampling_clip_min): "
        "*_truncate raises a weight below it to it, *_mask drops the tokens or sequences below it (with the cap: "
        "IcePop's band, e.g. 0.5 and 2). None: no lower bound.")
    max_completion_length: int = Field(256, ge=1, description="Max new tokens per completion.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (log-probs are computed at this temperature).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1 disables it.")
    top_k: int | None = Field(None, ge=1, description="None disables top-k.")
    min_p: float | None = Field(None, ge=0, le=1, description="Drop tokens below min_p x the top probability; None disables.")
    repetition_penalty: float = Field(1.0, gt=0, description="> 1 discourages repeated tokens; 1 disables it.")
    generation_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="More sampling settings: transformers GenerationConfig fields (hf), vLLM "
        "SamplingParams fields (vllm), e.g. {min_new_tokens: 4} / {min_tokens: 4}. Settings with a key of their own "
        "here (temperature, top_p, top_k, min_p, repetition_penalty, max tokens, stop ids, seed) are refused.",
    )
    cache_implementation: str | None = Field(
        None, description="hf backend: the key/value cache `generate` uses, e.g. static (fixed-size, for "
        "torch.compile) or offloaded; None: transformers' dynamic cache.",
    )
    compile: bool | Literal["auto"] = Field(
        "auto", description="hf backend: compiled decoding. One static key/value cache for the run (this process's "
        "B*G rows x prompt + max_completion_length positions, reset in place between steps) and transformers' "
        "torch.compile of the decode step (CUDA graphs on a GPU: launch-bound decoding of small models gets "
        "several times faster); compiled once at start (the time is in the start line), eager again with one line "
        "if compiling fails. Same sampled tokens as the dynamic cache. auto (the default): on for CUDA, where it "
        "sampled Qwen2.5-0.5B's 32-128 rows in 0.17-0.20x TRL's eager time (H200, bench/RESULTS.md), off on a CPU, "
        "where it does not pay.",
    )
    max_staleness: int = Field(
        0, ge=0, description="k >= 1: asynchronous rollouts, sampled with the weights of k steps before the "
        "synchronous ones (step t's with those after step t-1-k), so `grpo serve-vllm` samples the next batches "
        "while the trainer updates; deterministic and resumable. 0: synchronous. Needs backend vllm, mode server.",
    )
    environment: str | dict[str, str] | None = Field(
        None, description="Multi-turn episodes: `path/to/env.py:Class` (relative to the recipe file) or `module:Class`, "
        "one instance per rollout; or a mapping {route: class} that routes each row by its environment_column (TRL's "
        "environment_factory dict). grpo's contract: reset(row) -> str | None, step(completion_text) -> "
        "(observation, done), reward(); TRL's: reset(**columns) -> str | None, public methods as tools, "
        "get_reward(). The built-in reward `environment` is reward() / get_reward(). `openenv:<url>`: an OpenEnv "
        "environment's server (its action is the tool, its step rewards sum to the reward).",
    )
    environment_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment class; with a mapping of classes, "
        "{route: kwargs}.")
    environment_api: Literal["auto", "turns", "tools"] = Field(
        "auto", description="Which contract the environment follows: `turns` (grpo's: step answers each turn), "
        "`tools` (TRL's: its public methods are tools, a turn without a call ends the episode). auto: `tools` when "
        "the class has get_reward or no step.",
    )
    environment_column: str = Field(
        "environment", description="With a mapping of environments: the row's column that names its environment "
        "(TRL's `environment` field); not passed to reset.",
    )
    environment_timeout_s: float | None = Field(
        None, gt=0, description="Run each environment in a child process killed when a call takes longer; the "
        "episode ends there and environment/timeouts counts it. None: in this process, no limit.",
    )
    tools: list[str] = Field(
        default_factory=list, description="Functions the model may call (`path/to/file.py:fn`, `module:fn`): type hints "
        "and a docstring describe them to it (the chat template's `tools=`); a `<tool_call>{\"name\": ..., "
        "\"arguments\": {...}}</tool_call>` in an assistant turn runs it, its answer is the next (tool) turn.",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Each tool call runs in a child process killed after this many seconds.")
    agent: str | None = Field(
        None, description="Agent programs that own their tool loop: `path/to/agent.py:fn` or `module:fn`, "
        "fn(base_url, api_key, row, **agent_kwargs) -> reward | None, one call per rollout in its own process; it "
        "talks to the policy through the OpenAI-compatible endpoint at base_url (the `openai` client), which "
        "records every turn's tokens for training. Its return value is the built-in reward `environment`. "
        "`verifiers:<taskset>` (an installed taskset's id, or path/to/taskset.py): a verifiers environment, its "
        "episodes run by verifiers itself against that endpoint.",
    )
    agent_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the agent program.")
    agent_timeout_s: float = Field(
        300.0, gt=0, description="An agent program still running after this is killed; its episode is cut where it "
        "was (agent/timeouts).")
    agent_concurrency: int = Field(16, ge=1, description="Agent programs running at once (their requests are "
                                   "sampled together).")
    agent_max_body_bytes: int = Field(4 * 2**20, ge=1024, description="The endpoint refuses a larger request (413).")
    max_turns: int = Field(1, ge=1, description="Assistant turns per episode (1: one completion per prompt); with "
                           "rollout.agent, the answers a program gets per episode.")
    history_change: Literal["split", "keep"] = Field(
        "split", description="Where the chat template renders the next turn's history differently from the episode "
        "so far (Qwen3-style templates drop earlier <think> blocks once a user turn follows): `split` samples the "
        "next turn from the template's rendering, as a deployed model sees it, and trains it as a new sample of the "
        "episode (its reward and advantage); `keep` stays one token sequence, token in, token out, keeping every "
        "sampled token in the context of later turns. Templates that extend the history are unaffected.",
    )
    max_episode_length: int | None = Field(
        None, ge=2, description="Tokens of a whole episode, prompt and observations included; an episode that reaches "
        "it is truncated. None: the model's max_position_embeddings. max_completion_length bounds the sampled tokens.",
    )
