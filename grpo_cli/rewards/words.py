"""Word answers: `accuracy` with a reference of words ("Thursday", "yes", "blue", "New York") where the completion
marks no answer (a marked one, `\\boxed{}`, a tag or `####`, is compared whole, as every answer is).

The rule reads words as answers.py reads numbers:
  1. after the last answer phrase ("The answer is Thursday.", "Final answer: yes"), the clause it opens names the
     reference;
  2. else, where the reference is a verdict (yes / no, true / false), the last verdict word that stands as an answer
     ("No.", "Yes, because ...", "So, no.", "∴ Yes", "No" ending its line; not "I have no idea.") is the reference;
     where it is one of a closed class (the days of the week, the months, the compass points), the last member of that
     class the completion names ("Monday + 3 days = Thursday.": Thursday; "So it is Wednesday, not Thursday.":
     Wednesday);
  3. else the final sentence, after the closing notes and checks answers.py leaves out, names the reference and does
     not hedge ("It will be a Thursday.", "**Paris**"; not "It is red or blue.").
A completion cut off mid-statement (answers.py's CUT_OFF) answers by rule 1 only. A name is matched whole and
case-insensitively, and not where it is negated ("not Thursday"). A reference of one letter is a choice's label, which
answers.py reads, and which a final line that opens with it answers too ("B) 12": `states_choice`; the final line
before a closing paragraph of notes, "Explanation: ...", or one without a number); a reference
with a digit or a math sign is a number or an expression, which answers_match compares.
"""

from __future__ import annotations

import re

from grpo_cli.rewards.answers import ANSWER_PHRASE, without_closing_comment
from grpo_cli.rewards.clauses import CUT_OFF, NEGATED, sentence_end, sentence_start
from grpo_cli.rewards.marks import marked_answer
from grpo_cli.rewards.notation import clean_answer

CLASSES = (
    ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"),
    ("january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
     "december"),  # not "may", a verb as often: a reference "May" takes rule 3
    ("north", "south", "east", "west", "northeast", "northwest", "southeast", "southwest", "north-east", "north-west",
     "south-east", "south-west"),
)
VERDICTS = (("yes", "no"), ("true", "false"))
_CHOICE = re.compile(r"\s*(?:\*\*)?\(?([A-Za-z])\)(?:\*\*)?\s+\S")  # a line that opens with a choice's label: "B) 12"
_LABEL_ONLY = re.compile(r"\s*(?:\*\*)?\(?([A-Za-z])\)?(?:\*\*)?\.?\s*")  # a final line of the label alone: "B", "(B)"
_OPTION = re.compile(r"\b(?:option|choice)\s+\(?([A-Za-z])\)?(?!\w)", flags=re.IGNORECASE)  # "which is option B"
_WORDS = re.compile(r"[A-Za-z][A-Za-z'-]+(?:\s+[A-Za-z][A-Za-z'-]*){0,3}")  # one to four words of letters
_ARTICLE = re.compile(r"^(?:the|a|an)\s+(?=\S)", flags=re.IGNORECASE)
_HEDGE = re.compile(r"\b(?:or|maybe|might|could|perhaps|possibly|either|unsure|not\s+sure|guess)\b|\?",
                    flags=re.IGNORECASE)


def word_reference(reference: str) -> str | None:
    """The reference as lower-case words, without a leading article, when it is one to four words of letters (the
    first of two letters or more) and nothing else; None otherwise."""
    text = _ARTICLE.sub("", reference.strip().rstrip(".").strip().strip("*").strip())
    return " ".join(text.lower().split()) if _WORDS.fullmatch(text) else None


def states_words(completion: str, words: str, tag: str = "answer") -> bool:
    """Whether `completion` answers with `words` (`word_reference`'s form) by the module docstring's rule."""
    text = clean_answer(completion)
    if marked_answer(text, tag) is not None:
        return False
    phrases = list(ANSWER_PHRASE.finditer(text))
    if phrases:
        start = phrases[-1].end()
        return bool(_named(text, [words], start, sentence_end(text, start)))
    if CUT_OFF.search(without_closing_comment(text)):
        return False  # cut off mid-statement: only an answer phrase answers
    if (verdict := next((pair for pair in VERDICTS if words in pair), None)) is not None:
        found = list(_verdicts(verdict).finditer(text))
        return bool(found) and found[-1].group(1).lower() == words
    kind = next((members for members in CLASSES if words in members), None)
    if kind is not None:
        found = _named(text, kind, 0, len(text))
        return bool(found) and found[-1].group().lower() == words
    body = without_closing_comment(text, notes="always").rstrip()
    start = sentence_start(body, len(body.rstrip(".!?*")))
    return not _HEDGE.search(body, start) and bool(_named(body, [words], start, len(body)))


def states_choice(completion: str, label: str) -> bool:
    """Whether the last answer phrase of `completion`, or else its final line, opens with the choice's `label` and
    goes on to its value ("The answer is (B) 12.", "B) 12"; not a line of a list of the choices), or the final line is
    the label alone ("B", "(B)"), or the final sentence names it as an option ("42, which is option B."): a reference
    of one letter answered by its label."""
    # "Explanation: ..." is not the final line
    text = without_closing_comment(clean_answer(completion), paragraphs=True, notes="always").rstrip()
    if phrases := list(ANSWER_PHRASE.finditer(text)):  # "The answer is (B) 12."
        stated = _CHOICE.match(text, phrases[-1].end())
        return stated is not None and stated.group(1).lower() == label.strip().lower()
    lines, label = text.split("\n"), label.strip().lower()
    if (bare := _LABEL_ONLY.fullmatch(lines[-1])) is not None:  # "B", "(B)", "**B**" on the final line
        return bare.group(1).lower() == label
    if options := list(_OPTION.finditer(text, sentence_start(text, len(text.rstrip(".!?*"))))):
        return options[-1].group(1).lower() == label  # "42, which is option B."
    found = [_CHOICE.match(line) for line in lines[-2:]]
    return found[-1] is not None and found[-1].group(1).lower() == label and (len(found) == 1 or found[0] is None)


def _named(text: str, names: tuple[str, ...] | list[str], start: int, end: int) -> list[re.Match]:
    """The places in text[start:end] that name one of `names` whole, case-insensitively, not negated."""
    pattern = re.compile(r"(?<![\w-])(?:" + "|".join(r"\s+".join(map(re.escape, n.split())) for n in names)
                         + r")(?![\w-])", flags=re.IGNORECASE)
    return [m for m in pattern.finditer(text, start, end) if not NEGATED.search(text, max(0, m.start() - 24),
                                                                                 m.start())]


def _verdicts(pair: tuple[str, str]) -> re.Pattern:
    """A verdict word that stands as an answer: opening a sentence, a line or a clause, or after a conclusion word or
    a link, and ending its clause ("Yes, because ...", "So, no.", "It is true."; not "no idea", "not true")."""
    return re.compile(r"(?:^|[.!?:;(\n∴]|\b(?:so|thus|hence|therefore|is|are|was|were|'s)\b,?)\s*(" + "|".join(pair)
                      + r")\b(?=\s*[,.!?;:)]|\s*\$?\(|\s+[\u2014-]|\s*$|[ \t]*\n)",  # "No - 91", "Yes (57 = 3 × 19)"
                      flags=re.IGNORECASE)
