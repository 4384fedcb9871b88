r"""Answers of several values or a relation: `accuracy` with a reference that is a list of values ("2, 3": both roots
of an equation), an ordered tuple ("(5, 7)": a point) or an inequality ("x > 4"), where the completion marks no answer
(a marked one, `\boxed{}`, a tag or `####`, is compared whole by `answers_match`, as every answer is).

Each is read in the completion's final statement (results.py's: its last sentence with a number, after the closing
notes and checks answers.py leaves out; none where the text is cut off mid-statement):
  - a tuple: the last parenthesised tuple of as many values ("The midpoint is (5, 7).", "so M(5, 7)"), each value equal
    to the reference's in its place;
  - a list: the numbers after the statement's last conclusion word, link or colon ("so x = 2 or x = 3", "The roots
    are 2 and 3.", "Solutions: 2, 3"), equal to the reference's values as a set: all of them and no other ("x = 2"
    alone answers half the question, and a grader takes it as wrong);
  - a relation: the last relation between one letter and a number ("2x > 8, so x > 4."), the same as the reference's
    once both are written letter first ("4 < x" is "x > 4"; "≥", "\geq" and ">=" are one sign).
"""

from __future__ import annotations

import re

from grpo_cli.rewards.clauses import CONCLUDES, CUT_OFF, LINK
from grpo_cli.rewards.notation import clean_answer
from grpo_cli.rewards.numbers import NUMBER, answers_match
from grpo_cli.rewards.results import closing_text, last_statement

_VALUE = r"-?\d+(?:\.\d+)?(?:/\d+)?"
_OPERATOR = r"<=|>=|!=|\\geq?\b|\\leq?\b|\\neq?\b|[<>≤≥≠]"
_SIGNS = {"\\ge": ">=", "\\geq": ">=", "≥": ">=", "\\le": "<=", "\\leq": "<=", "≤": "<=", "\\ne": "!=", "\\neq": "!=",
          "≠": "!="}
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "!=": "!="}
_TUPLE_REFERENCE = re.compile(rf"\s*[(\[]\s*({_VALUE}(?:\s*,\s*{_VALUE})+)\s*[)\]]\s*")
_LIST_REFERENCE = re.compile(rf"\s*(?:[A-Za-z]\s*=\s*)?({_VALUE}(?:\s*(?:,|;|\band\b|\bor\b)\s*{_VALUE})+)\s*")
_RELATION = re.compile(rf"(?<![\w.\\])([A-Za-z])\s*({_OPERATOR})\s*({_VALUE})(?!\w|\.\d)"
                       rf"|(?<![\w.])({_VALUE})\s*({_OPERATOR})\s*([A-Za-z])(?![\w(])")
_TUPLE = re.compile(rf"[(\[]\s*({_VALUE}(?:\s*,\s*{_VALUE})+)\s*[)\]]")


def several_reference(reference: str) -> tuple[str, list[str]] | None:
    """The kind of a reference of several values or a relation ("tuple", "list" or "relation") and its parts ("(5, 7)":
    ["5", "7"]; "2, 3": ["2", "3"]; "x > 4": ["x", ">", "4"]); None for any other reference."""
    text = clean_answer(reference).strip().strip("$").replace("\\{", "").replace("\\}", "").strip("{}").strip()
    if (found := _TUPLE_REFERENCE.fullmatch(text)) is not None:
        return "tuple", re.split(r"\s*,\s*", found.group(1))
    if (found := _LIST_REFERENCE.fullmatch(text)) is not None:
        return "list", re.findall(_VALUE, found.group(1))
    if (found := _RELATION.fullmatch(text)) is not None:
        return "relation", _relation(found)
    return None


def states_several(completion: str, reference: str, tag: str = "answer") -> bool:
    """Whether the final statement of `completion` states the reference of several values or the relation (the module
    docstring's rule); False for any other reference, and where the completion marks its answer."""
    if (kind := several_reference(reference)) is None or (text := closing_text(completion, tag)) is None:
        return False
    if (last := last_statement(text)) is None or CUT_OFF.search(text):
        return False
    (name, values), (start, end) = kind, last
    if name == "tuple":
        tuples = [re.split(r"\s*,\s*", m.group(1)) for m in _TUPLE.finditer(text, start, end)]
        tuples = [t for t in tuples if len(t) == len(values)]
        return bool(tuples) and all(answers_match(a, b) for a, b in zip(values, tuples[-1]))
    if name == "relation":
        found = [_relation(m) for m in _RELATION.finditer(text, start, end)]
        return bool(found) and found[-1][:2] == values[:2] and answers_match(values[2], found[-1][2])
    cues = [m.end() for m in CONCLUDES.finditer(text, start, end)]
    cues += [i + 1 for i, ch in enumerate(text[start:end], start) if ch == ":"]  # "Solutions: 2, 3"
    cues += [m.end() for m in LINK.finditer(text, start, end) if m.group() not in ("=", "\\approx", "≈")]
    stated = [m.group() for m in NUMBER.finditer(text, max(cues, default=start), end)]
    return bool(stated) and all(any(answers_match(v, s) for s in stated) for v in values) and all(
        any(answers_match(v, s) for v in values) for s in stated)


def _relation(m: re.Match) -> list[str]:
    """A relation found by `_RELATION` written letter first, its sign in one spelling: "4 < x" -> ["x", ">", "4"]."""
    if m.group(1) is not None:
        return [m.group(1), _SIGNS.get(m.group(2), m.group(2)), m.group(3)]
    sign = _SIGNS.get(m.group(5), m.group(5))
    return [m.group(6), _FLIPPED[sign], m.group(4)]
