r"""Plain numbers read exactly, and when two are the same answer.

A plain number (`read_number`) is the whole text being one of: an integer or decimal with optional sign and
thousands commas ("-1,234.5"), scientific notation ("3.2e4", "6E-3", "3.2 \times 10^{4}", "1.5 x 10^-3"), a
fraction of two such numbers ("3/4", `\frac{3}{4}`, `\dfrac34`), a mixed number ("3 3/4", `3\frac{3}{4}`: 15/4),
or English number words ("five", "minus twelve", "twenty-one", "one hundred and five", "two thousand"). Its value
is a Fraction: no float rounding, so 2^53 + 1 stays itself and 1e-9 is not 3e-9.

Two plain numbers are the same answer (`numbers_match`) when they are equal, or when they agree to six decimal
places and six significant digits (|a - b| <= 5e-7 and <= 1e-6 max(|a|, |b|)): "0.3333333" matches 1/3 and
3.141593 matches 3.14159265, as math-verify's six-decimal rounding does, but unlike it 1e-9 is not 3e-9 (both
round to 0) and 1000000.5 is not 1000001. Anything else (sqrt(2), 4 pi, sets, text) is math-verify's to decide.

Numbers in other Unicode forms are written the ASCII way first (`unicode_numbers`), and a percentage is read as both
its number and its hundredth (`percent_value`).
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

_SLASHES = "\u2044\u2215\uff0f"  # fraction slash, division slash, fullwidth solidus

UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9}
_WORD = "|".join(sorted([*UNITS, *TENS], key=len, reverse=True))
_ANY = "|".join(sorted([*UNITS, *TENS, *SCALES], key=len, reverse=True))
# "minus twelve", "twenty-one", "one hundred and five", "two thousand three hundred"
NUMBER_WORDS = re.compile(
    rf"\b(?:(?:minus|negative)\s+)?(?:{_WORD})(?:(?:\s+and\s+|[\s-]+)(?:{_ANY}))*\b(?!-)", flags=re.IGNORECASE
)

_DEC = r"\d+(?:,\d{3})*(?:\.\d+)?|\.\d+"
_BRACED = r"\{\s*(-?(?:" + _DEC + r"))\s*\}|(\d)"
_LATEX_FRAC = rf"\\[dt]?frac\s*(?:{_BRACED})\s*(?:{_BRACED})"


def words_value(text: str) -> int | None:
    """English number words -> their integer; None when `text` is not only number words."""
    tokens = re.split(r"[\s-]+", text.strip().lower().replace(" and ", " "))
    sign = 1
    if tokens and tokens[0] in ("minus", "negative"):
        sign, tokens = -1, tokens[1:]
    if not tokens or any(t not in UNITS and t not in TENS and t not in SCALES for t in tokens):
        return None
    total, group = 0, 0
    for t in tokens:
        if t in SCALES:
            if t == "hundred":
                group = max(group, 1) * 100
            else:
                total, group = total + max(group, 1) * SCALES[t], 0
        else:
            group += UNITS.get(t, TENS.get(t, 0))
    return sign * (total + group)


def _decimal(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _sci(text: str) -> Fraction | None:
    m = re.fullmatch(rf"({_DEC})(?:[eE]([-+]?\d+)|\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*\{{?\s*([-+]?\d+)\s*\}}?)",
                     text)
    if m is None:
        return None
    exponent = int(m.group(2) or m.group(3))
    if abs(exponent) > 100:  # "1e400" is not worth 400 digits (math-verify reads it instead)
        return None
    return _decimal(m.group(1)) * Fraction(10) ** exponent


def _latex_frac(text: str) -> Fraction | None:
    m = re.fullmatch(_LATEX_FRAC, text)
    if m is None:
        return None
    num, den = (_decimal(m.group(i) or m.group(i + 1)) for i in (1, 3))
    return num / den if den else None


def _unsigned(text: str) -> Fraction | None:
    if re.fullmatch(_DEC, text):
        return _decimal(text)
    if (value := _sci(text)) is not None or (value := _latex_frac(text)) is not None:
        return value
    if m := re.fullmatch(rf"({_DEC})\s*/\s*({_DEC})", text):
        den = _decimal(m.group(2))
        return _decimal(m.group(1)) / den if den else None
    if m := re.fullmatch(rf"(\d+)(?:\s+(\d+)\s*/\s*(\d+)|\s*({_LATEX_FRAC}))", text):  # mixed: "3 3/4", 3\frac34
        whole = int(m.group(1))
        part = _latex_frac(m.group(4)) if m.group(4) else Fraction(int(m.group(2)), int(m.group(3) or 1) or 1)
        if part is None or not 0 < part < 1:
            return None
        return whole + part
    return None


def read_number(text: str) -> Fraction | None:
    """The value of `text` when it is one plain number (see the module docstring), else None."""
    t = text.strip().rstrip(".").strip()
    if t.startswith("$") and t.endswith("$") and len(t) > 1:
        t = t.strip("$").strip()
    if (words := words_value(t)) is not None:
        return Fraction(words)
    sign = 1
    if t[:1] in ("-", "+"):
        sign, t = (-1 if t[0] == "-" else 1), t[1:].strip()
    if t.startswith("{") and t.endswith("}"):
        t = t[1:-1].strip()
    value = _unsigned(t)
    return None if value is None else sign * value


def numbers_match(a: Fraction, b: Fraction) -> bool:
    """Equal, or equal to six decimal places and six significant digits (see the module docstring)."""
    if a == b:
        return True
    diff = abs(a - b)
    return diff <= Fraction(5, 10**7) and diff <= Fraction(1, 10**6) * max(abs(a), abs(b))


def unicode_numbers(text: str) -> str:
    """Numbers in any Unicode form written the ASCII way, by what the Unicode database says each character is
    (`unicodedata`): every decimal digit ("４２", "٤٢" -> "42"), vulgar fractions ("½" -> "1/2"; "1½" -> "1 1/2",
    a mixed number), the fraction slash and the fullwidth percent sign."""
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
    return "".join(out)


def _vulgar(ch: str) -> Fraction | None:
    """A vulgar fraction character's value ("¾" -> 3/4); None for other numeric characters (superscripts, circled)."""
    value = unicodedata.numeric(ch, None)
    if value is None or value == int(value) or "FRACTION" not in unicodedata.name(ch, ""):
        return None
    return Fraction(value).limit_denominator(100)


def percent_value(text: str) -> list[Fraction] | None:
    """A percentage ("25%", "25 \\%", "25 percent") read as its two answers, [25, 1/4]; None for anything else."""
    m = re.fullmatch(r"(.+?)\s*(?:\\?%|percent)", text.strip().rstrip("."), flags=re.IGNORECASE)
    value = read_number(m.group(1)) if m else None
    return None if value is None else [value, value / 100]


_DENOMINATORS = {"half": 2, "halves": 2, "third": 3, "quarter": 4, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
                 "eighth": 8, "ninth": 9, "tenth": 10}
_COUNT = r"a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+"
_FRACTION_WORDS = re.compile(
    rf"\b(?:(\d+|{_WORD})\s+and\s+)?({_COUNT})[\s-]+(halves|half|thirds?|quarters?|fourths?|fifths?|sixths?|sevenths?"
    r"|eighths?|ninths?|tenths?)\b", flags=re.IGNORECASE)
_SCALED = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(thousand|million|billion|trillion)\b", flags=re.IGNORECASE)
_MONEY_SUFFIX = re.compile(r"(\$\s?)(\d+(?:\.\d+)?)\s?(k|K|m|M|bn)\b")
_SIGN_WORD = re.compile(r"\b(?:minus|negative)\s+(?=\d)", flags=re.IGNORECASE)
_SUFFIX_SCALE = {"k": 10**3, "m": 10**6, "bn": 10**9}


def number_phrases(text: str) -> str:
    """Numbers people write in words around digits, as digits: a sign word before digits ("minus 3" -> "-3"), a
    scale word after them ("1.5 million" -> "1500000", "$2.5k" -> "$2500"), and fractions in words ("one third" ->
    "1/3", "three quarters" -> "3/4", "two and a half" -> "2 1/2", a mixed number)."""
    def count(word: str) -> int:
        return 1 if word.lower() in ("a", "an") else int(word) if word.isdigit() else UNITS[word.lower()]

    def fraction(m: re.Match) -> str:
        whole = m.group(1)
        whole = "" if whole is None else f"{whole if whole.isdigit() else words_value(whole)} "
        name = m.group(3).lower()
        return f"{whole}{count(m.group(2))}/{_DENOMINATORS.get(name) or _DENOMINATORS[name[:-1]]}"

    def scaled(value: str, scale: int) -> str:
        exact = Fraction(value) * scale
        return str(exact.numerator) if exact.denominator == 1 else str(float(exact))

    text = _SIGN_WORD.sub("-", text)
    text = _SCALED.sub(lambda m: scaled(m.group(1), SCALES[m.group(2).lower()] if m.group(2).lower() != "trillion"
                                        else 10**12), text)
    text = _MONEY_SUFFIX.sub(lambda m: m.group(1) + scaled(m.group(2), _SUFFIX_SCALE[m.group(3).lower()]), text)
    return _FRACTION_WORDS.sub(fraction, text)
