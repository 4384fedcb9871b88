"""What `grpo serve-vllm` accepts, checked before anything reaches vLLM.

A request vLLM would refuse half-way (an out-of-vocabulary id, a prompt longer than the context, a
seed its generators overflow on) can leave an in-process engine with a stuck request, and a wrong
type or a NaN can fail inside the sampler; so every field is checked here, strictly (JSON types as
written: no "5" for 5, no 5.0 or true for an int, no NaN or Infinity), and a refusal is a 4xx whose
message starts with the field: `prompt_token_ids[1][3]: token id 900 is outside the vocabulary [0, 768)`.
No torch or vLLM here: importing this module is cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_cli.errors import RequestError

MAX_BODY_BYTES = 64 * 2**20  # a JSON request body; weight uploads have their own limit (ServerLimits)
MAX_SEQUENCES = 4096  # prompts x n in one /generate
MAX_STOP_TOKENS = 64
# vLLM seeds sample k of prompt i with seed + i*n + k, and torch generators take signed 64-bit seeds
MAX_SEED = 2**63 - 1 - MAX_SEQUENCES
MAX_VERSION = 2**63 - 1


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of this engine (announced on GET /info)."""

    vocab_size: int  # rows of the embedding: valid token ids are [0, vocab_size)
    max_model_len: int  # prompt + completion tokens
    max_upload_bytes: int  # a raw safetensors upload: every weight in float32 plus header slack
    max_sequences: int = MAX_SEQUENCES
    max_body_bytes: int = MAX_BODY_BYTES


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class GenerateRequest(_Strict):
    prompt_token_ids: list[list[int]] = Field(..., min_length=1)
    n: int = Field(1, ge=1, le=MAX_SEQUENCES)
    temperature: float = Field(1.0, ge=0, le=2, description="vLLM's range; 0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0, description="None or 0: off")
    min_p: Optional[float] = Field(None, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    max_tokens: int = Field(256, ge=1)
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)
    stop_token_ids: Optional[list[int]] = Field(None, max_length=MAX_STOP_TOKENS)
    expected_version: Optional[int] = Field(None, ge=0, le=MAX_VERSION)
    structured_outputs_regex: Optional[str] = Field(None, max_length=10_000, description="completions match it")
    sampling_kwargs: Optional[dict[str, Any]] = Field(
        None, max_length=32, description="more vLLM SamplingParams fields (the trainer's rollout.generation_kwargs)")


class SamplingKwargs(_Strict):
    """The vLLM SamplingParams fields a request may add (the trainer's rollout.generation_kwargs), each checked: a
    field vLLM takes unchecked can fail inside its engine (a logit_bias keyed by strings killed it)."""

    min_tokens: int = Field(0, ge=0, description="at most max_tokens")
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] = Field(default_factory=dict, max_length=2**20,
                                         description="token id (a JSON key) -> bias in [-100, 100]")
    allowed_token_ids: Optional[list[int]] = Field(None, min_length=1, max_length=2**20)


# the request's own fields and what the server asks vLLM for itself: sampling_kwargs may not set them
OWN_SAMPLING = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed",
                "stop_token_ids", "logprobs", "detokenize")


class WeightsFileRequest(_Strict):
    path: str = Field(..., min_length=1, max_length=4096)
    version: int = Field(..., ge=0, le=MAX_VERSION)
    partial: bool = Field(False, description="the file holds only some tensors (whole fused groups)")


class AdapterFileRequest(_Strict):
    path: str = Field(..., min_length=1, max_length=4096)
    version: int = Field(..., ge=1, le=MAX_VERSION)


def parse_json(body: bytes, model: type[_Strict]) -> Any:
    """Raw body -> a validated request; 400 for bytes that are not JSON, 422 for a wrong field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nested deeper than the parser goes
        raise RequestError(400, f"the body is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise RequestError(422, f"the body must be a JSON object, not a {type(data).__name__}", "body")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise RequestError(422, _describe(err, model), _field_name(err["loc"])) from None


def _field_name(loc: tuple) -> str:
    """('prompt_token_ids', 0, 3) -> 'prompt_token_ids[0][3]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _describe(err: dict, model: type[_Strict]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field (known: " + ", ".join(model.model_fields) + ")"
    if err["type"] == "missing":
        return "a required field is missing"
    got = repr(err.get("input"))
    return f"{err['msg']} (got {got[:60] + '...' if len(got) > 60 else got})"


def check_generate(req: GenerateRequest, limits: ServerLimits) -> dict[str, Any]:
    """What the schema cannot know: the vocabulary, the context length, the size of the whole request; -> the
    request's sampling_kwargs as vLLM SamplingParams keywords, checked."""
    V, L = limits.vocab_size, limits.max_model_len
    sequences = len(req.prompt_token_ids) * req.n
    if sequences > limits.max_sequences:
        raise RequestError(422, f"{len(req.prompt_token_ids)} prompts x n={req.n} = {sequences} sequences, more than "
                                f"the server's limit of {limits.max_sequences} per request; split the request", "n")
    if req.max_tokens > L:
        raise RequestError(422, f"{req.max_tokens} is more than the context length ({L} tokens, --max-model-len)",
                           "max_tokens")
    if req.top_k is not None and req.top_k > V:
        raise RequestError(422, f"{req.top_k} is more than the vocabulary size {V}", "top_k")
    for i, ids in enumerate(req.prompt_token_ids):
        if not ids:
            raise RequestError(422, "an empty prompt (at least one token id)", f"prompt_token_ids[{i}]")
        if len(ids) >= L:
            raise RequestError(422, f"{len(ids)} tokens leave no room to generate in the context of {L} tokens "
                                    f"(at most {L - 1}; --max-model-len)", f"prompt_token_ids[{i}]")
        _check_ids(ids, V, f"prompt_token_ids[{i}]")
    _check_ids(req.stop_token_ids or [], V, "stop_token_ids")
    return sampling_kwargs(req, V) if req.sampling_kwargs else {}


def sampling_kwargs(req: GenerateRequest, V: int) -> dict[str, Any]:
    """The request's sampling_kwargs as vLLM SamplingParams keywords, every one checked (422 naming it)."""
    given = req.sampling_kwargs or {}
    if clash := sorted(set(given) & set(OWN_SAMPLING)):
        raise RequestError(422, f"may not set {', '.join(clash)}: the request has fields for them", "sampling_kwargs")
    for key in given:
        if key not in SamplingKwargs.model_fields:
            raise RequestError(422, f"not supported by this server (supported: {', '.join(SamplingKwargs.model_fields)})",
                               f"sampling_kwargs.{key}")
    try:
        kw = SamplingKwargs.model_validate(given)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise RequestError(422, _describe(err, SamplingKwargs), f"sampling_kwargs.{_field_name(err['loc'])}") from None
    if kw.min_tokens > req.max_tokens:
        raise RequestError(422, f"{kw.min_tokens} is more than max_tokens {req.max_tokens}", "sampling_kwargs.min_tokens")
    bias: dict[int, float] = {}
    for key, value in kw.logit_bias.items():
        if not key.isdigit() or int(key) >= V:
            raise RequestError(422, f"token id {key!r} is not one of the vocabulary [0, {V})", "sampling_kwargs.logit_bias")
        if abs(value) > 100:
            raise RequestError(422, f"bias {value} for token {key} is outside [-100, 100]", "sampling_kwargs.logit_bias")
        bias[int(key)] = value
    _check_ids(kw.allowed_token_ids or [], V, "sampling_kwargs.allowed_token_ids")
    out = {k: v for k, v in kw.model_dump().items() if k in given}
    return out | ({"logit_bias": bias} if bias else {})


def _check_ids(ids: list[int], V: int, field: str) -> None:
    if ids and (min(ids) < 0 or max(ids) >= V):
        j = next(j for j, t in enumerate(ids) if not 0 <= t < V)
        raise RequestError(422, f"token id {ids[j]} is outside the vocabulary [0, {V})", f"{field}[{j}]")


def weight_upload_headers(headers) -> tuple[int, bool]:
    """X-Weight-Version (required) and X-Weight-Partial (optional, true/false) of a raw upload."""
    raw = headers.get("x-weight-version")
    if raw is None or not raw.isdigit() or len(raw) > 18:
        raise RequestError(400, "a raw weights upload needs the header X-Weight-Version: <non-negative int> "
                                f"(got {raw!r})", "X-Weight-Version")
    partial = (headers.get("x-weight-partial") or "false").strip().lower()
    if partial not in ("true", "false", "1", "0"):
        raise RequestError(400, f"must be true or false (got {partial!r})", "X-Weight-Partial")
    return int(raw), partial in ("true", "1")
