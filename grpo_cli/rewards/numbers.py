r"""Plain numbers read exactly, and when two are the same answer.

A plain number (`read_number`) is the whole text being one of: an integer or decimal with optional sign and
thousands commas ("-1,234.5"), scientific notation ("3.2e4", "6E-3", "3.2 \times 10^{4}", "1.5 x 10^-3"), a
fraction of two such numbers ("3/4", `\frac{3}{4}`, `\dfrac34`), a mixed number ("3 3/4", `3\frac{3}{4}`: 15/4),
or English number words ("five", "minus twelve", "twenty-one", "one hundred and five", "two point five": text2num,
through notation.words_value). Its value
is a Fraction: no float rounding, so 2^53 + 1 stays itself and 1e-9 is not 3e-9.

Two plain numbers are the same answer (`numbers_match`) when they are equal, or when they agree to six decimal
places and six significant digits (|a - b| <= 5e-7 and <= 1e-6 max(|a|, |b|)): "0.3333333" matches 1/3 and
3.141593 matches 3.14159265, as math-verify's six-decimal rounding does, but unlike it 1e-9 is not 3e-9 (both
round to 0) and 1000000.5 is not 1000001. Anything else (sqrt(2), 4 pi, sets, text) is math-verify's to decide.

Numbers in other forms (Unicode, words around digits) are written the plain way first (notation.py's
`clean_answer`), and a percentage is read as both its number and its hundredth (`percent_value`).
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_cli.rewards.notation import words_value

_DEC = r"\d+(?:,\d{3})*(?:\.\d+)?|\.\d+"
_BRACED = r"\{\s*(-?(?:" + _DEC + r"))\s*\}|(\d)"
_LATEX_FRAC = rf"\\[dt]?frac\s*(?:{_BRACED})\s*(?:{_BRACED})"


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
        return words
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


def percent_value(text: str) -> list[Fraction] | None:
    """A percentage ("25%", "25 \\%", "25 percent") read as its two answers, [25, 1/4]; None for anything else."""
    m = re.fullmatch(r"(.+?)\s*(?:\\?%|percent)", text.strip().rstrip("."), flags=re.IGNORECASE)
    value = read_number(m.group(1)) if m else None
    return None if value is None else [value, value / 100]
