r"""Final answers: which number in a completion is its answer (`extract_answer`).

Before anything is read, text is written the one way the rule reads it (notation.py's `clean_answer`: Unicode digits,
fractions and math symbols, scale words after digits, spelled numbers in digits by text2num, sign words, dashes as
minus, escaped dollars dropped, digit groups joined).
Then the final answer (`extract_answer`, mode `auto`) is, in this order:
  1. marked: the last `\boxed{}`, `<answer>` tag or `####` line;
  2. stated: after the last answer phrase ("the answer is", "Final answer:", "answer =", "the answer to the question
     would be"), the rest of its sentence read as a statement (as in rule 3: "Answer: 42" is 42, "the answer: 3 + 4 =
     7, then 7 * 2 = 14" is 14), numbers negated ("not 40", "isn't 40") passed over, unless a correction follows it
     ("Wait, no: 24", "actually", "I mean", "or rather", "sorry", "on second thought"): then the correction's number.
     Numbers written after the statement are remarks and do not count ("Final answer: 42. Note that 40 would be
     wrong." is 42); a stated choice or expression in plain text is taken whole ("The answer is (C).", "So the answer
     is 2x + 3.");
  3. concluded: in the last sentence that holds a number, the clause from its last conclusion word ("so", "thus",
     "therefore", "hence", "in total", "altogether", "overall", "yes,"; not "so far", "so that") gives the number after
     its last result link (=, is, are, equals, gives, makes, yields, has, costs, pays, leaves, ... "So 5 apples and 3
     apples make 8": 8), or its first number when it has none ("so 42 marbles fit in 6 jars": 42), unless one is a total
     ("so 6 more days: 16 days in total": 16); numbers right after a preposition ("in 6 jars", "after 2 hours", "more
     than 40") are passed over while the clause has others, and a trailing remark (", which is ...", "(since ...)") is
     left out; a last sentence that ends in an expression after "=" or a link gives it ("The line is y = 3x - 4.",
     "leaves 2x + 2"); a conclusion before the sentence's last semicolon concludes its clause only, where the clause
     after it holds a number ("so 1 part = 70 g; you need 2 parts: 140 g" goes to rule 4);
  4. otherwise the last sentence (or line) with a number states it: its last number, unless that only comments,
     conditions or scopes what the sentence stated. Left out: a closing paragraph that notes, checks, explains ("Note:
     ...", "Check: 30 - 12 = 18") or holds no number, equation or answer phrase ("P.S. ..."), and a closing sentence
     that checks, compares, supposes or tries another way ("That's 9 more than last year.", "Alternatively, ..."), while
     a number comes before them; the sentence's tail after ", which is", ", i.e.", " - ", "since", "because", "if",
     "when", "assuming", "given", "after ...ing", "for the/each", "for 6 cakes", "on 20 litres" (a count of things, not
     money), ", or about", a comparison (", 6 fewer than Amy"), a range (", from 850 to 1,020"), a share (", 24 in each
     box", ", or 25¢ each", ", 75% of the 28"), a worth (", worth $7"), what is left or described (", with $20 left
     over"), a value assumed (", using pi = 3.14"), a time from an event (", 55 minutes after it left") or a purpose
     ("to complete his collection of 50"; "to get 48" where a need is stated), unless a ", which is" tail computes what
     the sentence did not state ("we add 6 and 8, which is 6 + 8 = 14", "add them together, which is 52", "the total is
     29 + 24, which is 53"), gives the count a stated share stands for ("40% of them walk, which is 12") or the rate of
     a quantity in a time ("18 km in 45 minutes, which is 24 km/h"), or an "if" tail goes on to a consequence ("if they
     share equally each gets 20 / 4 = 5"); the time the stated number took, right after it ("$45 in 3 weeks"); a
     breakdown after a colon that follows a stated number (its parts before a closing parenthesis); a parenthesis that
     ends the sentence; but a tail's number that is the total of the sentence's stated numbers is the answer ("50 pages,
     and in 0.4 minutes 10 pages, for 60 pages": 60). A last number right after a preposition gives way to a result the
     sentence links ("3 x $6 = $18 for 3 shirts": 18), and to the sentence's last number when it only says where the
     stated one came from or went to, what it is out of or its rate, or when the stated one is a rate ("$10 back from
     her $20 bill", "3 of the 12 eggs", "2.5 hours at 60 mph", "60 km/h over the 150 km trip"), not where a link ("left
     with"), "at" or an appositive names it ("gives an average of 84", "1,020, an increase of 170").
     4a. an answer stated first, before the two givens it came from, is the answer (opening.py: "18 apples. John
     started with 30 and gave away 12." is 18);
  5. (`accuracy` only, where nothing is marked or stated by an answer phrase) the other results the final sentence
     states answer too: "Ben pays $36 and Ana pays $48." is right for 36 and 48 (results.py; not with `strict`).
A completion cut off mid-statement, whose text ends on a link, an article or an operator ("... found by Ava is", "9 × 2
=": a rollout stopped at its max_completion_length), is read by rules 1 and 2 only: what it was about to state is not
its last number.
A number is an integer, a decimal, scientific notation ("3.2e4", `3.2 \times 10^{4}`), a fraction ("3/4", `\frac{3}{4}`,
`\dfrac34`), a mixed number ("3 3/4"), a time or a ratio ("11:30", "3:4"), millions ("1.26M"), not an ordinal ("4th") or
a power's exponent; in rules 2 and 3, after a result link, and in a completion without digits, also the number words
`clean_answer` leaves as words (a lone "one", "two", "zero"); a compound quantity ("2 hours and 30 minutes") is one
answer; a number inside a math span (`$...$`, `\(...\)`, `\[...\]`) stands for the span's final expression (`$p =
\frac{3}{4}$` -> `\frac{3}{4}`, `$\sqrt{2}$` -> `\sqrt{2}`), when math-verify can read it. What the rule cannot tell
apart: a conclusion whose answer comes after a number the clause only mentions, with neither a link nor a preposition to
tell them apart ("So 3 boxes fill 42 jars" reads 3); box the answer or state it ("the answer is 42") to be read right
every time. Whether it equals a reference is numbers.py's `answers_match`.

Importing this module must not import math-verify (`grpo validate` stays fast).
"""

from __future__ import annotations

import re
from typing import Callable

from grpo_cli.rewards.clauses import (
    AFTER_PREPOSITION, CLOSING_COMMENT, COMPUTES, CONDITION, CONSEQUENCE, CUT_OFF, LINK, LINK_BEFORE, NAMED, NEGATED,
    NOTE, OPERAND_END, OPERATION, RATE_UNIT, REMARK, RESTATES, SOURCE, STATED_RATE, TIME_SCOPE, TOTAL_AFTER,
    closing_parenthesis, purpose_start, sentence_end, sentence_start, without_aside,
)
from grpo_cli.rewards.marks import after_hashes, last_boxed, last_tag, marked_answer
from grpo_cli.rewards.notation import clean_answer
from grpo_cli.rewards.opening import opening_number
from grpo_cli.rewards.numbers import NUMBER, PLAIN_WORD, QUANTITY, parse_math, quantity_values, sums_to
from grpo_cli.rewards.spelled import Spelled, spelled

# The last answer phrase: "the answer is", "Final answer:", "answer =", "the answer to part a would be"
ANSWER_PHRASE = re.compile(
    r"\banswers?\b[^.!?\n\d]{0,40}?(?:\b(?:is|was|would\s+be|will\s+be|should\s+be|must\s+be|equals|comes\s+to)\b"
    r"|[:=])", flags=re.IGNORECASE,
)
CORRECTION = re.compile(
    r"(?:^|(?<=[\s.!?;,:(]))(?:wait|no(?=\s*[,:;!.\-])|nope|actually|correction|sorry|oops|i\s+mean|or\s+rather"
    r"|on\s+second\s+thought)\b", flags=re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"(?:^|(?<=[.!?;:,\n])|(?<=[.!?;:,]\s)|(?<=\band\s))\s*(?:so|thus|therefore|hence|in\s+total|altogether"
    r"|overall|in\s+all|yes(?=\s*,))\b(?!\s+(?:far|that|on|much|many)\b)", flags=re.IGNORECASE,
)
# Math spans; a lone `$` is a math delimiter only as in pandoc: no space inside it, no digit after
# the closing one, so "costs $5 and $7" holds no span.
_MATH_SPAN = re.compile(
    r"\$\$(.+?)\$\$|\\\((.+?)\\\)|\\\[(.+?)\\\]|(?<![\\$])\$(?![\s$])([^$]+?)(?<![\s\\])\$(?!\d)", flags=re.DOTALL
)
_ALGEBRA = re.compile(r"\d[A-Za-z]\b|\b[A-Za-z]\s*[-+*^]|[-+*^]\s*\(?[A-Za-z]\b")  # "2x", "x^2", "a + b"; not "6 m"
_EXPRESSION = re.compile(r"[\w\s\\{}()\[\]^+\-*/=.,']+")  # what a stated expression is made of
_TEXT_CMD = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}")
_JUST_STATED = re.compile(r"(?<!\bthe\s)(?<!\bthe\s\$)\b\d[\d.,]*\s*%?(?:\s+[\w-]+){0,2}\s*$", flags=re.IGNORECASE)
_COMPUTATION = re.compile(r"\d\s*\}?\s*(?:\\times|\\cdot|\\div|[×·÷*+]|\s-\s)\s*\{?\s*\d")  # "18 \times 2.33"
_PLAIN_NUMBER = re.compile(r"\s*-?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?\s*")
_PERCENT = re.compile(r"\s?(?:\\?%|percent\b)", flags=re.IGNORECASE)
_HALF_OF_DAY = re.compile(r"\s?([ap])\.?\s?m\b\.?", flags=re.IGNORECASE)
_CLOSING_PARAGRAPH = re.compile(r"\n[ \t]*\n(?:(?!\n[ \t]*\n)[^\d=$\\])*[.!?)*]\s*$")  # the last, ending a sentence
_BREAKDOWN = re.compile(r"\s*\$?\d")  # after a colon, a breakdown's parts: "21 marbles: 5 red, 7 blue and 9 green"


def _number_text(found: str) -> str:
    return found if "frac" in found else found.replace(",", "")


def _final_expression(span: str) -> str:
    """The right-hand side of a span's last top-level `=`: `p = \\frac{3}{4}` -> `\\frac{3}{4}`; of an
    approximation, the exact side when it holds a number, computes nothing and is no plain number
    (`\\frac{1}{6} \\approx 0.167` -> `\\frac{1}{6}`, `x \\approx 0.17` -> 0.17, `18 \\times 2.33 \\approx 42` -> 42,
    `2,748 \\approx 2,700` -> 2,700: a plain number's approximation is its rounding)."""
    depth, cut, approx = 0, 0, None
    for i, ch in enumerate(span):
        depth += (ch in "{([") - (ch in "})]")
        if depth == 0 and ch == "=":
            cut, approx = i + 1, None
        elif depth == 0 and span.startswith("\\approx", i):
            approx = i
    exact = approx is not None and re.search(r"\d", span[cut:approx]) and not _COMPUTATION.search(span, cut, approx) \
        and not _PLAIN_NUMBER.fullmatch(span[cut:approx])  # a plain number's approximation is its rounding
    expression = span[cut:approx] if exact else span[approx + len("\\approx"):] if approx is not None else span[cut:]
    return expression.strip().rstrip(".,;").strip()


def as_answer(text: str, m: re.Match) -> str:
    """A number found in `text`: inside a math span the span's final expression if math-verify reads it; number
    words as digits."""
    if isinstance(m, Spelled):
        return m.group()
    for q in QUANTITY.finditer(text, max(0, m.start() - 40), min(len(text), m.end() + 40)):
        if q.start() <= m.start() < q.end() and quantity_values(q.group()) is not None:
            return q.group()  # "2 hours and 30 minutes": a compound quantity is one answer
    for span in _MATH_SPAN.finditer(text):
        if span.start() <= m.start() and m.end() <= span.end():
            content = next(g for g in span.groups() if g is not None)
            expression = _final_expression(content)
            if expression and not PLAIN_WORD.search(_TEXT_CMD.sub("", expression)) and parse_math(expression):
                return expression
    if re.fullmatch(r"\d{1,2}(?::[0-5]\d)?", m.group()) and (half := _HALF_OF_DAY.match(text, m.end())):
        return f"{m.group()} {half.group(1).upper()}M"  # "4:05 p.m.", "4 pm": the half of the day is the answer's
    return _number_text(m.group()) + ("%" if _PERCENT.match(text, m.end()) else "M" if text.startswith("M", m.end())
                                      and not text[m.end() + 1: m.end() + 2].isalnum() else "")  # "1.26M people"


def numbers_in(text: str, start: int, end: int, words: bool) -> list[re.Match | Spelled]:
    """Numbers (and the number words left in words) within text[start:end] not negated ("not 40"), in order."""
    found: list[re.Match | Spelled] = list(NUMBER.finditer(text, start, end))
    if words:
        taken = [(m.start(), m.end()) for m in found]
        found += [w for w in spelled(text, start, end)
                  if not any(a < w.end() and w.start() < b for a, b in taken)]
    found = [m for m in found if not NEGATED.search(text[start : m.start()])]
    return sorted(found, key=lambda m: m.start())


def _clause_number(text: str, start: int, end: int, words: bool = True) -> re.Match | Spelled | None:
    """A statement's number: after its last result link that has a number after it, else its first number;
    a trailing remark (", which is ...", "if ...", a parenthesis that closes it) left out, numbers right after a
    preposition passed over while there are others."""
    first = NUMBER.search(text, start, end)  # a remark follows a stated number
    remark = REMARK.search(text, first.end(), end) if first else None
    cut = remark.start() if remark else purpose_start(text, start, first, end) or closing_parenthesis(text, start, end)
    end = cut or end
    numbers = numbers_in(text, start, end, words=words)
    results = [m for m in numbers if not AFTER_PREPOSITION.search(text[start : m.start()])]
    numbers = results or numbers
    total = [m for m in numbers if TOTAL_AFTER.match(text, m.end())]  # "so 6 more days: 16 days in total": 16
    linked = _linked_number(text, start, end, numbers)
    return total[-1] if total else linked if linked is not None else numbers[0] if numbers else None


def _linked_number(text: str, start: int, end: int, numbers: list) -> re.Match | Spelled | None:
    """The first of `numbers` after the last result link in text[start:end] that has one after it."""
    for link in reversed(list(LINK.finditer(text, start, end))):
        after = [m for m in numbers if m.start() >= link.end()]
        if after:
            return after[0]
    return None


def _phrase_answer(text: str) -> str | None:
    """Rule 2 of the module docstring: the number or expression the last answer phrase states, or None."""
    phrases = list(ANSWER_PHRASE.finditer(text))
    if phrases and (expression := _stated_expression(text, phrases[-1].end())) is not None:
        return expression
    if phrases:
        answer = _clause_number(text, phrases[-1].end(), sentence_end(text, phrases[-1].end()))
        if answer is not None:
            for fix in CORRECTION.finditer(text, answer.end()):
                corrected = _clause_number(text, fix.end(), sentence_end(text, fix.end()))
                if corrected is not None and corrected.start() > answer.start():
                    answer = corrected
            return as_answer(text, answer)
    return None


def _stated_answer(text: str) -> str | None:
    """Rules 2 and 3 of the module docstring: the number an answer phrase or a conclusion states, or None."""
    if (stated := _phrase_answer(text)) is not None:
        return stated
    digits = list(NUMBER.finditer(text))
    if not digits:
        return None
    body = text.rstrip()
    links = list(LINK.finditer(body, sentence_start(body, len(body.rstrip(".!?*")))))  # the final sentence's links
    if links and (expression := _stated_expression(body, links[-1].end())) is not None and (
            links[-1].group() == "=" or _ALGEBRA.search(expression)):  # "The line is y = 3x - 4.", "... leaves 2x + 2."
        return expression  # a sentence that ends in an expression it states
    start = sentence_start(text, digits[-1].start())
    end = sentence_end(text, digits[-1].end())
    clause = text.rfind(";", start, end) + 1 or start  # the sentence's last clause
    cues = list(_CONCLUSION.finditer(text, start, end))
    cues = [cue for cue in cues if cue.start() >= clause] if NUMBER.search(text, clause, end) else cues
    found = _clause_number(text, cues[-1].end(), end) if cues else None
    return as_answer(text, found) if found is not None else None


def _stated_expression(text: str, start: int) -> str | None:
    """A stated answer that is an expression or a choice, not a number ("C", "(B)", "2x + 3", "\\frac{\\pi}{2}"):
    the rest of the sentence when it is math with a letter, no word of two letters or more, brackets balanced."""
    t = text[start : sentence_end(text, start)].strip().strip("*").rstrip(".").strip()
    if not (0 < len(t) <= 60 and _EXPRESSION.fullmatch(t) and re.search(r"[A-Za-z]", t)) or PLAIN_WORD.search(t) \
            or re.match(r"\(?[A-Za-z]\)\s*\S", t):  # "(B) 12": a choice's label, then its value (a number)
        return None
    depth = 0
    for ch in t:
        depth += (ch in "({[") - (ch in ")}]")
        if depth < 0:
            return None
    return _final_expression(t) if depth == 0 else None


def _last_number_or_math(text: str) -> str | None:
    """Rule 4 of the module docstring: the last number, unless it sits in a tail of its sentence that only comments,
    conditions or scopes what the sentence stated (`_tail_start`); inside a math span, the span's final expression.
    Number words left in words count after a result link ("7 - 5 is two") and, without any digit, everywhere."""
    note = NOTE.search(text)
    words = spelled(text, 0, note.start() if note else None)  # what clean_answer left in words: "one", "two", "zero"
    if note and (NUMBER.search(text, 0, note.start()) or words):
        text = text[: note.start()]  # the closing note goes: what comes before it states the answer
    else:
        words = spelled(text) if note else words
    digits = list(NUMBER.finditer(text))
    stated = [w for w in words if LINK_BEFORE.search(text, max(0, w.start() - 24), w.start())]  # "7 - 5 is two"
    found = sorted(digits + stated, key=lambda m: m.start()) or words
    if not found:
        return None
    last = found[-1]
    start = sentence_start(text, last.start())
    remark = _tail_start(text, start, last)
    before = [m for m in found if remark is not None and start <= m.start() < remark]
    def context(m) -> bool:  # after a preposition ("12 of the 30"), unless named ("gives an average of 84")
        return bool(AFTER_PREPOSITION.search(text, start, m.start())) and not NAMED.search(text, start, m.start())
    before = [m for m in before if not context(m)] or before
    if len(before) > 1 and sums_to([_number_text(m.group()) for m in before], _number_text(last.group())):
        return as_answer(text, last)  # "50 pages, and 10 pages, for 60 pages": the total of what the sentence stated
    if not before and context(last):  # "3 x $6 = $18 for 3 shirts": 18
        results = [m for m in found if start <= m.start() and not context(m)]
        source = results and (SOURCE.search(text, start, last.start())  # "$10 back from her $20 bill": 10
                              or RATE_UNIT.match(text, last.end()) or STATED_RATE.match(text, results[-1].end()))
        before = [_linked_number(text, start, last.end(), results) or (results[-1] if source else last)]
    return as_answer(text, before[-1] if before else last)


def _tail_start(text: str, start: int, last: re.Match | Spelled) -> int | None:
    """Where the tail that holds `last` begins in its sentence (text[start:]), if `last` is in one: after ", which
    is", "if", ... (`REMARK`), unless the tail computes what the sentence did not state ("we add 6 and 8, which
    is 6 + 8 = 14", "we add 6 and 8, which is 14", "the total is 29 + 24, which is 53"), after a colon that follows
    a stated number and breaks it down, numbers first ("21 marbles: 5 red, 7 blue and 9 green"; not "to 11:15: 145
    min total", "20 marbles, 6 blue: probability 6/20, or 0.3"), or
    in a parenthesis that ends the sentence ("$18 a day (9 eggs x $2)")."""
    first = NUMBER.search(text, start, last.start())  # a tail follows a stated number
    remark = REMARK.search(text, first.end(), sentence_end(text, last.end())) if first else None
    remark = remark if remark and remark.start() < last.start() else None
    if remark is None and (purpose := purpose_start(text, start, first, last.start())) is not None:
        return purpose  # "Lily needs 6 packs of 8 to get 48 buns."
    computes = (COMPUTES.search(text, remark.start(), last.end()) or OPERATION.search(text, start, remark.start())) \
        and not LINK.search(text, start, remark.start()) if remark else False
    if remark and not (RESTATES.match(text, remark.start()) and (computes or OPERAND_END.search(
            text, start, remark.start()) or _converts(text, start, remark, last))) \
            and not (CONDITION.match(text, remark.start()) and CONSEQUENCE.search(text, remark.end(), last.start())):
        return remark.start()
    took = [m for m in TIME_SCOPE.finditer(text, start, sentence_end(text, last.end())) if m.start() < last.start()]
    stated = _JUST_STATED.search(text, start, took[-1].start()) if took else None
    if stated and text[start : stated.start()].strip():  # not "the 300 km in 2.5 hours" (a given), nor a subject
        return took[-1].start()  # right after the stated number and its unit: "She saves $45 in 3 weeks."
    opened = closing_parenthesis(text, start, sentence_end(text, last.end()))
    opened = opened if opened is not None and opened < last.start() else None
    stop = opened or last.end()  # a breakdown's parts come before a closing parenthesis: "2 parts: 140 g (490 g)"
    colon = text.find(": ", start, last.start())  # "There are 21 marbles: 5 red, 7 blue and 9 green."
    if colon >= 0 and LINK.search(text, start, colon) and NUMBER.search(text, start, colon) and \
            _BREAKDOWN.match(text, colon + 1) and len(NUMBER.findall(text, colon, stop)) > 1 and \
            not COMPUTES.search(text, colon, stop) and not LINK.search(text, colon, min(stop, last.start())):
        return colon
    return opened


def _converts(text: str, start: int, remark: re.Match, last: re.Match | Spelled) -> bool:
    """Whether a restating tail gives the count a stated share stands for ("40% of them walk, which is 12", "3/4 of a
    pizza, which is 6 slices") or the rate of a quantity in a time ("18 km in 45 minutes, which is 24 km/h")."""
    if RATE_UNIT.match(text, last.end()) and TIME_SCOPE.search(text, start, remark.start()):
        return True
    stated = list(NUMBER.finditer(text, start, remark.start()))
    share = bool(stated) and (bool(_PERCENT.match(text, stated[-1].end())) or ("/" in stated[-1].group()
                              or "frac" in stated[-1].group()) and text.startswith(" of ", stated[-1].end()))
    return share and not _PERCENT.match(text, last.end()) and "/" not in last.group()


def without_closing_comment(text: str, paragraphs: bool = False, notes: str = "") -> str:
    """`text` less the closing sentences that only check or compare what came before (`CLOSING_COMMENT`: "Check: 2(9)
    - 7 = 11.", "That's 9 more than last year."), while a number stays before them; with `paragraphs` (what a number
    answers), also a closing paragraph that holds no number, equation, math or answer phrase ("P.S. This kind of
    problem is common in exams."); with `notes`, first the closing paragraph of notes (`NOTE`: "Note: ...", "P.S.
    ..."), "always" or "after a number" only (before any number, a note may hold what a number's reading needs)."""
    if notes and (note := NOTE.search(text)) and (notes == "always" or NUMBER.search(text, 0, note.start())):
        text = text[: note.start()]
    while True:
        body = text.rstrip()
        if paragraphs and (last := _CLOSING_PARAGRAPH.search(body)) and not ANSWER_PHRASE.search(body, last.start()) \
                and not spelled(body, last.start()) and NUMBER.search(body, 0, last.start()):
            text = body[: last.start()]
            continue
        start = sentence_start(body, len(body.rstrip(".!?✓✔* \t")))
        if not (start and CLOSING_COMMENT.match(body[start:].lstrip())
                and (NUMBER.search(body, 0, start) or spelled(body, 0, start))):
            return text
        text = body[:start]


def _auto(text: str, tag: str) -> str | None:
    """The module docstring's rule: boxed, then tag, then gsm8k, then the stated answer, then the last number."""
    if (found := marked_answer(text, tag)) is not None:
        return found
    stated = without_aside(without_closing_comment(text, paragraphs=True))  # rules 2-4: no closing checks or asides
    if CUT_OFF.search(stated):
        return _phrase_answer(stated)  # cut off mid-statement: only an answer phrase states an answer
    opening = opening_number(stated)  # rule 4a: "18 apples. John started with 30 and gave away 12."
    return _stated_answer(stated) or (as_answer(stated, opening) if opening else _last_number_or_math(stated))


# answer extraction modes, in the order the docs and errors list them: (cleaned text, tag) -> the answer or None
EXTRACTORS: dict[str, Callable[[str, str], str | None]] = {
    "auto": _auto,
    "boxed": lambda text, tag: last_boxed(text),
    "tag": lambda text, tag: last_tag(text, tag),
    "gsm8k": lambda text, tag: after_hashes(text),
    "last_number": lambda text, tag: next((_number_text(n) for n in reversed(NUMBER.findall(text))), None),
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

