r"""Final answers: extraction from a completion and equivalence with a reference (math-verify).

Before anything is read, text is written the one way the rule reads it (notation.py's `clean_answer`: Unicode digits,
fractions and math symbols, scale words after digits, spelled numbers in digits by text2num, sign words, dashes as
minus, escaped dollars dropped, digit groups joined).
Then the final answer (`extract_answer`, mode `auto`) is, in this order:
  1. marked: the last `\boxed{}`, `<answer>` tag or `####` line;
  2. stated: after the last answer phrase ("the answer is", "Final answer:", "answer =", "the answer to the
     question would be"), the rest of its sentence read as a statement (as in rule 3: "Answer: 42" is 42,
     "the answer: 3 + 4 = 7, then 7 * 2 = 14" is 14), numbers negated ("not 40", "isn't 40") passed over, unless a
     correction follows it ("Wait, no: 24", "actually", "I mean", "or rather", "sorry", "on second thought"):
     then the correction's number. Numbers written after the statement are remarks and do not count
     ("Final answer: 42. Note that 40 would be wrong." is 42);
  3. concluded: in the last sentence that holds a number, the clause from its last conclusion word ("so",
     "thus", "therefore", "hence", "in total", "altogether", "overall"; not "so far", "so that") gives the
     number after its last result link (=, is, are, equals, gives, makes, yields, has, holds, costs, leaves,
     ... "So 5 apples and 3 apples make 8": 8), or its first number when it has none ("so 42 marbles fit in 6
     jars": 42); numbers right after a preposition ("in 6 jars", "after 2 hours", "more than 40") are passed
     over while the clause has others, and a trailing remark (", which is ...", "(since ...)") is left out;
  4. otherwise the last sentence (or line) with a number states it: its last number, unless that only comments,
     conditions or scopes what the sentence stated. Left out: a closing paragraph that notes or checks ("Note: ...",
     "Check: 30 - 12 = 18"), the sentence's tail after ", which is", ", i.e.", " - ", "since", "because", "if",
     "when", "assuming", "given", "after ...ing", "for the/each" (unless the tail computes what the sentence did
     not state: "we add 6 and 8, which is 6 + 8 = 14"); a last number right after a preposition in a sentence that
     states a result gives way to that result ("3 x $6 = $18 for 3 shirts": 18).
A number is an integer, a decimal, scientific notation ("3.2e4", `3.2 \times 10^{4}`), a fraction ("3/4",
`\frac{3}{4}`, `\dfrac34`), a mixed number ("3 3/4"), not an ordinal ("4th") or a power's exponent; in rules 2
and 3, after a result link, and in a completion without digits, also the number words `clean_answer` leaves as
words (a lone "one", "two", "zero"); a number inside a math span (`$...$`, `\(...\)`, `\[...\]`) stands for
the span's final expression (`$p = \frac{3}{4}$` -> `\frac{3}{4}`, `$\sqrt{2}$` -> `\sqrt{2}`), when math-verify
can read it. What the rule cannot tell apart: a conclusion whose answer comes after a number the
clause only mentions, with neither a link nor a preposition to tell them apart ("So 3 boxes fill 42 jars"
reads 3); box the answer or state it ("the answer is 42") to be read right every time.

Equivalence (`answers_match`): two plain numbers (grpo_cli/rewards/numbers.py) are compared exactly, to six
decimals and six significant digits ("0.5" = "1/2" = "5e-1", "3 3/4" = "3.75", "five" = "5"; 1e-9 != 3e-9); a
percentage is both its number and its hundredth ("25%" answers 25 and 0.25); anything else by math-verify.

Importing this module must not import math-verify (`grpo validate` stays fast).
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from typing import Any, Callable

from grpo_cli.rewards.notation import Spelled, clean_answer, spelled
from grpo_cli.rewards.numbers import numbers_match, percent_value, read_number

_FRAC = r"\\[dt]?frac\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)"
_EXPONENT = r"(?:[eE][-+]?\d+|\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*\{?\s*[-+]?\d+\s*\}?)(?![\w])"
# A number as people write it: optional minus (not a subtraction: "3-5" gives 5), thousands
# separators ("1,000"), decimals, scientific notation ("3.2e4"), simple fractions ("3/4"), mixed numbers
# ("3 3/4") and LaTeX fractions.
_NUMBER = re.compile(
    rf"(?<![\w.^])(?<!\^\{{)-?(?:\d+\s+\d+/\d+(?![\d/]|\.\d)|\d+\s*{_FRAC}|{_FRAC}"
    rf"|(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?:{_EXPONENT}|/\d+(?:\.\d+)?)?)(?!\d|st\b|nd\b|rd\b|th\b)"
)
# The last answer phrase: "the answer is", "Final answer:", "answer =", "the answer to part a would be"
_ANSWER_PHRASE = re.compile(
    r"\banswers?\b[^.!?\n\d]{0,40}?(?:\b(?:is|was|would\s+be|will\s+be|should\s+be|must\s+be|equals|comes\s+to)\b"
    r"|[:=])", flags=re.IGNORECASE,
)
_CORRECTION = re.compile(
    r"(?:^|(?<=[\s.!?;,:(]))(?:wait|no(?=\s*[,:;!.\-])|nope|actually|correction|sorry|oops|i\s+mean|or\s+rather"
    r"|on\s+second\s+thought)\b", flags=re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"(?:^|(?<=[.!?;:,\n])|(?<=[.!?;:,]\s)|(?<=\band\s))\s*(?:so|thus|therefore|hence|in\s+total|altogether"
    r"|overall|in\s+all)\b(?!\s+(?:far|that|on|much|many)\b)", flags=re.IGNORECASE,
)
_LINK = re.compile(
    r"=|\\approx|≈|\b(?:is|are|was|were|equals?|gives?|makes?|yields?|comes\s+to|totals?|leaves?|has|have|had"
    r"|holds?|contains?|costs?|gets?|earns?)\b", flags=re.IGNORECASE,
)
# a number right after a preposition is context ("in 6 jars", "after 2 hours", "more than 40"), not a result
_AFTER_PREPOSITION = re.compile(
    r"\b(?:in|on|at|after|before|for|over|per|of|by|with|within|during|from|into|between|among|than)\s+"
    r"(?:(?:the|a|an|every|each|all)\s+)?\$?$", flags=re.IGNORECASE,
)
# what follows a statement's number without being its result: a comment (", which is", "(", ", i.e.", " - ") or a
# condition, cause or scope (", since", "because", "if", "when", "assuming", "after ...ing", "for the/each ...")
_TAIL = (r",\s*(?:which|that)\s+(?:is|was|are|were)\b|,\s*i\.e\.|\s[—–]\s|,?\s(?:since|because|if|when|whenever"
         r"|assuming|given|provided|unless)\b|,?\s(?:after|before|once|while)\s+\w+ing\b|\sfor\s+(?:the|all|each|every)\s")
_REMARK = re.compile(_TAIL + r"|\s\(", flags=re.IGNORECASE)
_LAST_REMARK = re.compile(_TAIL, flags=re.IGNORECASE)
_COMPUTES = re.compile(r"=|\bequals?\b|\bresults?\s+in\b", flags=re.IGNORECASE)
_LINK_BEFORE = re.compile(r"(?:=|\b(?:is|are|was|were|equals?|makes?|gives?|comes\s+to|totals?))\s*$", flags=re.IGNORECASE)
# a closing paragraph that checks or comments on what came before
_NOTE = re.compile(r"\n\s*\n\s*\(?\**(?:note|check|verification|verify|double[- ]check|sanity check|remark|p\.s\.)\b"
                   r"(?!.*\n\s*\n)", flags=re.IGNORECASE | re.DOTALL)
_NEGATED = re.compile(r"(?:\bnot|\bnever|n't)\s+(?:\w+\s+)?$", flags=re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
# Math spans; a lone `$` is a math delimiter only as in pandoc: no space inside it, no digit after
# the closing one, so "costs $5 and $7" holds no span.
_MATH_SPAN = re.compile(
    r"\$\$(.+?)\$\$|\\\((.+?)\\\)|\\\[(.+?)\\\]|(?<![\\$])\$(?![\s$])([^$]+?)(?<![\s\\])\$(?!\d)", flags=re.DOTALL
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT_CMD = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]")
_PLAIN_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_PERCENT = re.compile(r"\s?(?:\\?%|percent\b)", flags=re.IGNORECASE)
_MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own default, used where its signal.alarm can work


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


def _as_answer(text: str, m: re.Match) -> str:
    """A number found in `text`: inside a math span the span's final expression if math-verify reads it; number
    words as digits."""
    if isinstance(m, Spelled):
        return m.group()
    for span in _MATH_SPAN.finditer(text):
        if span.start() <= m.start() and m.end() <= span.end():
            content = next(g for g in span.groups() if g is not None)
            expression = _final_expression(content)
            if expression and not _PLAIN_WORD.search(_TEXT_CMD.sub("", expression)) and _parse(expression):
                return expression
    return _number_text(m.group()) + ("%" if _PERCENT.match(text, m.end()) else "")


def _numbers(text: str, start: int, end: int, words: bool) -> list[re.Match | Spelled]:
    """Numbers (and the number words left in words) within text[start:end] not negated ("not 40"), in order."""
    found: list[re.Match | Spelled] = list(_NUMBER.finditer(text, start, end))
    if words:
        taken = [(m.start(), m.end()) for m in found]
        found += [w for w in spelled(text, start, end)
                  if not any(a < w.end() and w.start() < b for a, b in taken)]
    found = [m for m in found if not _NEGATED.search(text[start : m.start()])]
    return sorted(found, key=lambda m: m.start())


def _sentence_end(text: str, pos: int) -> int:
    m = _SENTENCE_END.search(text, pos)
    return m.start() if m else len(text)


def _sentence_start(text: str, pos: int) -> int:
    starts = [m.end() for m in _SENTENCE_END.finditer(text, 0, pos)]
    return starts[-1] if starts else 0


def _clause_number(text: str, start: int, end: int, words: bool = True) -> re.Match | Spelled | None:
    """A statement's number: after its last result link that has a number after it, else its first number;
    a trailing remark (", which is ...", "(...") left out, numbers right after a preposition passed over while
    there are others."""
    remark = _REMARK.search(text, start, end)
    end = remark.start() if remark else end
    numbers = _numbers(text, start, end, words=words)
    results = [m for m in numbers if not _AFTER_PREPOSITION.search(text[start : m.start()])]
    numbers = results or numbers
    for link in reversed(list(_LINK.finditer(text, start, end))):
        after = [m for m in numbers if m.start() >= link.end()]
        if after:
            return after[0]
    return numbers[0] if numbers else None


def _stated_answer(text: str) -> str | None:
    """Rules 2 and 3 of the module docstring: the number an answer phrase or a conclusion states, or None."""
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        answer = _clause_number(text, phrases[-1].end(), _sentence_end(text, phrases[-1].end()))
        if answer is not None:
            for fix in _CORRECTION.finditer(text, answer.end()):
                corrected = _clause_number(text, fix.end(), _sentence_end(text, fix.end()))
                if corrected is not None and corrected.start() > answer.start():
                    answer = corrected
            return _as_answer(text, answer)
    digits = list(_NUMBER.finditer(text))
    if not digits:
        return None
    start = _sentence_start(text, digits[-1].start())
    end = _sentence_end(text, digits[-1].end())
    cues = list(_CONCLUSION.finditer(text, start, end))
    found = _clause_number(text, cues[-1].end(), end) if cues else None
    return _as_answer(text, found) if found is not None else None


def _last_number_or_math(text: str) -> str | None:
    """The last number that is not a remark; inside a math span, the span's final expression if math-verify reads
    it. Number words count where a result link comes right before them ("47 plus 18 is sixty-five"), and without any
    digit, everywhere ("There are five."). Remarks, as in rule 2: a closing paragraph
    that checks or notes ("Note: ...", "Check: 6 * 7 = 42"), and the end of the last sentence after ", which is",
    ", since", " - " ("It costs 42 dollars, which is 8 less than 50." is 42)."""
    note = _NOTE.search(text)
    if note and (_NUMBER.search(text, 0, note.start()) or spelled(text, 0, note.start())):
        text = text[: note.start()]
    digits = list(_NUMBER.finditer(text))
    words = spelled(text)  # what clean_answer left in words: "one", "two", "zero"
    stated = [w for w in words if _LINK_BEFORE.search(text, max(0, w.start() - 24), w.start())]  # "7 - 5 is two"
    found = sorted(digits + stated, key=lambda m: m.start()) or words
    if not found:
        return None
    last = found[-1]
    start = _sentence_start(text, last.start())
    remark = _LAST_REMARK.search(text, start, last.start())
    if remark and _COMPUTES.search(text, remark.start(), last.end()) and not _LINK.search(text, start, remark.start()):
        remark = None  # "we add 6 and 8, which is 6 + 8 = 14": the tail computes what the sentence did not state
    before = [m for m in found if remark and start <= m.start() < remark.start()]
    if not before and _AFTER_PREPOSITION.search(text, start, last.start()) and _LINK.search(text, start, last.start()):
        before = [_clause_number(text, start, last.end(), words=False) or last]  # "3 x $6 = $18 for 3 shirts": 18
    return _as_answer(text, before[-1] if before else last)


def _auto(text: str, tag: str) -> str | None:
    """The module docstring's rule: boxed, then tag, then gsm8k, then the stated answer, then the last number."""
    for find in (_last_boxed, lambda t: _last_tag(t, tag), _after_hashes, _stated_answer, _last_number_or_math):
        found = find(text)
        if found is not None:
            return found
    return None


# answer extraction modes, in the order the docs and errors list them: (cleaned text, tag) -> the answer or None
EXTRACTORS: dict[str, Callable[[str, str], str | None]] = {
    "auto": _auto,
    "boxed": lambda text, tag: _last_boxed(text),
    "tag": lambda text, tag: _last_tag(text, tag),
    "gsm8k": lambda text, tag: _after_hashes(text),
    "last_number": lambda text, tag: _last_number(text),
}
EXTRACT_MODES = tuple(EXTRACTORS)


def extract_answer(text: str, mode: str = "auto", tag: str = "answer") -> str | None:
    """The final answer written in `text`, cleaned (`clean_answer`), or None when there is none.

    mode (an `EXTRACTORS` entry): `boxed` (last \\boxed{...}), `tag` (last <tag>...</tag>), `gsm8k` (after the last
    ####), `last_number` (last number, a LaTeX fraction counts as one; "1,000" -> "1000"), `auto` (boxed, then tag,
    then gsm8k, then the stated answer, then the last number: the module docstring's rule).
    """
    if mode not in EXTRACTORS:
        raise ValueError(f"unknown answer extraction mode {mode!r}; valid: {', '.join(EXTRACT_MODES)}")
    return EXTRACTORS[mode](clean_answer(text), tag)


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
    """True if `predicted` is equivalent to `reference`, both cleaned first (`clean_answer`): two plain numbers
    compared exactly (to six decimals and six significant digits: grpo_cli/rewards/numbers.py), anything else by
    math-verify ("\\sqrt{8}" vs "2\\sqrt{2}" is True). Text that math-verify cannot read is compared as words,
    case-insensitively."""
    from math_verify import verify

    reference, predicted = clean_answer(reference), clean_answer(predicted)
    exact = read_number(reference), read_number(predicted)
    if exact[0] is not None and exact[1] is not None:
        return numbers_match(*exact)
    percent = [percent_value(t) for t in (reference, predicted)]
    if any(p is not None for p in percent):  # "25%" is the answer 25 and the answer 0.25
        a, b = (percent[k] if percent[k] is not None else [exact[k]] for k in (0, 1))
        return any(x is not None and y is not None and numbers_match(x, y) for x in a for y in b)
    timeout = _math_verify_timeout()
    gold, pred = _parse(reference, timeout), _parse(predicted, timeout)
    if not gold or not pred:
        return " ".join(reference.lower().split()) == " ".join(predicted.lower().split())
    return bool(verify(gold, pred, timeout_seconds=timeout))
