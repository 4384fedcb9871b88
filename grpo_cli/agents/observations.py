"""The tokens of what an environment or a tool says between assistant turns, as the chat template renders it.

An observation is the chat template's own rendering of a user (or tool) message after an assistant turn, tokenized
once: what the template puts after the assistant's end-of-turn token, the message, and the next assistant header.
Nothing sampled is decoded and re-encoded.

Some templates render an earlier assistant turn differently once another message follows it: Qwen3's drops the
turn's <think> block (and the empty one its generation prompt writes with enable_thinking false) when a user turn
follows, and keeps it across tool answers. For them the context a deployed model sees at the next turn is not an
extension of the previous one. `changes_history` says, per role, whether the tokenizer's template does this;
`split_roles` names the roles after which an episode continues from the template's rendering instead, as a new
training sample (rollout.history_change: split, the default), and the runners say which they do once at the start
(`history_notice`). Importing this module must not import torch.
"""

from __future__ import annotations

from typing import Any

SENTINEL = "grpo-sentinel-2f9c1a"


THINK = "<think>\nreasoning\n</think>\n\n"


class Observations:
    """Token ids of an environment's message after an assistant turn, as the chat template renders it; and whether
    the template's rendering of the next turn extends the episode so far (`changes_history`)."""

    def __init__(self, tokenizer: Any, template_kwargs: dict | None = None) -> None:
        self.tok, self.kwargs = tokenizer, dict(template_kwargs or {})  # data.chat_template_kwargs
        self.base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL}]
        if SENTINEL not in self._render([*self.base, {"role": "user", "content": "x"}]):
            raise ValueError("the chat template drops assistant messages' text: observations cannot be placed")
        # e.g. Qwen3: an assistant turn followed by a user turn loses its <think> block (and an empty one the
        # generation prompt wrote); followed by tool answers, it keeps it
        self.changes_history = {role: self._changes(role) for role in ("user", "tool")}

    def _render(self, messages: list[dict], generation: bool = True) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **self.kwargs)

    def _changes(self, role: str) -> bool:
        """Whether the template renders an earlier assistant turn (with or without reasoning) differently from how
        it was sampled once a `role` message follows it: then the next turn's context is not an extension."""
        head = self._render(self.base[:1])
        for sampled in (SENTINEL, THINK + SENTINEL):
            full = self._render([self.base[0], {"role": "assistant", "content": sampled}, {"role": role, "content": "x"}])
            if not full.startswith(head + sampled):
                return True
        return False

    def text(self, messages: list[dict], last_token: int) -> str:
        """What follows the assistant turn that ended with `last_token`: the rest of its end of turn, then the
        messages (an environment's user message, or a turn's tool answers) and the next assistant header, as the
        template renders them after an assistant turn (whatever it does to the turn itself)."""
        full = self._render(self.base + messages)
        tail = full[full.rfind(SENTINEL) + len(SENTINEL):]
        end = self.tok.decode([last_token])
        return tail[len(end):] if end and tail.startswith(end) else tail  # the sampled EOS is that end of turn

    def ids(self, messages: list[dict], last_token: int) -> list[int]:
        return self.tok(self.text(messages, last_token), add_special_tokens=False)["input_ids"]



def split_roles(changes: dict[str, bool], roles: set[str], mode: str) -> set[str]:
    """The message roles after which an episode becomes a new training sample (rollout.history_change: split): those
    of `roles` (the ones the recipe's episodes append) after which the template changes the history."""
    return {r for r in roles if changes.get(r)} if mode == "split" else set()


def history_notice(changes: dict[str, bool], roles: set[str], mode: str) -> str | None:
    """The start-of-run line for a template whose next turn does not extend the episode after a message of one of
    `roles` (those the recipe's episodes append), or None."""
    changed = sorted(r for r in roles if changes.get(r))
    if not changed:
        return None
    head = (f"the chat template renders an earlier assistant turn differently once a {' or '.join(changed)} message "
            "follows it (Qwen3-style: its <think> block is dropped)")
    if mode == "split":
        return (f"{head}: after such a message the next turn is sampled from the template's rendering, as a deployed "
                "model sees it, and trained as a new sample of the episode (rollout.history_change: split; "
                "docs/agents.md, thinking models)")
    return (f"{head}, so a deployed model sees a shorter history at the next turn than the episode holds; episodes "
            "stay token in, token out and keep every sampled token (rollout.history_change: keep; docs/agents.md, "
            "thinking models)")


def continued(prompt: list[int], tokens: list[int], segments: list[list]) -> list[int]:
    """What an episode's next turn continues: the prompt and every token since, or, once it was split, its last
    sample's context and the tokens since."""
    if not segments:
        return prompt + tokens
    start, context = segments[-1]
    return context + tokens[start:]
