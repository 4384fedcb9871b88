r"""Marked final answers (answers.py's rule 1): the last `\boxed{}`, the last `<answer>` tag, the `####` line; and a
dataset's reference answer as text (`reference_text`: GSM8K's "... #### 72" is "72")."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent or unclosed."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip() or None
    return None


def last_tag(text: str, tag: str) -> str | None:
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return (found[-1].strip() or None) if found else None


def after_hashes(text: str) -> str | None:
    """GSM8K writes the final answer after `####`; keep the rest of that line."""
    idx = text.rfind("####")
    if idx < 0:
        return None
    rest = text[idx + 4 :].strip()
    line = rest.splitlines()[0].strip().rstrip(".").strip() if rest else ""
    return line or None


def marked_answer(text: str, tag: str) -> str | None:
    """The marked answer: the last `\\boxed{}`, else the last <tag>, else the `####` line, anywhere in `text`."""
    for find in (last_boxed, lambda t: last_tag(t, tag), after_hashes):
        if (found := find(text)) is not None:
            return found
    return None


def reference_text(answer: Any) -> str | None:
    """A dataset's reference answer as text: GSM8K "... #### 72" -> "72"; numbers written out in full."""
    if answer is None:
        return None
    if isinstance(answer, float):
        return format(Decimal(repr(answer)), "f")  # 1e-07 -> "0.0000001", which math-verify reads
    if isinstance(answer, str):
        return after_hashes(answer) if "####" in answer else answer.strip()
    return str(answer)
