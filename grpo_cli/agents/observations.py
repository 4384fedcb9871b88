"""The tokens of what an environment or a tool says between assistant turns, as the chat template renders it.

An observation is the chat template's own rendering of a user (or tool) message after an assistant turn, tokenized
once: what the template puts after the assistant's end-of-turn token, the message, and the next assistant header.
Nothing sampled is decoded and re-encoded. Importing this module must not import torch.
"""

from __future__ import annotations

from typing import Any

SENTINEL = "grpo-sentinel-2f9c1a"


class Observations:
    """Token ids of an environment's message after an assistant turn, as the chat template renders it."""

    def __init__(self, tokenizer: Any, template_kwargs: dict | None = None) -> None:
        self.tok, self.kwargs = tokenizer, dict(template_kwargs or {})  # data.chat_template_kwargs
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL}]
        self.base = base
        self.before = tokenizer.apply_chat_template(base, tokenize=False, **self.kwargs)
        at = self.before.rfind(SENTINEL)
        if at < 0:
            raise ValueError("the chat template drops assistant messages' text: observations cannot be placed")
        self.after_assistant = self.before[at + len(SENTINEL):]  # e.g. "<|im_end|>\n"

    def text(self, messages: list[dict], last_token: int) -> str:
        """What follows the assistant turn that ended with `last_token`: the rest of its end of turn, then the
        messages (an environment's user message, or a turn's tool answers) and the next assistant header."""
        full = self.tok.apply_chat_template(self.base + messages, tokenize=False, add_generation_prompt=True,
                                            **self.kwargs)
        if not full.startswith(self.before):
            raise ValueError("the chat template renders earlier turns differently once a message follows: "
                             "observation tokens cannot be appended")
        end = self.tok.decode([last_token])
        tail = self.after_assistant
        tail = tail[len(end):] if end and tail.startswith(end) else tail  # the sampled EOS is that end of turn
        return tail + full[len(self.before):]

    def ids(self, messages: list[dict], last_token: int) -> list[int]:
        return self.tok(self.text(messages, last_token), add_special_tokens=False)["input_ids"]
