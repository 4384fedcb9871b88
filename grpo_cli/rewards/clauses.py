r"""The parts of a sentence the answer rule reads (answers.py, rules 3 and 4): result links, prepositions and what a
number after one says, the tails that follow a stated number without being its result, the time it took, and closing
sentences that only check or compare. The rule itself, with examples, is answers.py's docstring.
"""

from __future__ import annotations

import re

LINK = re.compile(
    r"=|\\approx|≈|\b(?:is|are|was|were|equals?|gives?|makes?|yields?|comes\s+to|totals?|leaves?|has|have|had"
    r"|holds?|contains?|costs?|costing|gets?|earns?|pays?|paid|paying|spends?|spent|results?\s+in|resulting\s+in)\b",
    flags=re.IGNORECASE,
)
_ADJECTIVE = r"(?:(?:original|first|last|next|other|remaining|initial|whole|entire|same|previous|following)\s+)?"
# a number right after a preposition is context ("in 6 jars", "after 2 hours", "more than 40"), not a result (but
# "results in 7" links one)
AFTER_PREPOSITION = re.compile(
    r"\b(?:(?<!results\s)(?<!result\s)(?<!resulting\s)in|on|at|after|before|for|over|per|(?<!total\s)of|by|within"
    r"|during|from|into|between|among|than"
    r"|(?<!left\s)(?<!up\s)(?<!started\s)(?<!starts\s)(?<!began\s)with)\s+"  # "left with 5", "started with 20" state
    rf"(?:(?:the|a|an|every|each|all|his|her|their|its|my|your|our)\s+)?{_ADJECTIVE}\$?$"
    r"|\bto\s+(?:each\s+of\s+)?(?:the|his|her|their|its|my|your|our)\s+\$?$", flags=re.IGNORECASE,
)
# ... and of these, a number that only says where the stated one came from, went to or is out of ("$10 back from her
# $20 bill", "12 marbles to his 3 friends"): a last number after one gives way to the sentence's last result, linked
# or not
SOURCE = re.compile(r"(?:\b(?:from|out\s+of|among|than|per|to(?=\s+(?:each|the|his|her|their|its|my|your|our)\b))"
                     r"|(?<=\d)(?:\s+[a-z]+)?\s+of)"  # "3 of the 12 eggs", "40 lengths of the 25 m pool"
                     rf"\s+(?:each\s+of\s+)?(?:(?:the|a|an|his|her|their|its|my|your|our)\s+)?{_ADJECTIVE}\$?$",
                     flags=re.IGNORECASE)
# ... as does one that is a rate, the unit after it saying so ("2.5 hours at 60 mph", "an average of $50 per student")
RATE_UNIT = re.compile(r"\s*(?:%|mph\b|km/h|kph\b|(?:[a-z]+\s+)?(?:per|an?|each|every)\s|/)", flags=re.IGNORECASE)
# ... and a stated number whose unit is a rate gives the answer over a stretch it holds for ("60 km/h over the 150 km
# trip"): a unit per a unit of time, distance, weight or volume ("12 has a median" is no rate)
STATED_RATE = re.compile(r"\s*(?:mph\b|km/h|kph\b|(?:[a-z]+\s+)?(?:per|an?|each|every)\s+(?:second|minute|hour|day|week"
                         r"|month|year|km|kilomet(?:re|er)|mile|met(?:re|er)|kg|kilogram|pound|lit(?:re|er)|gallon)s?\b)",
                         flags=re.IGNORECASE)
# a purpose, where the sentence says what is needed: "Lily needs 6 packs of 8 to get 48 buns" (but "Multiply 3 by 4 to
# get 12": a result)
NEED = re.compile(r"\b(?:needs?|needed|must|requires?|required|has\s+to|have\s+to|should|wants?|takes?|took)\b",
                  flags=re.IGNORECASE)
PURPOSE = re.compile(r"\s(?:in\s+order\s+)?to\s+(?:get|make|have|buy|obtain|reach)\b", flags=re.IGNORECASE)
# a number the clause calls a total ("16 days in total", "8 packs in all", "5 buses altogether")
TOTAL_AFTER = re.compile(r"(?:\s+[a-z]+){0,2}\s+(?:in\s+total|in\s+all|altogether|all\s+told)\b", flags=re.IGNORECASE)
# a number a result link, an appositive or "at" names, after "of" without being context: "dividing by 4 gives an
# average of 84": 84; "it had 1,020, an increase of 170": 170; "it travels at an average of 80 km/h": 80; "7 cm,
# for a perimeter of 35 cm": 35
NAMED = re.compile(r"(?:,|'s|\b(?:is|are|was|were|gives?|giving|makes?|making|yields?|has|have|had|comes\s+to|costs?"
                   r"|earns?|reach(?:es|ed)?|at|for))\s*(?:a|an)\s+(?:[a-z]+\s+){1,2}of\s+\$?$", flags=re.IGNORECASE)
# a scope or purpose ends where a new statement begins: "3 choices for the first digit and 4 for the second, giving 12"
_NO_STATEMENT = r"(?![^.!?\n]*(?:=|[:;]|\b(?:giv(?:es|ing)|makes?|is|are|was|were|equals?|totals?|costs?)\b))"
# a value the sentence assumes: ", using π = 3.14", "with g = 9.8" (after clean_answer: "with $\\pi= 3.14$"); not
# one substituted on the way to the result: "(n - 2)·180 with n = 6 gives 720"
_ASSUMED = (r",?\s(?:with|using|taking|assuming|for)\s+\$?(?:\\pi|pi|[A-Za-z])\s*(?:=|\\approx)"
            r"(?![^.!?\n]*\b(?:giv(?:es|ing)|yields?|makes?|equals?|results?\s+in)\b)")
ASSUMED = re.compile(_ASSUMED, flags=re.IGNORECASE)
# what follows a statement's number without being its result: a comment (", which is", "(", ", i.e.", " - "), a
# condition, cause or scope (", since", "because", "if", "when", "assuming", "after ...ing", "for the/each ..."), a
# purpose, a comparison or a range
_TAIL = (r",\s*(?:which|that)\s+(?:is|was|are|were)\b|,\s*i\.e\.|\s[—–]\s|,?\s(?:since|because|if|when|whenever"
         r"|assuming|given|provided|unless)\b|,?\s(?:after|before|once|while)\s+\w+ing\b"
         rf"|\sfor\s+(?:the|all|each|every|its|his|her|their|my|your|our)\s{_NO_STATEMENT}"
         # ... or for or on a count of things, not money: "15 cups of flour for 6 cakes", "250 km on 20 litres" (but
         # "4 packs for 12 dollars")
         rf"|\s(?:for|on)\s+\d[\d,.]*\s+(?!(?:dollar|cent|euro|pound|buck|yen|rupee)s?\b)[a-z]{_NO_STATEMENT}"
         r"|(?<![;:])\s(?:in\s+order\s+)?to\s+(?!(?:be|get|give|obtain|find|yield|make|equal|both|each|every|all|the|a"
         r"|an|his|her|their|its|my|your|our|him|them|me|us|it|about|around|nearly|approximately)\b)[a-z]{3,}\b"
         rf"{_NO_STATEMENT}"  # a purpose: "7 more stamps to complete his collection of 50"
         r"|,\s*or\s+(?:about|roughly|approximately|around|nearly|almost)\b"
         r"|,\s*(?:(?:up|down|rising|falling|going)\s+)?from\s+\$?-?\$?\d"  # ", from 850 to 1,020", ", from -8 to 5"
         r"|,\s*(?:(?:which|that)(?:'s|\s+is|\s+was)\s+)?(?:about\s+|only\s+|just\s+)?\$?\d[\d,.]*\s*%?\s*"
         r"(?:[a-z]+\s+)?(?:more|less|fewer|[a-z]+er)\s+than\b"  # a comparison: ", 15 degrees colder than at noon"
         r"|,\s*(?:or\s+)?\$?\d[\d,.]*\s*[¢%]?\s*(?:[a-z]+\s+)?(?:(?:in|per|for|to)\s+(?:each|every)|each|apiece)\b"
         # ", 24 in each box", ", or 25¢ each"
         r"|,\s*with\s+(?:[a-z]+\s+){0,3}\$?\d"  # ", with $20 left over", ", with sides of 6 cm and 12 cm"
         # a time from an event: "8:35, 55 minutes after it left", "on day 12, 3 days before the deadline"
         r"|,\s*\d[\d,.]*\s*(?:second|minute|hour|day|week|month|year)s?\s+(?:after|before|later|earlier|since)\b"
         r"|,\s*worth\s"  # "28 quarters, worth $7"
         rf"|{_ASSUMED}"  # ", using π = 3.14"
         # ", 75% of the 28"
         r"|,\s*(?:about\s+|only\s+|just\s+)?\d[\d.,/]*\s*%?\s+of\s+(?:the|all|his|her|their|its)\b")
# a time the stated number took, that ends its sentence: "48 cupcakes in 6 hours", "24 km in a 5-day week"
TIME_SCOPE = re.compile(
    r"\s(?:in|within|over|during|across|after)\s+(?:(?:a|an|the|just|only|about|another|next|first|last|its|his|her"
    r"|their)"
    r"\s+)*\d[\d,.]*[-\s]*(?:[a-z]+[-\s]+)?(?:second|minute|hour|day|week|month|year|decade)s?\b(?=[^\d]*$)",
    flags=re.IGNORECASE,
)
# in a tail after "if" or "when", a consequence: "if they share them equally each gets 20 / 4 = 5" states 5
CONSEQUENCE = re.compile(r"(?<!\bif\s)(?<!\bwhen\s)\b(?:then|each|you|we|they|he|she|it|everyone)\s+(?:gets?|receives?"
                         r"|will\s+(?:get|have|receive|be|pay|need)|has|have|ends?\s+up\s+with|pays?)\b",
                         flags=re.IGNORECASE)
# a conclusion word ("so", "thus", "in total", "∴"; not "so far", "so that"): what follows it states a result
CONCLUDES = re.compile(r"\b(?:so|thus|therefore|hence|in\s+total|altogether|overall|in\s+all)\b"
                       r"(?!\s+(?:far|that|on|much|many)\b)|∴", flags=re.IGNORECASE)
CONDITION = re.compile(r",?\s(?:if|when|whenever)\b", flags=re.IGNORECASE)
# a closing sentence that only checks, compares, tries another way or offers more: "Check: 2(9) - 7 = 11.", "That's
# 9 more than last year.", "Alternatively, 80 × 3 = 240.", "Let me know if you'd like it in seconds (1200 s)."
CLOSING_COMMENT = re.compile(
    r"\**(?:(?:let(?:'s|\s+me|\s+us)\s+|to\s+)?(?:check|checking|verify|verifying|verification|double[- ]check"
    r"|sanity\s+check)\b|(?:alternatively|another\s+way)\b"
    r"|(?:that|this|it|which)(?:'s|\s+is|\s+was|\s+means)\s[^.!?\n]*?(?:\b(?:more|less|fewer"
    r"|higher|lower|greater|smaller|bigger|larger|longer|shorter|older|younger|cheaper|faster|slower|further|farther)"
    r"\s+than|\b(?:twice|times|half)\s+as)\b)|.*[✓✔]\s*$"
    r"|(?:if|had)\b[^.!?\n]*\bwould(?:\s+have|'ve)\b"  # a counterfactual: "If ..., it would have cost $60."
    r"|(?:let\s+me\s+know|feel\s+free|would\s+you\s+like|(?:do\s+you\s+)?want\s+me\s+to|if\s+you(?:'d|\s+would)"
    r"\s+like)\b",  # an offer: "Let me know if you'd like the time in seconds (1200 s)."
    flags=re.IGNORECASE | re.DOTALL,
)
REMARK = re.compile(_TAIL, flags=re.IGNORECASE)
COMPUTES = re.compile(r"=|\bequals?\b|\bresults?\s+in\b", flags=re.IGNORECASE)
# an operation a clause states without its result ("29 + 24", "add them together", "multiply 13 by 9"), or ends
# with (OPERAND_END): a restating tail after it gives the result
_OPERATOR = r"\d\s*(?:[-+*/×÷]|\\(?:times|cdot|div)\b|(?<=\s)x(?=\s))\s*\$?\d"
OPERATION = re.compile(rf"{_OPERATOR}|\b(?:add|adding|subtract|subtracting|multiply|multiplying|divide|dividing"
                       r"|(?:sum|product|difference|quotient)\s+of)\b", flags=re.IGNORECASE)
OPERAND_END = re.compile(rf"{_OPERATOR}[\d,.]*\$?(?:\s*[^\W\d_]+)?\s*$")  # "is 29 + 24", "3 x 4 inches" before a tail
RESTATES = re.compile(r",\s*(?:which|that)\s|,\s*i\.e\.", flags=re.IGNORECASE)  # a tail that may compute
LINK_BEFORE = re.compile(r"(?:=|\b(?:is|are|was|were|equals?|makes?|gives?|comes\s+to|totals?))\s*$",
                         flags=re.IGNORECASE)
# a closing paragraph that checks or comments on what came before
NOTE = re.compile(r"\n\s*\n\s*\(?\**(?:(?:note|check|verification|verify|double[- ]check|sanity check|remark"
                  r"|explanation|reasoning|justification)\b|p\.\s?s\.)(?!.*\n\s*\n)", flags=re.IGNORECASE | re.DOTALL)
# a text that ends mid-statement, on a link, an article or an operator: cut off before its answer ("... Ava is")
CUT_OFF = re.compile(r"(?:(?<!\d\sit\s)\b(?:is|are|was|were|be|equals|gives?|makes?|of|the|(?-i:a)|an|and|to)"
                     r"|[=+*/×÷(-])\s*$", flags=re.IGNORECASE)  # not a label ("station A"), "are equal", "so 29 it is"
_ASIDE = re.compile(r"\s*\([^()]*\)\s*$")  # a closing parenthesis of its own
NEGATED = re.compile(r"(?:\bnot|\bnever|n't)\s+(?:\w+\s+)?$", flags=re.IGNORECASE)
# a sentence ends at ".", "!" or "?" before a space, or at a line's end; not at an abbreviation ("i.e.", "e.g.")
SENTENCE_END = re.compile(r"(?<!\bi\.e)(?<!\be\.g)(?<!\bapprox)(?<!\bvs)(?<!\bcf)[.!?](?=\s|$)|\n",
                          flags=re.IGNORECASE)

def purpose_start(text: str, start: int, first: re.Match | None, end: int) -> int | None:
    """Where a purpose begins after `first`, in a sentence that says what is needed ("needs 6 packs to get 48")."""
    found = PURPOSE.search(text, first.end(), end) if first and NEED.search(text, start, first.start()) else None
    return found.start() if found else None

def sentence_end(text: str, pos: int) -> int:
    m = SENTENCE_END.search(text, pos)
    return m.start() if m else len(text)

def sentence_start(text: str, pos: int) -> int:
    starts = [m.end() for m in SENTENCE_END.finditer(text, 0, pos)]
    return starts[-1] if starts else 0

def without_aside(text: str) -> str:
    """`text` less a closing sentence wholly in parentheses after a statement with a number: an aside ("The full
    capacity is 75 litres. (The tank still needs 30 L to be full.)")."""
    body = text.rstrip()
    aside = _ASIDE.search(body)
    before = body[: aside.start()].rstrip() if aside else ""
    return before if before.endswith((".", "!", "?")) and re.search(r"\d", before) else text

def closing_parenthesis(text: str, start: int, end: int) -> int | None:
    """Where a parenthesis that closes text[start:end] opens ("42 (since 6 x 7 = 42)."), if one does."""
    closed = text.rfind(")", start, end)
    opened = text.rfind("(", start, closed) if closed > start else -1
    if opened > start and not re.search(r"\w", text[closed + 1 : end]) and text[opened - 1].isspace():
        return opened
    return None
