"""An answer stated first (answers.py's rule 4a): "18 apples. John started with 30 and gave away 12."

Chat models often open with the answer and then say where it came from. What follows restates the givens, so the last
number is a given (12), not the answer (18), and a grader reads the opening. The opening sentence (the first with a
number, after any preamble) is the answer when:
  - it is short (at most eight words) and states one number, unlabelled and not computed ("18 apples.", "She is 11.",
    "32 m remain.", "Thirteen.", "$1.50."; not "Each year: $20.");
  - what follows holds two numbers and states no result of its own: no conclusion word ("so", "in total", ...), no
    "=" before a number, no result link or colon before its last number ("that makes 36", "Over 3 years: $60");
  - the two give the opening's by one operation (+, -, ×, ÷): they are what it was computed from ("John started with
    30 and gave away 12": 30 - 12 = 18; "There are 7 days in each of the 3 weeks": 7 × 3 = 21).
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_cli.rewards.clauses import CONCLUDES, LINK, SENTENCE_END, sentence_start
from grpo_cli.rewards.numbers import NUMBER, read_number

MAX_WORDS = 8
_COMPUTES = re.compile(r"=\s*\$?-?\d")
_COMPUTED = re.compile(r"[=+*/×÷^]|\\(?:times|div|cdot|frac)|\s-\s")


def opening_number(text: str) -> re.Match | None:
    """The number of `text`'s opening sentence where that sentence is the answer (the module docstring's rule);
    None otherwise."""
    first = NUMBER.search(text)  # a preamble without numbers comes before it: "Sure! Let's see.", a think block
    end = SENTENCE_END.search(text, first.end()) if first else None
    if end is None or not (rest := text[end.end():]).strip():
        return None
    opening = text[sentence_start(text, first.start()): end.start()]
    found = list(NUMBER.finditer(opening))
    computed = _COMPUTED.search(re.sub(r"(?<=[A-Za-z])\^\{?[23]\}?", "", opening))  # not a unit's power: "40 m²"
    if len(found) != 1 or len(opening.split()) > MAX_WORDS or computed or ":" in opening \
            or (value := read_number(found[0].group().replace(",", ""))) is None:
        return None
    given = list(NUMBER.finditer(rest))
    between = rest[given[0].end():given[1].start()] if len(given) == 2 else ""
    if len(given) != 2 or CONCLUDES.search(rest) or _COMPUTES.search(rest) or ":" in between or LINK.search(between):
        return None
    a, b = (read_number(m.group().replace(",", "")) for m in given)
    return found[0] if a is not None and b is not None and value in _results(a, b) else None


def _results(a: Fraction, b: Fraction) -> set[Fraction]:
    """What one operation of a and b gives, in either order."""
    return {a + b, a - b, b - a, a * b} | ({a / b} if b else set()) | ({b / a} if a else set())
