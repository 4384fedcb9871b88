"""Rollouts with transformers `generate`: one call for all B*G sequences of a generation batch."""

from __future__ import annotations

import copy
from typing import Any

import torch

from grpo_cli.algo.logprobs import distinct_rows, position_ids_from_mask
from grpo_cli.algo.sampling import InverseCDFDraw, TruncatedSampling, Truncation
from grpo_cli.datatypes import Rollout
from grpo_cli.errors import NonFiniteError
from grpo_cli.models import few_rows
from grpo_cli.models.finite import nonfinite_weights
from grpo_cli.models.loading import native_bf16, without_autocast
from grpo_cli.models.lora import is_peft_model
from grpo_cli.process import watchdog
from grpo_cli.recipe.schema import RolloutConfig
from grpo_cli.rollout.common import Samples, build_rollout, completion_mask_from_eos, eos_token_ids, left_pad, pad_id_of
from grpo_cli.rollout.static import StaticDecoding, compile_wanted


def sampler_dtype(setting: str, model, *, full_model: bool) -> torch.dtype | None:
    """`rollout.dtype` -> the dtype of the sampling copy, or None to sample with the policy itself."""
    param = next(model.parameters())
    if setting == "policy":
        return None
    if setting == "auto":
        return torch.bfloat16 if full_model and param.dtype == torch.float32 and native_bf16(param.device) else None
    if not full_model:
        raise ValueError(f"rollout.dtype: {setting} needs a full model on one process (not LoRA, FSDP or ZeRO-3); "
                         "use auto or policy")
    dtype = getattr(torch, setting)
    return None if dtype == param.dtype else dtype


@torch.no_grad()
def shared_prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """A prompt cache for `generate` in which each distinct prompt ran through the model once and its keys and
    values were indexed out to its rows (a group's G rows share one prompt: G - 1 prompt forwards saved).

    -> a cache over all but the last prompt position (generate runs that one and samples), or None when no two
    rows share a prompt. Same sampled tokens as without it, to float rounding."""
    shared = distinct_rows(ids, mask) if ids.shape[1] >= 2 else None
    if shared is None:
        return None
    first, inverse = shared
    P = ids.shape[1] - 1
    out = model(input_ids=ids[first, :P], attention_mask=mask[first, :P],
                position_ids=position_ids_from_mask(mask)[first, :P], use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if cache is not None:
        cache.batch_select_indices(inverse)  # [u, ...] -> [rows, ...]
    return cache


class SamplingCopy:
    """The policy in a lower precision, holding memory only while it samples: between `fill` and `free`
    its parameters live on the meta device. Buffers keep their dtype (RoPE frequencies stay float32)."""

    keep = False  # compiled decoding: stay allocated, so that captured graphs keep reading the same tensors

    def __init__(self, model, dtype: torch.dtype) -> None:
        # requires_grad as the policy's (generate runs without grad): with frozen weights, torch's matmul copies a
        # [b, hidden, vocab] expansion of the LM head for the non-contiguous last-position hidden states (~1 s)
        memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta", dtype=dtype if p.is_floating_point() else p.dtype),
                                          requires_grad=p.requires_grad) for p in model.parameters()}
        memo |= {id(b): torch.empty_like(b, device="meta") for b in model.buffers()}
        self.module = copy.deepcopy(model, memo).eval()  # structure, config and generation config; no weights
        self.module.config.dtype = dtype  # masks and caches are built in it (a float32 mask slows bf16 attention 4x)
        self.dtype = dtype

    @torch.no_grad()
    def fill(self, model) -> torch.nn.Module:
        # leaving the meta device unties tied weights (embeddings / LM head): every name is filled
        if next(self.module.parameters()).is_meta:
            self.module.to_empty(device=next(model.parameters()).device)
        for source, target in ((model.named_parameters(remove_duplicate=False), self.module.named_parameters()),
                               (model.named_buffers(remove_duplicate=False), self.module.named_buffers())):
            values = dict(source)
            for name, t in target:
                t.copy_(values[name])
        return self.module

    def free(self) -> None:
        if not self.keep:
            self.module.to("meta")


class SamplerLogprobs:
    """A logits processor that keeps, per step, the log-prob of the token the sampler then drew, under the
    distribution it was drawn from: the scores / `temperature`; with truncation it runs after `TruncatedSampling`
    (temperature 1), so the log-probs are of the truncated policy, as the trainer computes them and as vLLM's
    processed log-probs are."""

    def __init__(self, temperature: float) -> None:
        self.temperature, self.previous, self.steps = temperature, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:  # the token drawn from the previous step's distribution is now the last input
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def result(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """[N, T] log-probs of `completion_ids` (the last step's token is not an input of any call)."""
        return torch.cat([*self.steps, self.previous.gather(1, completion_ids[:, -1:])], dim=1)


def progress_criteria():
    """A stopping criterion that never stops: each decoding step tells the watchdog (grpo_cli/process/watchdog.py) that
    generation moves on, so a long generate is not taken for a stalled one."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class DecodedToken(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
            watchdog.tick()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([DecodedToken()])


class HFGenerator:
    """Sampling with transformers `generate`: with the policy itself, or a lower-precision copy of it
    (rollout.dtype) filled from the policy before every call, so nothing needs syncing after an update."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig, synced: bool = False) -> None:
        # synced: the weights are sharded over processes (FSDP, ZeRO-3); a process whose sequences are done
        # keeps running forwards until every process is done, or the others would wait forever
        self.model, self.tokenizer, self.cfg, self.synced = model, tokenizer, cfg, synced
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = pad_id_of(tokenizer, self.eos_ids)
        dtype = sampler_dtype(cfg.dtype, model, full_model=not synced and not is_peft_model(model))
        self.copy = SamplingCopy(model, dtype) if dtype is not None else None
        self.static = None  # rollout.compile: the run's static cache (grpo_cli/rollout/static.py), made by prepare
        self.inverse_cdf = True  # the draw (algo/sampling.py's InverseCDFDraw); False: torch.multinomial, for benches

    def prepare(self, rows: int, prompt_width: int | None) -> str | None:
        """Before step 1, with rollout.compile: the static cache for `rows` rows and the compiled decode step; -> the
        start line's words about it (None: eager decoding, as configured)."""
        if not compile_wanted(self.cfg.compile, next(self.model.parameters()).device, self.cfg.cache_implementation):
            return None
        if self.synced:
            return "rollout.compile: not with weights sharded over processes (FSDP, ZeRO-3); sampling eagerly"
        self.static = StaticDecoding(self.model, rows, self.cfg.max_completion_length, prompt_width, compile=True)
        if self.copy is not None:
            self.copy.keep = True
        token = next(t for t in range(16) if t not in self.eos_ids and t != self.pad_id)  # any ordinary token
        return self.static.warm_up(lambda r, n: self._run(r, greedy=True, max_new_tokens=n, min_new_tokens=n), token)

    def sleep(self) -> None:
        """Only the colocated vLLM engine frees memory during the update."""

    def wake_up(self) -> None:
        pass

    sync_bytes = 0  # nothing moves: this backend samples with the trained model itself

    def sync_weights(self, model) -> float:
        """Nothing to do: this backend samples with the trained model itself."""
        return 0.0

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        """Nothing: sampling draws from torch's RNG, which checkpoints hold."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], prompts: list[str], n: int = 1, *, greedy: bool = False,
        temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
    ) -> Rollout:
        """B prompts -> B*n completions, each prompt's n samples in contiguous rows.

        The engine passes rows already repeated G times (n=1) when the rows of a group are split
        over processes; n > 1 repeats here. `greedy` and the other keywords are for evaluation."""
        rows = [p for p in prompt_ids for _ in range(n)]
        completion_ids, cmask, truncated, logps = self._run(rows, greedy=greedy, temperature=temperature, top_p=top_p,
                                                            max_new_tokens=max_new_tokens)
        return build_rollout(prompt_ids, prompts, n, completion_ids, cmask, truncated, self.tokenizer, self.pad_id,
                             sampling_logps=logps)

    def sample(self, token_ids: list[list[int]], max_new_tokens: list[int], *, greedy: bool = False,
               temperature: float | None = None, top_p: float | None = None, logprobs: bool = False) -> Samples:
        """Each sequence continued by at most its own budget: one `generate` to the largest, each row cut to its.
        `logprobs`: record the sampler's log-probs of the drawn tokens (a sampling copy always does)."""
        completion_ids, cmask, truncated, logps = self._run(token_ids, max_new_tokens=max(max_new_tokens), greedy=greedy,
                                                            temperature=temperature, top_p=top_p, logprobs=logprobs)
        tokens, out_logps, finished = [], [] if logps is not None else None, []
        for r, budget in enumerate(max_new_tokens):
            n = int(cmask[r].sum())  # up to and including the EOS; all of them when there is none
            tokens.append(completion_ids[r, : min(n, budget)].tolist())
            finished.append(not bool(truncated[r]) and n <= budget)
            if out_logps is not None:
                out_logps.append(logps[r, : min(n, budget)].tolist())
        return Samples(tokens, out_logps, finished)

    def _run(self, rows: list[list[int]], *, greedy: bool = False, temperature: float | None = None,
             top_p: float | None = None, max_new_tokens: int | None = None, min_new_tokens: int | None = None,
             logprobs: bool = False):
        """Token rows -> completion ids [n, T] (pad after the EOS), mask [n, T], truncated [n], sampler log-probs."""
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        ids, mask = left_pad(rows, self.pad_id, device)
        c = self.cfg
        temperature, truncation = temperature or c.temperature, Truncation(c.top_k, top_p or c.top_p, c.min_p)
        # truncated sampling: one rule for the three backends and the trainer's replay (grpo_cli/algo/sampling.py),
        # applied by our processor (temperature included); generate's own truncation is always off
        processors = [TruncatedSampling(temperature, truncation)] if not greedy and truncation.active else []
        if processors:
            temperature = 1.0
        # the draw is ours too (InverseCDFDraw, last), so generate itself decodes greedily: no exponential per token
        sampling = {} if greedy or self.inverse_cdf else dict(temperature=temperature, top_p=1.0, top_k=0, min_p=None)
        max_new_tokens = max_new_tokens or c.max_completion_length
        # rollout.compile: the run's static cache when the batch has the run's shape (else the dynamic one)
        static = self.static.cache_for(len(rows), ids.shape[1], max_new_tokens) if self.static is not None else None
        extra = dict(c.generation_kwargs) | ({"min_new_tokens": min_new_tokens} if min_new_tokens else {})
        gen_cfg = GenerationConfig(
            do_sample=not greedy and not self.inverse_cdf, **sampling, repetition_penalty=c.repetition_penalty,
            max_new_tokens=max_new_tokens, eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True,
            cache_implementation=c.cache_implementation if static is None else None,
            **(self.static.generation_settings() if static is not None else {}), **extra,
        )
        # a sampling copy is a different policy: its log-probs go with the rollout (importance sampling)
        recorder = SamplerLogprobs(temperature) if (self.copy is not None or logprobs) and not greedy else None
        processors += [recorder] if recorder is not None else []
        processors += [InverseCDFDraw(temperature)] if self.inverse_cdf and not greedy else []
        was_training = self.model.training
        self.model.eval()
        sampler = self.copy.fill(self.model) if self.copy is not None else self.model
        try:
            # train.mixed_precision autocasts training forwards, not sampling; on a CPU a decode step's few rows read
            # the weights through models/few_rows.py's product, in a Llama or Qwen2 layer fused around it
            # (models/decode_layer.py, which needs the preallocated cache below)
            with without_autocast(sampler), few_rows.sampling():
                # sharded weights: every process must run the same forwards, so no process-dependent prefill;
                # rollout.cache_implementation: generate builds that cache itself; else a cache made at its full
                # length once (rollout/preallocated.py), not grown by a copy every step
                cache = static
                if static is None and not c.cache_implementation:
                    from grpo_cli.rollout.preallocated import preallocated  # imports transformers

                    prompt = None if self.synced else shared_prefill(sampler, ids, mask)
                    cache = preallocated(prompt, sampler, ids.shape[1] + max_new_tokens)
                out = sampler.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg, past_key_values=cache,
                                       synced_gpus=self.synced, logits_processor=processors or None,
                                       stopping_criteria=progress_criteria())
        except RuntimeError as e:  # torch.multinomial on NaN probabilities: name the cause, not the sampler's line
            if "probability tensor contains" not in str(e):
                raise
            raise NonFiniteError(f"sampling failed: the policy's next-token probabilities are NaN or infinite "
                                 f"({nonfinite_weights(sampler) or 'its weights are finite: the logits overflowed'}); "
                                 "lower train.learning_rate and resume from the last checkpoint with --resume auto "
                                 "--allow-recipe-change") from None
        finally:
            if self.copy is not None:
                self.copy.free()
            self.model.train(was_training)
        completion_ids = out[:, ids.shape[1] :]
        cmask, truncated = completion_mask_from_eos(completion_ids, self.eos_ids)
        logps = recorder.result(completion_ids).masked_fill(cmask == 0, 0.0) if recorder is not None else None
        return completion_ids.masked_fill(cmask == 0, self.pad_id), cmask, truncated, logps


def build_hf_generator(cfg: RolloutConfig, *, tokenizer, model, synced: bool = False, **_: Any) -> HFGenerator:
    """BACKENDS["hf"]'s builder: transformers `generate` on the policy itself."""
    return HFGenerator(model, tokenizer, cfg, synced=synced)
