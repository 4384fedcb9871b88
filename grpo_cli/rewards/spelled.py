"""Numbers spelled in words, read by text2num (a maintained parser of number words): where a text spells them
(`spelled`), the text with them in digits (`spell_digits`), and the value of a text that is one (`words_value`).
notation.py's words step and the answer rule's readers use them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_TOKEN = re.compile(r"[^\W\d_]+|\d+|\s+|\S")  # words, digit runs, spaces, single marks: what text2num reads


@dataclass(frozen=True)
class Spelled:
    """A spelled number in a text, shaped as the answer rule's number matches are (start(), end(), group())."""

    begin: int
    finish: int
    digits: str  # its value as text2num writes it: "105", "2.5"

    def start(self) -> int:
        return self.begin

    def end(self) -> int:
        return self.finish

    def group(self) -> str:
        return self.digits


class _Token:
    """A token for text2num's find_numbers, which reads tokens, not text."""

    __slots__ = ("m",)

    def __init__(self, m: re.Match) -> None:
        self.m = m

    def text(self) -> str:
        return self.m.group()

    def nt_separated(self, previous) -> bool:
        return False

    def not_a_number_part(self) -> bool:
        return False


def spelled(text: str, start: int = 0, end: int | None = None, threshold: float = 0) -> list[Spelled]:
    """The spelled numbers in text[start:end], ordinals left out. `threshold` is text2num's: a lone number word
    counts only when its value is at least this (3 keeps "one" and "two" words; 0 reads them all)."""
    from text_to_num import find_numbers

    end = len(text) if end is None else end
    if not re.search(r"[A-Za-z]", text[start:end]):
        return []
    tokens = [_Token(m) for m in _TOKEN.finditer(text, start, end)]
    found = []
    for o in find_numbers(tokens, "en", threshold):
        if o.is_ordinal:
            continue
        found.append(Spelled(tokens[o.start].m.start(), tokens[o.end - 1].m.end(), o.text))
    return found


def spell_digits(text: str, threshold: float = 3) -> str:
    """`text` with its spelled numbers written in digits (see `spelled`)."""
    out, at = [], 0
    for s in spelled(text, threshold=threshold):
        out += [text[at : s.begin], s.digits]
        at = s.finish
    return "".join(out) + text[at:]


def words_value(text: str) -> Fraction | None:
    """The value of `text` when it is one spelled number ("five", "minus twelve", "one hundred and five", "two point
    five"), else None."""
    t = text.strip()
    sign, rest = 1, t
    if m := re.match(r"(minus|negative)\s+", t, flags=re.IGNORECASE):
        sign, rest = -1, t[m.end() :]
    found = spelled(rest)
    if len(found) != 1 or found[0].begin != 0 or found[0].finish != len(rest):
        return None
    return sign * Fraction(found[0].digits)
