r"""Every result a completion's final statement states (`stated_results`), for `accuracy`'s rule 5.

A final sentence often states more than one quantity: "Ben pays $36 and Ana pays $48.", "Perimeter: 96 cm; area: 576
cm².", "The jacket now costs $60, a saving of $20.", "The total is $4.75, so she gets $5.25 change." Which of them the
question asked for, only the question says; a grader who reads it takes the completion as right when the asked
quantity is stated right. So, when the completion marks no answer (no `\boxed{}`, tag, `####` line or answer phrase),
the completion is also right when the reference equals one of the results its final statement states:
  - the final statement is the last sentence (or line) with a number, after the closing notes, checks and comparisons
    answers.py leaves out (none where the text is cut off mid-statement: answers.py's CUT_OFF); with the sentence
    before it when it is a remark that names another quantity ("The shirt costs $20 on sale. That's a saving of $5!",
    "Width: 7 cm. (Area would be 77 cm².)", "Girls: 140. Boys would then be 100."), and with the variable the
    sentence before it solves last when it computes nothing itself ("a = 10. Oliver is 20.": 10 and 20); a closing
    block of labelled lines that compute nothing states each line ("- Peter: 100 stamps / - Quinn: 50 stamps"), and
    a labelled sentence after another states both ("Ann: 2 × 9 = 18 stickers. Bo: 9 stickers."), unless one labels
    a total ("Subtotal: $360 / Tax: $54 / Total: $414": 414);
  - its results are its numbers less the operands ("15 × 10 = 150": 150 only; "1972/12937 = 3/11": 3/11; "50% of 800 =
    400": 400; "up by 18, which is 30% of 60": 18 and 30), the coefficients ("16x"), the negated ("not 40") and those
    right after a preposition or "the" ("from $10", "of 240", "the 5 books"; not a time the sentence states, "after 8
    weeks", nor where a link or an appositive names it: "a saving of $20") or listed with one that is ("the sum of 12
    and 15"), unless the sentence has nothing else ("It fills in 16 minutes at 15 L/min.": both);
  - numbers with only "and" or a comma between them, the last ending its clause, are a list of candidates, not
    results ("The solutions are x = 3 and x = -2", "32, 33 and 34"; not "$27 in June, and $117 over the year");
  - a condition, a cause or an earlier act after a stated number is a premise ("10 legs if you have 10 shrimps and 13
    crabs": 10; "35 after buying 15": 35), and so is a value it assumes ("314, using π = 3.14": 314);
  - a sentence that hedges, corrects or goes on to another value states none ("24, or maybe 26", "it could be 45", "I
    think", "I mean 4", "I thought 1/2 but it is 0.75", "23, then 24"; "5400 seconds or 1.5 hours" restates one
    quantity in two units), and neither does one with more than four
    distinct results, or one that names its answer ("The final answer to 7 + 9 = 16 is 20.": rules 1-4 read it).
`accuracy(..., strict=True)` reads the one answer `extract_answer` gives and nothing else; the default reads as the
grader does, which lets a policy that names two quantities be right on either (no more than that: a hedge scores 0).
"""

from __future__ import annotations

import functools
import re

from grpo_cli.rewards.answers import ANSWER_PHRASE, CORRECTION, NUMBER, as_answer, numbers_in, without_closing_comment
from grpo_cli.rewards.clauses import (
    AFTER_PREPOSITION, ASSUMED, COMPUTES, CUT_OFF, NAMED, sentence_end, sentence_start, without_aside,
)
from grpo_cli.rewards.marks import marked_answer
from grpo_cli.rewards.notation import clean_answer
from grpo_cli.rewards.numbers import read_number, same_quantity
from grpo_cli.rewards.opening import opening_number

MAX_RESULTS = 4
# a closing remark that names another quantity of the sentence before it states that sentence's results too: "The shirt
# costs $20 on sale. That's a saving of $5!", "This is a total of 45.", "Width: 7 cm. (Area would be 77 cm².)",
# "Girls = 140. Boys would then be 100.", "They cost $16. That's about $1.33 per pen."
_NAMING_REMARK = re.compile(r"\s*(?:(?:that|this|which)(?:'s|\s+is|\s+was|\s+means)\s+(?:a|an|the)\s+"
                            r"(?:[a-z]+\s+){1,2}of|\((?:(?:the|its|their)\s+)?[a-z]+(?:\s+[a-z]+)?"
                            r"(?:\s+(?:would\s+be|is|was|are|were)|\s*[:=])"
                            r"|(?:(?:the|its|their)\s+)?[a-z]+(?:\s+[a-z]+)?\s+would(?:\s+then)?\s+be"
                            r"|(?:that|this)(?:'s|\s+is|\s+means)(?:\s+(?:about|roughly|approximately|around|nearly))?"
                            r"(?=\s+\$?\s*\d[\d,.]*\s*(?:[a-z]+\s+)?(?:per|each|apiece|a|an)\b))"  # "$1.33 per pen"
                            r"\s+\$?\s*\d",
                            flags=re.IGNORECASE)
# a final statement that names its answer states that one only ("The final answer to 7 + 9 = 16 is 20.", "..., which
# is the final answer."): rules 1-4 read it
_NAMES_ANSWER = re.compile(r"\b(?:the|my|our|final|correct)\s+answer\b", flags=re.IGNORECASE)
# a sentence that offers candidates or doubts its own answer states no result
_HEDGE = re.compile(r"\b(?:or|maybe|might|could|perhaps|possibly|probably|either|unsure|not\s+sure|guess|think"
                    r"|thought|between|(?<!would )then|but|instead)\b|\?", flags=re.IGNORECASE)
_OR_UNITS = re.compile(r"(\d+(?:\.\d+)?\s*[A-Za-z]+)\s*,?\s+or\s+(\d+(?:\.\d+)?\s*[A-Za-z]+)\b")
# a condition, a cause or an earlier act after a stated number: what follows it is a premise, not a result
_PREMISE = re.compile(r"\b(?:if|since|because|as|assuming|given|provided|unless|when|whenever"
                      r"|(?:after|before|once|while)\s+\w+ing)\b", flags=re.IGNORECASE)
# an operand, or a coefficient: a number with one letter written onto it ("16x", "3a"; not a unit: "5km")
# a time the sentence states: "After 8 weeks Sam has $240", "she has $360 after 9 weeks" (the question may ask for it)
_TIME_BEFORE = re.compile(r"\b(?:after|in|within|for|over)\s+(?:another\s+|just\s+|only\s+)?$", flags=re.IGNORECASE)
_TIME_UNIT = re.compile(r"\s*(?:more\s+)?(?:second|minute|hour|day|week|month|year)s?\b", flags=re.IGNORECASE)
_OPERATOR_AFTER = re.compile(r"\s*(?:[-+*/×÷·^]|\\(?:times|cdot|div|frac)\b|x\s*\$?\d)|[^\W\d_](?![^\W\d_])"
                             r"|\$?\s*(?:=|equals\b|is\s+equal\s+to\b)")  # an equation's left side: "1972/12937 = 3/11"
# a share of a number is an operand too: "50% of 800 = 400", "3/4 of 12 is 9"
_PERCENT_OF = re.compile(r"\s?(?:\\?%|percent\b)\s*of\s+\$?\s*\d", flags=re.IGNORECASE)
_OF_NUMBER = re.compile(r"\s+of\s+\$?\s*\d", flags=re.IGNORECASE)
_RESTATED = re.compile(r"(?:,\s*(?:which|that)\s+(?:is|was)|,\s*i\.e\.,?)\s*$", flags=re.IGNORECASE)
# a variable solved at the end of the sentence before a plain final statement: "a = 10. Oliver is 20."
_SOLVED = re.compile(r"(?<![\w^])[A-Za-z]\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?(?:/\d+)?)\$?\s*[.;!]?\s*$")
_OPERATOR_BEFORE = re.compile(r"(?:[-+*/×÷·^]|\\(?:times|cdot|div|frac)|\bx)\s*\$?$")
# two numbers with nothing between them but "and" or a comma (and the same name again: "x = 3 and x = -2") are a list
# of candidates ("The solutions are 3 and -2", "32, 33 and 34"), none of them a result of its own
_LISTED = re.compile(r"\$?\s*(?:,|,?\s*and|&)\s*\$?\s*(?:(\w+)\s*(?:=|is|are)\s*)?\$?", flags=re.IGNORECASE)
# a line that labels one quantity and computes nothing ("- Peter: 100 stamps", "Quinn: 50"); a block of them closing a
# completion states each (`_labelled_block`) unless one labels a total
_LABELLED = re.compile(r"[ \t]*(?:[-*•][ \t]+)?([A-Za-z][A-Za-z' ]{0,30}?)[ \t]*:[ \t]*\$?(-?\d[\d,]*(?:\.\d+)?)"
                       r"(?:[^\d\n=+*/×÷<>]|\^\{?[23]\}?){0,25}")  # "Area: 144 cm^{2}"
_LABEL = re.compile(r"[ \t]*(?:[-*•][ \t]+)?([A-Za-z][A-Za-z' ]{0,30}?)[ \t]*:")  # "Sam:", "- Tom:"
_DEFINITE = re.compile(r"\b(?:the|these|those)\s+\$?$", flags=re.IGNORECASE)  # "the 5 books": a given, named
_TOTAL_LABEL = re.compile(r"\b(?:total|sum|answer|result|altogether|overall|final)\b", flags=re.IGNORECASE)
_NAME = re.compile(r"(\w+)\s*(?:=|is|are)\s*\$?$", flags=re.IGNORECASE)
# ... and the list's last item ends its clause, with no more than a unit after it ("... and 34.", "... and 12, so");
# "$27 in June, and $117 over the six months" is two results, each with its own scope
_ITEM_END = re.compile(r"\$?\s*(?:[^\W\d_]+|%|°)?\s*\$?(?:[,;.!?)\n]|$|(?:and|so|which|thus)\b)", flags=re.IGNORECASE)


def stated_results(text: str, tag: str = "answer") -> list[str]:
    """The results the final statement of `text` states (the module docstring's rule), cleaned as `extract_answer`'s
    answer is; [] where the completion marks its answer, hedges, or states more than `MAX_RESULTS` results."""
    text = closing_text(text, tag)
    if text is None or ANSWER_PHRASE.search(text) or opening_number(text) is not None:
        return []  # a marked answer, a stated one, or one stated first (answers.py's rule 4a) is the only answer
    if (aside := without_aside(text)) != text and not _NAMING_REMARK.match(text, len(aside)):
        text = aside  # "... is 75 litres. (The tank still needs 30 L to be full.)": an aside, unless it names a result
    if (last := last_statement(text)) is None or CUT_OFF.search(text):  # cut off mid-statement: no final statement
        return []
    start, end = last
    if _NAMES_ANSWER.search(text, start, end):  # "The final answer to 7 + 9 = 16 is 20": one answer, named
        return []
    before = sentence_start(text, len(text[:start].rstrip()) - 1) if start else 0  # the sentence or line before
    if start and _NAMING_REMARK.match(text, start) and NUMBER.search(text, before, start):
        start = before  # "... costs $20 on sale. That's a saving of $5!": one statement
    elif start and (line := _LABELLED.fullmatch(text, start, end)) and (prior := _LABEL.match(text, before, start)) \
            and not _TOTAL_LABEL.search(f"{prior.group(1)} {line.group(1)}"):
        start = before  # "Sam: 3 × 12 = 36 marbles. Tom: 12 marbles.": a labelled result after another
    if _hedged(text, start, end) or CORRECTION.search(text, start, end):
        return []
    plain = start and "=" not in text[start:end]  # a final statement that computes nothing
    solved = _SOLVED.search(text, sentence_start(text, start - 1), start) if plain else None
    first = NUMBER.search(text, start, end)
    end = premise.start() if first and (premise := _PREMISE.search(text, first.end(), end)) else end
    end = assumed.start() if first and (assumed := ASSUMED.search(text, first.end(), end)) else end  # "using π = 3.14"
    found = [m for m in numbers_in(text, start, end, words=False)
             if not (_OPERATOR_AFTER.match(text, m.end()) or _OPERATOR_BEFORE.search(text, start, m.start())
                     or _share(text, m))]
    context = _context(text, start, found)
    # a sentence of context only ("It fills in 16 minutes at 15 L/min."): each of them
    found = [m for i, m in enumerate(found) if i not in context] or found
    listed = {i for i, (a, b) in enumerate(zip(found, found[1:])) if _listed(text, start, a, b)}
    results: list[str] = [as_answer(text, NUMBER.search(text, solved.start(1)))] if solved else []
    results += [value for value in _labelled_block(text) if value not in results]
    for i, m in enumerate(found):
        if not ({i, i - 1} & listed) and (value := as_answer(text, m)) not in results:
            results.append(value)
    return results if len(results) <= MAX_RESULTS else []


@functools.lru_cache(maxsize=4096)  # `accuracy` asks it up to four times a completion (hedges, results, ...)
def closing_text(text: str, tag: str = "answer") -> str | None:
    """`text` cleaned (`clean_answer`) and ended where its final statement ends: before a closing paragraph of notes
    that follows a number ("Check: ...") and the closing comments and paragraphs answers.py leaves out
    (`without_closing_comment`); None where the completion marks its answer (the mark answers, not a sentence). Every
    reading of a final statement here starts from it."""
    text = clean_answer(text)
    if marked_answer(text, tag) is not None:
        return None
    return without_closing_comment(text, paragraphs=True, notes="after a number").rstrip()


def last_statement(text: str) -> tuple[int, int] | None:
    """Where the last sentence (or line) of `text` with a number begins and ends; None where it has no number."""
    last = None
    for last in NUMBER.finditer(text):
        pass
    return None if last is None else (sentence_start(text, last.start()), sentence_end(text, last.end()))


def _labelled_block(text: str) -> list[str]:
    """The values of the block of labelled lines that ends `text` ("- Peter: 100 stamps\n- Quinn: 50 stamps"), each
    line one quantity the question may have asked; none where a line of it labels a total (that line is the answer:
    "Subtotal: $360 / Tax: $54 / Total: $414") or the block is one line."""
    found, end = [], len(text)
    while end > 0 and (line := _LABELLED.fullmatch(text, text.rfind("\n", 0, end) + 1, end)) is not None:
        if _TOTAL_LABEL.search(line.group(1)):
            return []
        found.append(NUMBER.search(text, line.start(2)))
        end = line.start() - 1
    return [as_answer(text, m) for m in reversed(found)] if len(found) > 1 else []


def _context(text: str, start: int, found: list[re.Match]) -> set[int]:
    """The indices of `found` that are context only: right after a preposition or "the" ("from $10", "of 240", "the 5
    books cost $30"; not a time the sentence states, "after 8 weeks", nor where a link or an appositive names it: "a
    saving of $20"), or listed right after one that is ("the sum of 12 and 15")."""
    context: set[int] = set()
    for i, m in enumerate(found):
        bare = _LISTED.fullmatch(text, found[i - 1].end(), m.start()) if i - 1 in context else None
        timed = _TIME_BEFORE.search(text, start, m.start()) and _TIME_UNIT.match(text, m.end())
        given = AFTER_PREPOSITION.search(text, start, m.start()) or _DEFINITE.search(text, start, m.start())
        named = NAMED.search(text, start, m.start())
        if given and not named and not timed or bare is not None and bare.group(1) is None:
            context.add(i)
    return context


def _listed(text: str, start: int, a: re.Match, b: re.Match) -> bool:
    """Whether numbers `a` and `b` are two items of one list: "and" or a comma between them, no name before `b` but
    the one before `a` ("x = 3 and x = -2"; not "A is 1 and B is 2"), and `b` ending its clause."""
    between = _LISTED.fullmatch(text, a.end(), b.start())
    if between is None or not _ITEM_END.match(text, b.end()):
        return False
    if between.group(1) is None:
        return True
    name = _NAME.search(text, start, a.start())
    return name is not None and name.group(1).lower() == between.group(1).lower()


def _hedged(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] hedges (`_HEDGE`), an "or" between one quantity in two units aside ("400000 cm, which is
    4000 m or 4 km" restates; "24 or 26" hedges)."""
    restated = [m.span() for m in _OR_UNITS.finditer(text, start, end) if same_quantity(m.group(1), m.group(2))]
    return any(not any(a <= h.start() < b for a, b in restated) for h in _HEDGE.finditer(text, start, end))


def _share(text: str, m: re.Match) -> bool:
    """Whether `m` is a percent or a fraction of a number that follows it ("50% of 800", "3/4 of 12"), an operand;
    not where it restates a stated number and nothing computes after it ("up by 10, which is 25% of 40": 25)."""
    fraction = "/" in m.group() or "frac" in m.group()
    if (of := _PERCENT_OF.match(text, m.end()) or (_OF_NUMBER.match(text, m.end()) if fraction else None)) is None:
        return False
    return not (_RESTATED.search(text, max(0, m.start() - 16), m.start())
                and not COMPUTES.search(text, of.end(), sentence_end(text, of.end())))


# a decrease stated by its size: "decreased by 15%", "a loss of $15,000", "overdrawn by $25", "down 7 points"
_DECREASE = re.compile(r"\b(?:decrease[sd]?|declined?|dropped|fell|fallen|lost|loss|down|lower(?:ed)?|reduced"
                       r"|reduction|overdrawn|deficit|shrank|shrunk)(?:\s+(?:of|by))?\s+"
                       r"(?:about\s+|nearly\s+|almost\s+|a\s+)?"
                       r"\$?\s*(\d[\d,]*(?:\.\d+)?)(?!\s*(?:to|from)\b)", flags=re.IGNORECASE)


def states_decrease(text: str, reference: str, tag: str = "answer") -> bool:
    """Whether the final statement of `text` states the negative `reference` as a decrease of its size ("The stock
    decreased by 15%." for -15, "a loss of $15,000" for -15000): a change asked for as a signed number, answered in
    words. Not where the completion marks its answer or the statement hedges."""
    value = read_number(clean_answer(reference).strip().rstrip("%"))
    if value is None or value >= 0 or (text := closing_text(text, tag)) is None:
        return False
    if (last := last_statement(text)) is None or CUT_OFF.search(text):
        return False
    start, end = last
    return not _HEDGE.search(text, start, end) and any(
        read_number(m.group(1).replace(",", "")) == -value for m in _DECREASE.finditer(text, start, end))


# a final statement that offers a second answer or asks its own: "7 × 8 = 54, or maybe 56.", "so it's 63?"
_UNSURE = re.compile(r"\bor\s+(?:maybe|perhaps|possibly)\b[^.!?\n]*\d|\d[%$]?\s*\?", flags=re.IGNORECASE)


def hedges(text: str, tag: str = "answer") -> bool:
    """Whether the completion's final statement (its last sentence with a number, and the sentences after it) offers
    a second answer or asks its own ("7 × 8 = 54, or maybe 56.", "so it's 63? I'm not sure."): a grader takes neither
    candidate as the answer (a doubt alone does not hedge: "I'm not sure, but it might be 40."). A marked answer never
    hedges."""
    text = closing_text(text, tag)
    last = last_statement(text) if text is not None else None
    return last is not None and _UNSURE.search(text, last[0]) is not None


# a place stated by an ordinal: "3rd", "third" (not a unit of time: "a second", "per second")
_ORDINAL_WORDS = {w: i for i, w in enumerate(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split(), 1)}
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b|(?<!\ba\s)(?<!\bper\s)\b(" + "|".join(_ORDINAL_WORDS)
                      + r")\b(?!\s+of\b)", flags=re.IGNORECASE)


def stated_place(text: str, tag: str = "answer") -> str | None:
    """The place a completion states by an ordinal in its final sentence when nothing else answers ("Ana finished
    3rd.", "She came third.": "3"); None where it marks an answer or that sentence names no ordinal."""
    if (body := closing_text(text, tag)) is None:
        return None
    found = list(_ORDINAL.finditer(body, sentence_start(body, len(body.rstrip(".!?*")))))
    if not found:
        return None
    digits, word = found[-1].groups()
    return digits or str(_ORDINAL_WORDS[word.lower()])
