r"""Final answers: extraction from a completion and equivalence with a reference (math-verify).

Before anything is read, text is cleaned the way people write numbers (`clean_answer`):
  dashes    U+2212 minus, U+2013 en dash, U+2012, U+2010/2011, U+FE63, U+FF0D -> "-" ("−3" is -3, not 3)
  dollars   `\$`, `\text{\$}`, `\textdollar` are dropped (`\boxed{\$23}` is 23)
  grouping  digits grouped in threes by `\,` `\!` `\ ` `{,}`, thin / no-break spaces or plain spaces
            are joined ("1 000 000", `1\,000\,000` -> 1000000; one plain space only where the number is the
            whole text, as in `\boxed{1 000}`: "2 100 dollar bills" stays two numbers); commas are left to the
            number reader
Then the final answer is the last `\boxed{}`, `<answer>` tag, `####` line or, failing those, the last
number, where a LaTeX fraction (`\frac{3}{4}`, `\dfrac34`) is one number and a number inside a math
span (`$...$`, `\(...\)`, `\[...\]`) stands for the span's final expression (`$p = \frac{3}{4}$` ->
`\frac{3}{4}`, `$\sqrt{2}$` -> `\sqrt{2}`), when math-verify can read it.

Importing this module must not import math-verify (`grpo validate` stays fast).
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from typing import Any

EXTRACT_MODES = ("auto", "boxed", "tag", "gsm8k", "last_number")

_DASHES = str.maketrans(dict.fromkeys("\u2212\u2013\u2012\u2010\u2011\ufe63\uff0d", "-"))
_DOLLAR = re.compile(r"\\text\s*\{\s*\\\$\s*\}|\\textdollar\b\s*|\\\$")
# Digits in groups of three, one separator kind per number; the first group has 1-3 digits.
_GROUPED = re.compile(
    r"(?<![\d.,])(?<![\d.,] )(\d{1,3})(\\[,! ]|\{,\}|[ \u00a0\u2009\u202f])(\d{3})((?:\2\d{3})*)(?![\d])"
)
_FRAC = r"\\[dt]?frac\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)"
# A number as people write it: optional minus (not a subtraction: "3-5" gives 5), thousands
# separators ("1,000"), decimals, simple fractions ("3/4") and LaTeX fractions.
_NUMBER = re.compile(rf"(?<![\w.])-?(?:{_FRAC}|(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?)")
# Math spans; a lone `$` is a math delimiter only as in pandoc: no space inside it, no digit after
# the closing one, so "costs $5 and $7" holds no span.
_MATH_SPAN = re.compile(
    r"\$\$(.+?)\$\$|\\\((.+?)\\\)|\\\[(.+?)\\\]|(?<![\\$])\$(?![\s$])([^$]+?)(?<![\s\\])\$(?!\d)", flags=re.DOTALL
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT_CMD = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]")
_PLAIN_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own default, used where its signal.alarm can work


def _join_groups(m: re.Match, whole: bool) -> str:
    if m.group(2) == " " and not m.group(4) and not whole:
        return m.group(0)  # "2 100 dollar bills" in running text is two numbers; "1 000 000" or a bare "1 000" is one
    sep = re.escape(m.group(2))
    return m.group(1) + m.group(3) + re.sub(sep, "", m.group(4))


def clean_answer(text: str) -> str:
    """Dashes read as minus, escaped dollars dropped, digit groups joined (see the module docstring)."""
    text = _DOLLAR.sub("", text.translate(_DASHES))
    whole = _GROUPED.fullmatch(text.strip()) is not None
    return _GROUPED.sub(lambda m: _join_groups(m, whole), text)


# --------------------------------------------------------------------------- answer extraction


def _last_boxed(text: str) -> str | None:
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


def _last_tag(text: str, tag: str) -> str | None:
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return (found[-1].strip() or None) if found else None


def _after_hashes(text: str) -> str | None:
    """GSM8K writes the final answer after `####`; keep the rest of that line."""
    idx = text.rfind("####")
    if idx < 0:
        return None
    rest = text[idx + 4 :].strip()
    line = rest.splitlines()[0].strip().rstrip(".").strip() if rest else ""
    return line or None


def _number_text(found: str) -> str:
    return found if "frac" in found else found.replace(",", "")


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return _number_text(found[-1]) if found else None


def _final_expression(span: str) -> str:
    """The right-hand side of a span's last top-level `=` (or `\\approx`): `p = \\frac{3}{4}` -> `\\frac{3}{4}`."""
    depth, cut = 0, 0
    for i, ch in enumerate(span):
        depth += (ch in "{([") - (ch in "})]")
        if depth == 0 and (ch == "=" or span.startswith("\\approx", i)):
            cut = i + (1 if ch == "=" else len("\\approx"))
    return span[cut:].strip().rstrip(".,;").strip()


def _last_number_or_math(text: str) -> str | None:
    """The last number; inside a math span, the span's final expression if math-verify reads it."""
    found = list(_NUMBER.finditer(text))
    if not found:
        return None
    last = found[-1]
    for span in _MATH_SPAN.finditer(text):
        if span.start() <= last.start() and last.end() <= span.end():
            content = next(g for g in span.groups() if g is not None)
            expression = _final_expression(content)
            if expression and not _PLAIN_WORD.search(_TEXT_CMD.sub("", expression)) and _parse(expression):
                return expression
    return _number_text(last.group())


def extract_answer(text: str, mode: str = "auto", tag: str = "answer") -> str | None:
    """The final answer written in `text`, cleaned (`clean_answer`), or None when there is none.

    mode: `boxed` (last \\boxed{...}), `tag` (last <tag>...</tag>), `gsm8k` (after the last ####),
    `last_number` (last number, a LaTeX fraction counts as one; "1,000" -> "1000"), `auto` (boxed,
    then tag, then gsm8k, then the last number or, when that number is inside a math span, the span's
    final expression).
    """
    text = clean_answer(text)
    if mode == "boxed":
        return _last_boxed(text)
    if mode == "tag":
        return _last_tag(text, tag)
    if mode == "gsm8k":
        return _after_hashes(text)
    if mode == "last_number":
        return _last_number(text)
    if mode == "auto":
        for find in (_last_boxed, lambda t: _last_tag(t, tag), _after_hashes, _last_number_or_math):
            found = find(text)
            if found is not None:
                return found
        return None
    raise ValueError(f"unknown answer extraction mode {mode!r}; valid: {', '.join(EXTRACT_MODES)}")


def reference_text(answer: Any) -> str | None:
    """A dataset's reference answer as text: GSM8K "... #### 72" -> "72"; numbers written out in full."""
    if answer is None:
        return None
    if isinstance(answer, float):
        return format(Decimal(repr(answer)), "f")  # 1e-07 -> "0.0000001", which math-verify reads
    if isinstance(answer, str):
        return _after_hashes(answer) if "####" in answer else answer.strip()
    return str(answer)


# --------------------------------------------------------------------------- math-verify


def _math_verify_timeout() -> int | None:
    # math-verify times out with signal.alarm, which raises off the main thread; None disables it
    # there (give the reward `timeout_s` to bound it with a child process instead).
    return _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, timeout: int | None = None) -> list:
    """math-verify parse of a bare answer. LaTeX-looking text is read inside $...$ (so `\\sqrt{2}`,
    `2^{10}` and `(1, 2)` parse); text with words is read plainly, so "Paris" is not a product
    of five symbols and "12 dollars" is 12."""
    from math_verify import parse

    timeout = _math_verify_timeout() if timeout is None else timeout
    if "$" in text:
        tries = [text]
    elif _LATEX_COMMAND.search(text) or not _PLAIN_WORD.search(text):
        tries = [f"${text}$", text]
    else:
        tries = [text]
    for t in tries:
        parsed = parse(t, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def answers_match(reference: str, predicted: str) -> bool:
    """True if math-verify finds `predicted` equivalent to `reference` ("0.5" vs "1/2" is True), both
    cleaned first (`clean_answer`). Text that math-verify cannot read is compared as words, case-insensitively."""
    from math_verify import verify

    reference, predicted = clean_answer(reference), clean_answer(predicted)
    timeout = _math_verify_timeout()
    gold, pred = _parse(reference, timeout), _parse(predicted, timeout)
    if not gold or not pred:
        return " ".join(reference.lower().split()) == " ".join(predicted.lower().split())
    return bool(verify(gold, pred, timeout_seconds=timeout))
