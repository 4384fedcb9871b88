r"""Numbers as people write them, rewritten the one way the answer rule reads them (`clean_answer`).

In this order (dashes first: U+2212 minus, U+2013 en dash, U+2012, U+2010/2011, U+FE63, U+FF0D -> "-", so "−3" is -3):
  framing   what frames a chat reply and states nothing goes: a markdown rule ("---", "***", "___", "==="), a
            blockquote's ">", a bullet's "-", "*", "•" or "+" at a line's start, the marks of a numbered list of two
            items or more ("1. ", "2) "), a code fence's line ("```python"), emoji (U+1F000-U+1FAFF, U+2600-U+26FF;
            not the check marks ✓ ✔), zero-width spaces, a heading's "#" (not "####"), and the sign-offs that close
            it without a digit ("Hope this helps!", "Thank you for the question!", "Let me know if you have any other
            questions.", "Good luck!"); and typography: curly apostrophes as "'", full-width punctuation ("。", "，",
            "：") as ASCII, "…" as "...", "!!!" as "!", a no-break or thin space that does not group digits, a tab and a
            run of spaces as one space
  emphasis  markdown's bold and italics around a span of one line go: "144 ÷ 12 = **12**" -> "144 ÷ 12 = 12", "__12__",
            "*12*" (not a product: "2 * 3 * 4", "2*3*4")
  congruences state their residue: "1234 \equiv 1 \pmod 9", "2^20 ≡ 4 (mod 7)" -> "... = 1", "... = 4"
  roots     in words or as a function first: "4 times the square root of 3" -> 4√3, "sqrt(2)" -> √(2)
  unicode   by what the Unicode database says each character is (`unicodedata`): every decimal digit as ASCII ("４２",
            "٤٢"), vulgar fractions ("½" -> "1/2", "1½" -> "1 1/2"), the fraction and division slashes, the fullwidth
            percent sign; superscripts as powers ("3²" -> 3^{2}) and math symbols as LaTeX (π, √, ∛, ×, ÷, ·, ∞, °,
            ±, ≈, ≤, ≥, ≠). In text without math spans, a run of math that holds one of these becomes a math span:
            "25π square units" -> "$25\pi$ square units", "√2" -> "$\sqrt{2}$", "3 × 6 = 18" -> "$3 \times 6 = 18$"
            (a one-letter unit after the result stays outside: "3.5 × 6 = 21 L" -> "$3.5 \times 6 = 21$ L")
  scales    after digits: "1.5 million" -> 1500000, "1.2k" -> 1200, "$2.5M" -> $2500000, "2 dozen" -> 24 ("a dozen")
  clock     a time of day in words: "seven o'clock" -> 7:00, "half past three" -> 3:30, "quarter to four" -> 3:45,
            "twenty past six" -> 6:20, "10 minutes to 9" -> 8:50 ("5 to 7", "ten to four" stay: a range, a score)
  words     spelled numbers as digits, by text2num (a maintained parser of number words): "one hundred and five" ->
            105, "twenty-one" -> 21, "two point five" -> 2.5. Ordinals stay words ("the fifth day"), and so do a
            lone "one" and "two" (and "zero"), which are mostly not numbers ("no one came"): the answer rule reads
            those where an answer is stated (`spelled`, threshold 0)
  fractions in words: "one third" -> 1/3, "three quarters" -> 3/4, "nine twentieths" -> 9/20, "twenty-two and a
            half" -> 22 1/2, "3 and 1/2" -> 3 1/2; a count as large as the parts' number is of things ("28
            quarters", "4 halves" stay)
  counts    a lone "two" or "zero" before a plural noun: "Two buses are needed" -> 2 buses ("one" stays a word, but
            where it starts a compound quantity: "one dollar and 65 cents" -> 1 dollar and 65 cents)
  ratios    "N to M" after a result link, ending its sentence: "gives 3 to 4." -> 3:4 ("from 3 to 4" stays); "N to M"
            and "N : M" in a sentence that speaks of a ratio: "the ratio is 2 : 5" -> 2:5
  odds      "N out of M" or "N in M" where the sentence speaks of a chance, probability, odds, fraction or proportion
            -> N/M ("the chance is 7 out of 20" -> 7/20, "one in 6" -> 1/6; "7 out of 20 balls are green"
            stays a count), and as a line of its own ("3 in 10" -> 3/10)
  commas    a decimal comma, one or two digits after it and no number next: "3,5 km" -> 3.5 ("1,234" keeps its comma)
            and thousands grouped by dots before one, or in two groups or more: "1.000,00" -> 1000.00, "1.250.000"
  signs     a sign word before digits: "minus 3", "negative 3" -> -3; "3 degrees below zero" -> -3 degrees, "75 m
            below sea level" -> -75 m; a minus
            before a dollar sign after no number: "= -$15" -> "= $-15" ("$100 - $15" stays a difference)
  dollars   `\$`, `\text{\$}`, `\textdollar` are dropped (`\boxed{\$23}` is 23), and so is the "/-" of a whole
            amount written the Indian way ("Rs 1,200/-" is 1,200)
  grouping  digits grouped in threes by `\,` `\!` `\ ` `{,}`, thin / no-break spaces or plain spaces are joined
            ("1 000 000", `1\,000\,000` -> 1000000, "the population is 13 500" -> 13500), except one plain space
            before a number that names what is counted ("2 100 dollar bills", "2 100-page books" stay two numbers);
            commas are left to the number reader
"""

from __future__ import annotations

import functools
import re
import unicodedata
from fractions import Fraction

from grpo_cli.rewards.spelled import spell_digits

_SLASHES = "\u2044\u2215\uff0f"  # fraction slash, division slash, fullwidth solidus
# math symbols as LaTeX; √ and its kin take the operand that follows (`_ROOT`)
_SYMBOLS = {"π": r"\pi", "×": r"\times", "÷": r"\div", "·": r"\cdot", "⋅": r"\cdot", "∞": r"\infty", "°": r"^\circ",
            "±": r"\pm", "≈": r"\approx", "≤": r"\le", "≥": r"\ge", "≠": r"\ne"}
_ROOTS = {"√": r"\sqrt", "∛": r"\sqrt[3]", "∜": r"\sqrt[4]"}
_SUPERSCRIPT = {"⁺": "+", "⁻": "-", "⁽": "(", "⁾": ")"}
_MATH_CHARS = "".join(_SYMBOLS) + "".join(_ROOTS)
# a run of math in running text: numbers, single-letter variables (not a unit's letter before a power: "5 m²"),
# operators and the symbols above, one space apart
_VARIABLE = r"(?<![A-Za-z°])(?<!° )[B-HJ-Zb-z](?![A-Za-z^])"  # one letter, not "a" or "I", not °C, not m²
_ATOM = rf"(?:\d+(?:[.,]\d+)*|{_VARIABLE}|[{_MATH_CHARS}]|\^\{{[^{{}}]*\}}|[-+*/=^()])"
_RUN = re.compile(rf"{_ATOM}(?: ?{_ATOM})*")
_ROOT = re.compile(rf"([{''.join(_ROOTS)}])\s*(\((?:[^()]*)\)|\d+(?:\.\d+)?|[A-Za-z]|\\pi)")

_RULE_LINE = re.compile(r"^[ \t]*(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,}|={3,}[ \t]*)$", flags=re.MULTILINE)
_QUOTE_MARK = re.compile(r"^[ \t]*(?:>[ \t]?)+|^[ \t]*[-*•+][ \t]+(?=\S)|^[ \t]*```.*$"  # ">", bullets, fences,
                         r"|^[ \t]*(?:#{1,3}|#{5,6})[ \t]+(?=[^\s\d$\\-])", flags=re.MULTILINE)  # a heading's "#"
_LIST_NUMBER = re.compile(r"^[ \t]*\d{1,2}[.)][ \t]+(?=\S)", flags=re.MULTILINE)  # "1. ", "2) ": a list's marks
_EMOJI = re.compile("[ \t]?[\U0001F000-\U0001FAFF\u2600-\u26FF\uFE0F\u200D]+|[\u200b\u200c\u2060\ufeff\u00ad]")
_SIGN_OFF = re.compile(  # a closing sentence without a digit that only signs off
    r"(?:^|(?<=[.!?✓✔])[ \t]+|\n)[ \t]*(?:i\s+)?(?:hope\s+(?:this|that|it|my)\b"
    r"|happy\s+(?:to\s+help|learning|solving)\b|(?:good|best\s+of)\s+luck\b|cheers\b"
    r"|have\s+a\s+(?:great|nice|good|wonderful|lovely)\b|thanks?\b|thank\s+you\b"
    r"|you'?re\s+welcome\b|let\s+me\s+know\b|feel\s+free\b|don'?t\s+hesitate\b|is\s+there\s+anything\s+else\b"
    r"|if\s+you\s+(?:have|need)\s+(?:any\s+)?(?:other\s+|more\s+|further\s+)?(?:questions?|help)\b)"
    r"[^\d\n.!?:]{0,80}[.!?]*[ \t\n]*$", flags=re.IGNORECASE)  # one short sentence, the last
_ASCII_PUNCTUATION = dict(zip("\u3002\uff0c\uff1a\uff1b\uff01\uff1f", ".,:;!?"))  # "。", "，", "：", "；", "！", "？"
_TYPOGRAPHY = str.maketrans({**dict.fromkeys("\u2019\u2018\u02bc", "'"), "…": "...", **_ASCII_PUNCTUATION})
_FULL_WIDTH = re.compile(r"[\u3002\uff0c\uff1a\uff1b\uff01\uff1f](?=[^\s*_)\]}\"'])")  # a list's "，": "2，6，18"
_SPACES = re.compile(r"(?<!\d)[\u00a0\u202f\u2009\u2002-\u2008\u200a]|[\u00a0\u202f\u2009\u2002-\u2008\u200a](?!\d)"
                     r"|(?<=\S)(?:[ \t]{2,}|\t)(?=\S)|(?<=[^\d\s])([!?])\1+")  # not "1\u00a0000"; "!!!" is "!"
_EMPHASIS = re.compile(r"(\*\*|__)(?=[^\s*_])([^\n]*?[^\s*_])\1"
                       r"|(?<![\w*\\])([*_])(?=[^\s*_])([^\n*_]*?[^\s*_\\])\3(?![\w*])")
_DASHES = str.maketrans(dict.fromkeys("\u2212\u2013\u2012\u2010\u2011\ufe63\uff0d", "-"))
_WHOLE_RUPEES = re.compile(r"(?<=\d)\s?/-(?![\d-])")  # "Rs. 1,200/-": a whole amount, written the Indian way
_DOLLAR = re.compile(r"\\text\s*\{\s*\\\$\s*\}|\\textdollar\b\s*|\\\$")
# Digits in groups of three, one separator kind per number; the first group has 1-3 digits.
_GROUPED = re.compile(
    r"(?<![\d.,])(?<![\d.,] )(\d{1,3})(\\[,! ]|\{,\}|[ \u00a0\u2009\u202f])(\d{3})((?:\2\d{3})*)(?![\d])"
)
# ... which one plain space does not group where the second number names the things counted
_MODIFIER = re.compile(r"-[a-z]|\s+(?:dollar|euro|pound|rupee|yen)s?[\s-]+(?:bills?|notes?|coins?)\b",
                       flags=re.IGNORECASE)


def _sentence_about(words: str) -> re.Pattern:
    """A sentence (up to its end mark or line) that holds one of `words`, where a pair of numbers is read one way."""
    return re.compile(rf"[^.!?\n]*\b(?:{words})\b[^.!?\n]*", flags=re.IGNORECASE)


# "N out of M" or "N in M" in a sentence that speaks of a chance: the sentence, then the pair
_CHANCE_SENTENCE = _sentence_about("chance|probability|odds|likelihood|fraction|proportion")
_OUT_OF = re.compile(r"(?<![\d./])(\d+|\bone)\s+(?:out\s+of|in)\s+(\d+)(?![\d./])", flags=re.IGNORECASE)
_OUT_OF_LINE = re.compile(r"^[ \t]*(\d+)[ \t]+(?:out[ \t]+of|in)[ \t]+(\d+)[ \t]*\.?[ \t]*$", flags=re.MULTILINE)
_DENOMINATORS = {"half": 2, "halves": 2, "third": 3, "quarter": 4, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
                 "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "sixteenth": 16, "twentieth": 20,
                 "hundredth": 100, "thousandth": 1000}
_SMALL = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_COUNT = r"a|an|\d+|" + "|".join(_SMALL)
_FRACTION_WORDS = re.compile(
    rf"\b(?:(\d+|{'|'.join(_SMALL)})\s+and\s+)?({_COUNT})[\s-]+(halves|half|thirds?|quarters?|fourths?|fifths?|sixths?"
    r"|sevenths?|eighths?|ninths?|tenths?|elevenths?|twelfths?|sixteenths?|twentieths?|hundredths?|thousandths?)\b",
    flags=re.IGNORECASE)
_DECIMAL_COMMA = re.compile(r"(?<![\d,.])(\d+),(\d{1,2})(?![\d,])(?!\s*\d)")
# thousands grouped by dots, the European way: before a decimal comma ("1.000,00"), or in two groups or more
_DOTTED = re.compile(r"(?<![\d,.])(\d{1,3}(?:\.\d{3})+)(?:,(\d{1,2})(?![\d,])(?!\s*\d)|(?<=\.\d{3}\.\d{3})(?![.,]?\d))")
# a lone "two" or "zero" before a plural noun is a count ("Two buses are needed"); a lone "one" stays a word
_COUNTED = re.compile(r"\b(two|zero)\s+(?=(?!of\b)[a-z]+s\b)", flags=re.IGNORECASE)
# ... and a lone "one" that starts a compound quantity ("one dollar and 65 cents", "one hour 20 minutes")
_ONE_UNIT = re.compile(r"\bone\s+(?=(?:dollar|euro|pound|hour|minute|day|week|year|foot|yard|mile|met(?:re|er)"
                       r"|kilomet(?:re|er)|kilogram|lit(?:re|er)|gallon)\s+(?:and\s+)?\d)", flags=re.IGNORECASE)
# "N to M" after a result link, ending its sentence, is a ratio ("gives 3 to 4."; not "from 3 to 4", "3 to 4 hours")
_RATIO_TO = re.compile(r"\b(is|are|was|gives|equals|becomes|be|simplifies\s+to|reduces\s+to)\s+(\d+)\s+to\s+(\d+)"
                       r"(?=\s*(?:[.!;]|$))", flags=re.IGNORECASE)
# ... and "N to M" or "N : M" anywhere in a sentence that speaks of a ratio ("the ratio is 2 : 5")
_RATIO_SENTENCE = _sentence_about("ratios?")
_RATIO_PAIR = re.compile(r"(?<![\d./:])(\d+)\s*(?:\s:|\sto)\s+(\d+)(?![\d./:])")
_AND_FRACTION = re.compile(r"(?<![\d.])(\d+)\s+and\s+(\d+/\d+)(?![\d/])")
_DOZEN = re.compile(r"\b(a|half\s+a)\s+dozen\b", flags=re.IGNORECASE)
_SCALES = {"dozen": 12, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SCALED = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(dozen|thousand|million|billion|trillion)\b", flags=re.IGNORECASE)
# "1.2k", "3bn", "$2.5M": k and bn right after any number, m and M only after a dollar (a bare "5m" is five metres)
_SUFFIXED = re.compile(r"(?<![\w.])(?:(\$\s?)(\d+(?:\.\d+)?)(k|K|m|M|bn)|()(\d+(?:\.\d+)?)(k|K|bn))\b")
_SUFFIX_SCALE = {"k": 10**3, "m": 10**6, "bn": 10**9}
_SIGN_WORD = re.compile(r"\b(?:minus|negative)\s+(\$?)(?=\d)", flags=re.IGNORECASE)  # "minus $4^\circ$"
_SIGNED_DOLLAR = re.compile(r"(?<![\d)}\]%]\s)(?<![\d)}\]%])-\s?\$(?=\d)")  # a minus before a dollar, after no number
# "8 degrees below zero" -> "-8 degrees below zero" (the degree sign is `$8^\circ$` by now), "75 m below sea level"
_BELOW_ZERO = re.compile(r"(?<![\d.-])(?=\d+(?:\.\d+)?(?:\^\\circ\$\s*[CF]?|\s*degrees?(?:\s+(?:celsius|fahrenheit))?"
                         r"|\s*(?:m|metres?|meters?|ft|feet)\b)?\s+below\s+(?:zero|sea\s+level)\b)",
                         flags=re.IGNORECASE)
# a congruence states its residue: "1234 \equiv 1 \pmod 9" -> "1234 = 1", "2^20 ≡ 4 (mod 7)" -> "2^20 = 4"
_MODULUS = re.compile(r"\s*(?:\\pmod\s*\{?\s*\d+\s*\}?|\(\s*(?:\\bmod|\\mod|mod)\s*\d+\s*\))")
_CONGRUENT = re.compile(r"\\equiv\b|≡")
_HOURS = {w: i for i, w in enumerate("one two three four five six seven eight nine ten eleven twelve".split(), 1)}
_MINUTES = {"five": 5, "ten": 10, "twenty": 20, "twenty five": 25, "quarter": 15, "a quarter": 15, "half": 30}
_HOUR = r"(1[0-2]|[1-9]|" + "|".join(_HOURS) + ")"
_CLOCK = re.compile(  # not before a percent or a plural noun: "twenty past six" is a time, "... six apples" is not
    rf"\b(?:{_HOUR}\s+o['’ ]?clock|((?:a\s+)?quarter|half|five|ten|twenty(?:[- ]five)?|[1-9]|[12]\d)(\s+minutes?)?"
    rf"\s+(past|to)\s+{_HOUR})\b(?!\s*(?:%|percent|[a-z]+s\b))", flags=re.IGNORECASE)
_ROOT_SIGNS = {"square": "√", "sqrt": "√", "cube": "∛", "cbrt": "∛", "fourth": "∜"}
_ROOT_WORDS = re.compile(r"\b(?:the\s+)?(square|cube|fourth)\s+root\s+of\s+(?=\d|\()", flags=re.IGNORECASE)
_ROOT_CALLS = re.compile(r"(?<![\\A-Za-z_])(sqrt|cbrt)\s*(?=\()", flags=re.IGNORECASE)  # not LaTeX's \sqrt{}
_ROOT_COEFFICIENT = re.compile(r"(\d)\s*(?:\btimes\b|[*×·⋅])\s*(?=[√∛∜])")  # "4 times √3", "4*√3": 4√3


@functools.lru_cache(maxsize=4096)
def clean_answer(text: str) -> str:
    """`text` as the answer rule reads it: the module docstring's steps, in its order. Cached: `accuracy` reads one
    completion several ways (its answer, its final statement's results, a hedge, a decrease, a place), each from the
    same cleaned text."""
    text = _framed(text)
    text = _EMPHASIS.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(4), text)
    text = _CONGRUENT.sub("=", _MODULUS.sub("", text)) if _CONGRUENT.search(text) else text
    text = unicode_numbers(_roots_in_words(text.translate(_DASHES)))
    text = _DOZEN.sub(lambda m: {"a": "12", "half a": "6"}[" ".join(m.group(1).lower().split())], text)
    text = _SCALED.sub(lambda m: _scaled(m.group(1), _SCALES[m.group(2).lower()]), text)
    text = _SUFFIXED.sub(_suffixed, text)
    text = _CLOCK.sub(_clock, text)  # "quarter past twelve" -> 12:15
    text = spell_digits(text, threshold=3)
    text = _FRACTION_WORDS.sub(_fraction, text)
    text = _AND_FRACTION.sub(r"\1 \2", text)  # "3 and 1/2" -> "3 1/2", a mixed number
    text = _COUNTED.sub(lambda m: str(_SMALL[m.group(1).lower()]) + " ", text)  # "Two buses are needed": 2 buses
    text = _ONE_UNIT.sub("1 ", text)  # "one dollar and 65 cents": a compound quantity
    text = _RATIO_TO.sub(r"\1 \2:\3", text)  # "Dividing both by 4 gives 3 to 4.": 3:4
    text = _RATIO_SENTENCE.sub(lambda m: _RATIO_PAIR.sub(r"\1:\2", m.group()), text)  # "The ratio is 2 : 5": 2:5
    text = _CHANCE_SENTENCE.sub(lambda m: _OUT_OF.sub(  # "The chance is 7 out of 20": 7/20; "one in six": 1/6
        lambda p: f"{1 if p.group(1).lower() == 'one' else p.group(1)}/{p.group(2)}", m.group()), text)
    text = _OUT_OF_LINE.sub(r"\1/\2", text)  # "3 in 10" as a line of its own: 3/10
    text = _DOTTED.sub(lambda m: m.group(1).replace(".", "") + (f".{m.group(2)}" if m.group(2) else ""), text)
    text = _DECIMAL_COMMA.sub(r"\1.\2", text)  # "3,5 km" -> 3.5 (a thousands comma has three digits after it)
    text = _SIGN_WORD.sub(r"\1-", text)
    text = _SIGNED_DOLLAR.sub("$-", text)  # "= -$15,000" -> "= $-15,000" (not "$100 - $15", a difference)
    text = _BELOW_ZERO.sub("-", text)
    text = _DOLLAR.sub("", _WHOLE_RUPEES.sub("", text))
    whole = _GROUPED.fullmatch(text.strip()) is not None
    return _GROUPED.sub(lambda m: _join_groups(m, whole), text)


def _framed(text: str) -> str:
    """`text` without what frames a chat reply (the module docstring's first step): rules, quote and list marks,
    fences, emoji, its typography read as ASCII, and the closing sign-offs, one after another from the end while
    something stays before them."""
    text = _FULL_WIDTH.sub(lambda m: _ASCII_PUNCTUATION[m.group()] + " ", text)  # a space after, as in ASCII
    text = _EMOJI.sub("", _QUOTE_MARK.sub("", _RULE_LINE.sub("", text))).translate(_TYPOGRAPHY)
    text = _SPACES.sub(lambda m: m.group(1) or " ", text).replace(" \n", "\n")
    text = _LIST_NUMBER.sub("", text) if len(_LIST_NUMBER.findall(text)) > 1 else text  # a list of two items or more
    while (closing := _SIGN_OFF.search(text)) is not None and text[: closing.start()].strip():
        text = text[: closing.start()].rstrip()
    return text


# --------------------------------------------------------------------------- unicode


def _roots_in_words(text: str) -> str:
    """Roots written in words or as a function, as the root sign: "4 times the square root of 3" -> 4√3, "4*sqrt(3)"
    -> 4√(3), "the cube root of 27" -> ∛27 (the unicode step then writes them as LaTeX)."""
    text = _ROOT_WORDS.sub(lambda m: _ROOT_SIGNS[m.group(1).lower()], text)
    text = _ROOT_CALLS.sub(lambda m: _ROOT_SIGNS[m.group(1).lower()], text)
    return _ROOT_COEFFICIENT.sub(r"\1", text)


def unicode_numbers(text: str) -> str:
    """Numbers and math in any Unicode form written the ASCII and LaTeX way (the module docstring's first step)."""
    if text.isascii():
        return text
    out = []
    for i, ch in enumerate(text):
        if ch.isascii():
            out.append(ch)
        elif (digit := unicodedata.decimal(ch, None)) is not None:
            out.append(str(digit))
        elif ch in _SLASHES:
            out.append("/")
        elif ch == "\uff05":
            out.append("%")
        elif unicodedata.category(ch) == "No" and (value := _vulgar(ch)) is not None:
            mixed = i > 0 and (text[i - 1].isdigit())
            out.append((" " if mixed else "") + f"{value.numerator}/{value.denominator}")
        else:
            out.append(ch)
    text = "".join(out)
    powered = _powers(text)
    return _math(powered, powers=powered != text)


def _vulgar(ch: str) -> Fraction | None:
    """A vulgar fraction character's value ("¾" -> 3/4); None for other numeric characters (superscripts, circled)."""
    value = unicodedata.numeric(ch, None)
    if value is None or value == int(value) or "FRACTION" not in unicodedata.name(ch, ""):
        return None
    return Fraction(value).limit_denominator(100)


def _superscript(ch: str) -> str | None:
    if not unicodedata.name(ch, "").startswith("SUPERSCRIPT"):
        return None
    digit = unicodedata.digit(ch, None)
    return str(digit) if digit is not None else _SUPERSCRIPT.get(ch)


def _powers(text: str) -> str:
    """A run of superscript digits and signs as one power: "10³" -> "10^{3}", "x⁻¹" -> "x^{-1}"."""
    out, run = [], []
    for ch in text + "\0":
        if (sup := _superscript(ch)) is not None:
            run.append(sup)
            continue
        if run:
            out.append("^{" + "".join(run) + "}")
            run = []
        out.append(ch)
    return "".join(out[:-1])


def _math(text: str, powers: bool = False) -> str:
    """Math symbols as LaTeX; in text without math spans each run of math that holds one (or a power written in
    superscripts, when `powers`) becomes a math span."""
    if not (powers or any(ch in _MATH_CHARS for ch in text)):
        return text
    if "$" in text or "\\(" in text or "\\[" in text:  # math already marked: its symbols as LaTeX, no new spans
        return _latex(text)

    def span(m: re.Match) -> str:
        run = m.group()
        core = re.sub(r"^(?:[ +*/=]|\^\{[^{}]*\}|\^)+", "", run).rstrip(" -+*/=^(")  # not from inside a power
        core = re.sub(r"(=[^=]*\d) [A-Za-z](?:/[A-Za-z])*$", r"\1", core)  # a unit after the result: "= 21 L", "m/s"
        core = _after_unopened(core)  # "P(sum = 7) = 1/6 ≈ 0.167": the run begins after the words' parenthesis
        if (aside := re.match(r"[^()]*\d \(", core)) and core.endswith(")"):
            core = core[aside.end():-1]  # "2 (47 = 5 × 9 + 2)": a number, then its aside
        if not (any(ch in _MATH_CHARS for ch in core) or (powers and re.search(r"\d\^\{", core))):
            return run
        at = run.index(core)
        return f"{run[:at]}${' '.join(_latex(core).split())}${run[at + len(core):]}"

    return _RUN.sub(span, text)


def _after_unopened(core: str) -> str:
    """A run less what comes before its last closing parenthesis that no parenthesis of the run opens, and the
    operators after it: "7) = 1/6 ≈ 0.167", the run after "P(sum = ", is "1/6 ≈ 0.167"; and less what follows a
    parenthesis it opens and does not close: "162 (×3" of "162 (×3 each time)" is "162"."""
    depth, cut, opened = 0, 0, []
    for i, ch in enumerate(core):
        if ch == "(":
            depth, opened = depth + 1, [*opened, i]
        elif ch == ")":
            depth, cut, opened = (depth - 1, cut, opened[:-1]) if depth else (0, i + 1, [])
    core = core[: opened[0]].rstrip(" -+*/=^") if opened else core
    return re.sub(r"^[ +*/=]+", "", core[cut:]) if cut else core


def _latex(text: str) -> str:
    text = _ROOT.sub(lambda m: f"{_ROOTS[m.group(1)]}{{{m.group(2).strip('()')}}}", text)
    for ch, command in _SYMBOLS.items():
        if ch in text:  # operators spaced, constants followed by a space only where a letter follows
            spaced = command[0] == "\\" and command not in (r"\pi", r"\infty")
            text = re.sub(rf" ?{re.escape(ch)} ?", lambda _: f" {command} " if spaced else command, text)
            if not spaced:
                text = re.sub(rf"{re.escape(command)}(?=[A-Za-z])", lambda _: command + " ", text)
    return text


# --------------------------------------------------------------------------- words around and instead of digits


def _fraction(m: re.Match) -> str:
    whole, count, name = m.group(1), m.group(2).lower(), m.group(3).lower()
    whole = "" if whole is None else f"{whole if whole.isdigit() else _SMALL[whole.lower()]} "
    n = 1 if count in ("a", "an") else int(count) if count.isdigit() else _SMALL[count]
    denominator = _DENOMINATORS.get(name) or _DENOMINATORS[name[:-1]]
    if not whole and n >= denominator:
        return m.group(0)  # "28 quarters", "4 halves": things counted, no fraction
    return f"{whole}{n}/{denominator}"


def _scaled(value: str, scale: int) -> str:
    exact = Fraction(value) * scale
    return str(exact.numerator) if exact.denominator == 1 else str(float(exact))


def _clock(m: re.Match) -> str:
    """A time of day in words as H:MM; the match as it was where it may be no time."""
    def hour(h: str) -> int:
        return _HOURS.get(h.lower()) or int(h)

    if m.group(1):
        return f"{hour(m.group(1))}:00"
    minutes, said, way, h = m.group(2), m.group(3), m.group(4).lower(), hour(m.group(5))
    words = " ".join(minutes.lower().replace("-", " ").split())  # "twenty-five", "a  quarter"
    minute = _MINUTES.get(words) or (int(minutes) if said else 0)  # "5 to 7", "3 past 4": a range, a sum
    if not 0 < minute < 60 or (way == "to" and not said and minute != 15):
        return m.group()  # "ten to four" is as often a score or a range as a time: "quarter to", "minutes to" are times
    return f"{h}:{minute:02d}" if way == "past" else f"{h - 1 if h > 1 else 12}:{60 - minute:02d}"


def _suffixed(m: re.Match) -> str:
    dollar, value, suffix = m.groups()[:3] if m.group(2) else m.groups()[3:]
    return dollar + _scaled(value, _SUFFIX_SCALE[suffix.lower()])


def _join_groups(m: re.Match, whole: bool) -> str:
    if m.group(2) == " " and not m.group(4) and not whole and _MODIFIER.match(m.string, m.end()):
        return m.group(0)  # "2 100 dollar bills", "2 100-page books": a count of things named by the second number
    sep = re.escape(m.group(2))
    return m.group(1) + m.group(3) + re.sub(sep, "", m.group(4))
