"""A sequence-classification reward model as a reward: `name: "model:PATH_OR_HUB_ID"`.

As TRL's `reward_funcs` given a model: the reward of a completion is the single logit of an
`AutoModelForSequenceClassification` with `num_labels: 1` (an outcome reward model, e.g. the
Bradley-Terry RMs of InstructGPT, arXiv:2203.02155) read at the last token of prompt + completion.

  * Text: with a chat template in the reward model's own tokenizer, the conversation
    [user: prompt, assistant: completion] rendered by that template, where the prompt is the one the
    policy got before its own chat template and system prompt (`user_prompts`: data.user_prompts, passed by the engine);
    without a template (or without `user_prompts`, e.g. in `grpo eval`), the policy's prompt text +
    completion, as the policy saw them.
  * Long texts keep their end (left truncation at `max_length`): the reward is read at the last token.
  * Run: loaded once per process (cache keyed by source and device), eval mode, under no_grad, in
    batches of `batch_size`, on the trainer's device (accelerate's `PartialState().device`).

`check_reward_model` validates a name without loading weights (config.json only), so `grpo validate`
stays fast and refuses a missing folder or a classifier with several labels. Importing this module
must not import torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_cli.recipe.names import log_name, model_source

DEFAULTS = {"batch_size": 8, "max_length": 1024}
_LOADED: dict[tuple[str, str], tuple[Any, Any]] = {}  # (source, device) -> (tokenizer, model)


def _is_local(source: str) -> bool:
    return os.path.isabs(source) or source.startswith((".", "~")) or os.path.isdir(source)


def _read_config(source: str) -> dict[str, Any]:
    if _is_local(source):
        folder = Path(source)
        if not folder.is_dir():
            raise ValueError(f"reward model folder not found: {source}")
        path = folder / "config.json"
        if not path.is_file():
            raise ValueError(f"{source} has no config.json: not a transformers model folder")
    else:
        from grpo_cli.process.hub import offline_chosen, unreachable

        # an unreachable hub: the cache only, at once (five retries of the download would take ~25 s)
        why = "HF_HUB_OFFLINE is set" if offline_chosen() else unreachable()
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(source, "config.json", local_files_only=why is not None))
        except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated: all mean "cannot use it"
            where = (f"is not in the local hub cache, and the hub cannot be reached ({why})" if why else
                     f"could not be read from the hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            raise ValueError(
                f"reward model {source!r} is not a local folder and its config.json {where}; give a folder path or a "
                "hub id that is downloaded or reachable"
            ) from None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def check_reward_model(name: str, kwargs: dict[str, Any], timeout_s: float | None) -> None:
    """Raise ValueError (message for people, naming `name` or `kwargs.KEY`) unless the reward model is usable."""
    from grpo_cli.registry import did_you_mean

    source = model_source(name)
    if not source:
        raise ValueError("name: `model:` needs a folder or hub id after it, e.g. model:./my-reward-model")
    for key, value in kwargs.items():
        if key not in DEFAULTS:
            hint = did_you_mean(key, DEFAULTS)
            raise ValueError(f"kwargs.{key}: not a setting of a reward model{hint}; it takes: {', '.join(DEFAULTS)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"kwargs.{key}: must be an integer >= 1 (got {value!r})")
    if timeout_s is not None:
        raise ValueError("timeout_s: not supported for reward models (a child process would load the model on "
                         "every call); remove it")
    try:
        config = _read_config(source)
    except ValueError as e:
        raise ValueError(f"name: {e}") from None
    archs = config.get("architectures") or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(
            f"name: {source} is a {', '.join(archs)}, not a sequence-classification model; a reward model is an "
            "AutoModelForSequenceClassification with num_labels 1"
        )
    labels = len(config["id2label"]) if config.get("id2label") else config.get("num_labels", 2)  # transformers' default: 2
    if labels != 1:
        raise ValueError(
            f"name: {source} has num_labels {labels}; a reward model gives one score per text (num_labels 1), "
            "so a classifier with several labels cannot be used as a reward"
        )


def _device() -> Any:
    from accelerate import PartialState

    return PartialState().device  # the trainer's device: accelerate keeps one state per process


def _load(source: str, device: Any) -> tuple[Any, Any]:
    key = (source, str(device))
    if key not in _LOADED:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(source)
        tok.padding_side, tok.truncation_side = "right", "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(source, dtype="auto")
        if model.config.pad_token_id is None:  # batches need it to find each row's last token
            model.config.pad_token_id = tok.pad_token_id
        _LOADED[key] = (tok, model.to(device).eval().requires_grad_(False))
    return _LOADED[key]


def texts_for(tok: Any, prompts: list[str], user_prompts: list[str] | None, completions: list[str]) -> list[str]:
    # `prompts` already hold the policy's chat template: as a user message they would be wrapped twice
    if getattr(tok, "chat_template", None) and user_prompts is not None:
        return [
            tok.apply_chat_template([{"role": "user", "content": u}, {"role": "assistant", "content": c}], tokenize=False)
            for u, c in zip(user_prompts, completions, strict=True)
        ]
    return [p + c for p, c in zip(prompts, completions, strict=True)]


def loaded(name: str) -> tuple[Any, Any]:
    """(tokenizer, model) of reward `name` on this process's device, loaded on first use: the objects the reward
    scores with, so an update to the model (rewards[].update) changes the rewards that follow."""
    return _load(model_source(name), _device())


def encode(tok: Any, texts: list[str], max_length: int, device: Any) -> Any:
    """A batch as the reward model reads it: right padding, the end kept past `max_length`, no added tokens."""
    return tok(texts, padding=True, truncation=True, max_length=max_length, add_special_tokens=False,
               return_tensors="pt").to(device)


class RewardModel:
    """The reward function of one `model:` reward; the weights load on the first call."""

    def __init__(self, name: str) -> None:
        self.name, self.source = name, model_source(name)
        self.__name__ = log_name(name)

    def __call__(
        self, prompts: list[str], completions: list[str], *, user_prompts: list[str] | None = None,
        batch_size: int = DEFAULTS["batch_size"], max_length: int = DEFAULTS["max_length"], **_: Any,
    ) -> list[float]:
        import torch

        tok, model = _load(self.source, _device())
        texts = texts_for(tok, prompts, user_prompts, completions)
        scores: list[float] = []
        with torch.no_grad():
            for s in range(0, len(texts), batch_size):
                enc = encode(tok, texts[s : s + batch_size], max_length, model.device)
                scores += model(**enc).logits[:, 0].float().tolist()  # [b, 1] -> b
        return scores


def reward_model(name: str) -> RewardModel:
    """One `RewardModel` per name and process, so the weights load once."""
    if name not in _FUNCTIONS:
        _FUNCTIONS[name] = RewardModel(name)
    return _FUNCTIONS[name]


_FUNCTIONS: dict[str, RewardModel] = {}
