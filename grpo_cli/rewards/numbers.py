r"""Plain numbers read exactly, and when two answers are the same (`answers_match`: exact numbers, else math-verify).

A plain number (`read_number`) is the whole text being one of: an integer or decimal with optional sign and
thousands commas ("-1,234.5"), scientific notation ("3.2e4", "6E-3", "3.2 \times 10^{4}", "1.5 x 10^-3"), a
fraction of two such numbers ("3/4", `\frac{3}{4}`, `\dfrac34`), a mixed number ("3 3/4", `3\frac{3}{4}`: 15/4),
or English number words ("five", "minus twelve", "twenty-one", "one hundred and five", "two point five": text2num,
through spelled.words_value). Its value
is a Fraction: no float rounding, so 2^53 + 1 stays itself and 1e-9 is not 3e-9.

Two plain numbers are the same answer (`numbers_match`) when they are equal, or when they agree to six decimal
places and six significant digits (|a - b| <= 5e-7 and <= 1e-6 max(|a|, |b|)): "0.3333333" matches 1/3 and
3.141593 matches 3.14159265, as math-verify's six-decimal rounding does, but unlike it 1e-9 is not 3e-9 (both
round to 0) and 1000000.5 is not 1000001. A decimal with three significant digits or more is also the answer whose
decimals never end (a repeating fraction, pi, a root) when it is that answer to its last digit, rounded or cut
(`rounds_to`: "0.333" and "0.667" are 1/3 and 2/3, "78.5" and "78.54" are 25 pi, "3.14" is pi); "0.33" is not 1/3 and
"3.1" is not pi (two digits say too little), and no rounding is 12.5 or 0.25, whose decimals end. Either way round: a
reference written "78.5" is answered by 25 pi. A reference that is a fraction in lowest terms is not answered by the
same fraction unreduced (`unreduced`: "9/12" for 3/4), and a number is not answered by a computation without its
result (`unevaluated`: "11 + 18" for 29, which math-verify evaluates). Anything else
(sqrt(2), 4 pi, sets, text) is math-verify's to decide.

Numbers in other forms (Unicode, words around digits) are written the plain way first (notation.py's
`clean_answer`); a percentage is read as both its number and its hundredth (`percent_value`), and a compound
quantity ("2 hours and 30 minutes") as its value in each of its units (`quantity_values`, by pint).
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

from grpo_cli.rewards.notation import clean_answer
from grpo_cli.rewards.spelled import words_value

_NUMBER_FRAC = r"\\[dt]?frac\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)\s*(?:\{\s*-?\d+(?:\.\d+)?\s*\}|\d)"
_EXPONENT = r"(?:[eE][-+]?\d+|\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*\{?\s*[-+]?\d+\s*\}?)(?![\w])"
# A number as people write it: optional minus (not a subtraction: "3-5" gives 5), thousands
# separators ("1,000"), decimals, scientific notation ("3.2e4"), simple fractions ("3/4"), mixed numbers
# ("3 3/4") and LaTeX fractions.
NUMBER = re.compile(
    rf"(?<![\w.^])(?<!\^\{{)-?(?:\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?![\d:])|\d+:\d+(?![\d:])"
    rf"|\d+\s+\d+/\d+(?![\d/]|\.\d)|\d+\s*{_NUMBER_FRAC}|{_NUMBER_FRAC}"
    rf"|(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?:{_EXPONENT}|/\d+(?:\.\d+)?)?|\.\d+)(?!\d|st\b|nd\b|rd\b|th\b)"
)
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]")
PLAIN_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own default, used where its signal.alarm can work
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


def fraction_terms(text: str) -> tuple[int, int] | None:
    """The numerator and denominator of `text` written as one fraction of whole numbers ("3/4", "-3/4", `\frac{3}{4}`),
    else None."""
    t = text.strip().rstrip(".").strip().strip("$").strip().lstrip("-+").strip()
    m = re.fullmatch(r"(\d+)\s*/\s*(\d+)", t) or re.fullmatch(_LATEX_FRAC, t)
    if m is None:
        return None
    num, den = (g for g in m.groups() if g is not None)
    return (int(num), int(den)) if num.isdigit() and den.isdigit() else None


def unreduced(reference: str, predicted: str) -> bool:
    """Whether `reference` is a fraction in lowest terms and `predicted` one that is not ("9/12" for 3/4: the question
    asked for the fraction, and echoing a fraction unreduced would be a simplification's reward for nothing)."""
    ref, pred = fraction_terms(reference), fraction_terms(predicted)
    return bool(ref and pred and ref[1] > 1 and math.gcd(*ref) == 1 and math.gcd(*pred) > 1)


def sums_to(parts: list[str], whole: str) -> bool:
    """Whether the plain numbers `parts` add up to the plain number `whole` exactly."""
    values = [read_number(t) for t in (*parts, whole)]
    return None not in values and sum(values[:-1]) == values[-1]


def numbers_match(a: Fraction, b: Fraction) -> bool:
    """Equal, or equal to six decimal places and six significant digits (see the module docstring)."""
    if a == b:
        return True
    diff = abs(a - b)
    return diff <= Fraction(5, 10**7) and diff <= Fraction(1, 10**6) * max(abs(a), abs(b))


def rounds_to(exact: Fraction | float, text: str) -> bool:
    """Whether `text`, a decimal of three significant digits or more, is `exact` (whose decimals never end) to its last
    digit (see the module docstring)."""
    m = re.fullmatch(r"-?(\d+(?:,\d{3})*)\.(\d+)", text.strip().rstrip(".").strip())
    if m is None or len((m.group(1).replace(",", "") + m.group(2)).lstrip("0")) < 3:
        return False
    if isinstance(exact, Fraction):
        den = exact.denominator
        for p in (2, 5):
            while den % p == 0:
                den //= p
        if den == 1:  # its decimals end: only the exact value is it
            return False
    given, scale = _decimal(text.strip().rstrip(".").strip()), 10 ** len(m.group(2))
    if (given < 0) != (exact < 0):
        return False
    digits = abs(Fraction(exact)) * scale  # a float's Fraction is exact: its few last bits do not reach the digit
    return abs(given) * scale in (math.floor(digits), math.floor(digits + Fraction(1, 2)))


def percent_number(text: str) -> str | None:
    """The number of a percentage ("25%", "25 \\%", "25 percent": "25"); None for anything else."""
    m = re.fullmatch(r"(.+?)\s*(?:\\?%|percent)", text.strip().rstrip("."), flags=re.IGNORECASE)
    return m.group(1) if m else None


def percent_value(text: str) -> list[Fraction] | None:
    """A percentage read as its two answers ("25%": [25, 1/4]); None for anything else."""
    number = percent_number(text)
    value = read_number(number) if number is not None else None
    return None if value is None else [value, value / 100]


_MILLIONS = re.compile(r"\s*\$?(\d+(?:\.\d+)?)\s?M\s*")  # "2.75M" beside a reference in millions


def millions_value(text: str) -> list[Fraction] | None:
    """A number with a capital M read as its two answers ("2.75M": [2.75, 2750000]: millions, or a unit's M such as
    a molar concentration); None for anything else."""
    m = _MILLIONS.fullmatch(text)
    return None if m is None else [Fraction(m.group(1)), Fraction(m.group(1)) * 10**6]


def percent_rounds_to(exact: Fraction | None, text: str) -> bool:
    """Whether the percentage `text` is `exact` to its last digit as either of its answers ("33.3%" for 1/3, "14.3%"
    for 100/7; `rounds_to`'s three significant digits)."""
    number = percent_number(text)
    return exact is not None and number is not None and (rounds_to(exact, number) or rounds_to(exact * 100, number))


# a compound quantity: two or more numbers each with its unit ("2 hours and 30 minutes", "5 ft 6 in")
_PART = r"\d+(?:\.\d+)?\s*[A-Za-z]+\b"
QUANTITY = re.compile(rf"(?<![\w./]){_PART}(?:\s*(?:,\s*and|,|and)?\s+{_PART})+")
_UNITS = None


def _unit_registry():
    """pint's unit registry (units and their conversions, a maintained library), with dollars and cents; built once."""
    global _UNITS
    if _UNITS is None:
        import pint

        _UNITS = pint.UnitRegistry()
        _UNITS.define("dollar = [currency] = _ = dollars = usd")
        _UNITS.define("cent = dollar / 100 = _ = cents")
        for name in ("euro = dollar = _ = euros = eur", "rupee = dollar = _ = rupees", "penny = cent = _ = pence",
                     "paisa = cent = _ = paise"):  # one currency's parts: "57 euros and 75 cents" is 57.75
            _UNITS.define(name)
    return _UNITS


def quantity_values(text: str) -> list[Fraction] | None:
    """A compound quantity read by pint as its value in each of its units ("2 hours and 30 minutes" -> [2.5, 150],
    "18 dollars and 50 cents" -> [18.5, 1850]); None unless `text` is two or more numbers with units of one kind,
    each unit smaller than the one before."""
    t = text.strip().rstrip(".").strip()
    if not QUANTITY.fullmatch(t):
        return None
    import pint

    units = _unit_registry()
    try:
        parts = [units.Quantity(float(v), units.parse_units(u))
                 for v, u in re.findall(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", t)]
        sizes = [units.Quantity(1, p.units).to(parts[-1].units).magnitude for p in parts]
        if any(a <= b for a, b in zip(sizes, sizes[1:])):  # "2 hours, 3 hours" is a list: units step down in one
            return None
        total = sum(parts[1:], parts[0])
        values = [total.to(p.units).magnitude for p in parts]
    except (pint.errors.PintError, AttributeError, ValueError, TypeError):  # no unit, or units of different kinds
        return None
    return [Fraction(v).limit_denominator(10**6) for v in values]


def same_quantity(a: str, b: str) -> bool:
    """Whether two numbers with units are one quantity in two units ("4000 m" and "4 km"; not "4 m" and "4 km", nor
    "3 apples" and "3 apples": a unit pint does not know)."""
    import pint

    units = _unit_registry()
    try:
        x, y = (units.Quantity(float(v), units.parse_units(u))
                for v, u in (re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", t).groups() for t in (a, b)))
        return x.units != y.units and math.isclose(x.to(y.units).magnitude, y.magnitude, rel_tol=1e-6)
    except (pint.errors.PintError, AttributeError, ValueError, TypeError):
        return False


# --------------------------------------------------------------------------- equivalence


def math_verify_timeout() -> int | None:
    # math-verify times out with signal.alarm, which raises off the main thread; None disables it
    # there (give the reward `timeout_s` to bound it with a child process instead).
    return _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def parse_math(text: str, timeout: int | None = None) -> list:
    """math-verify parse of a bare answer. LaTeX-looking text is read inside $...$ (so `\\sqrt{2}`,
    `2^{10}` and `(1, 2)` parse); text with words is read plainly, so "Paris" is not a product
    of five symbols and "12 dollars" is 12."""
    from math_verify import parse

    timeout = math_verify_timeout() if timeout is None else timeout
    if "$" in text:
        tries = [text]
    elif _LATEX_COMMAND.search(text) or not PLAIN_WORD.search(text):
        tries = [f"${text}$", text]
    else:
        tries = [text]
    for t in tries:
        parsed = parse(t, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


_OPERATION = re.compile(r"[\d)]\s*(?:[+*×÷]|(?<=\s)-(?=\s)|(?<=\d)-(?=\d)|\\(?:times|cdot|div)\b)"
                        r"\s*[({]?\s*(\d+)(\s*\^)?")


def unevaluated(text: str) -> bool:
    """Whether `text` writes a computation on numbers without its result ("11 + 18", "7 \\times 2", "(3 + 4) \\cdot
    2"; not "5 + 3 = 8"); scientific notation ("1.5 \\times 10^{4}") is a number, a power or a fraction a closed
    form."""
    result = re.split(r"=|\\approx|≈", text)[-1]  # "5 + 3 = 8" states its result
    return any(not (m.group(1) == "10" and m.group(2)) for m in _OPERATION.finditer(result))


def clock_time(text: str, dotted: bool = False) -> tuple[int, int, bool] | None:
    """A time of day "H:MM" ("07:30", "7:30", "4:05 PM", "4:05 p.m.", "4 pm") as (hours on a 24-hour clock, minutes,
    whether the half of the day is said: a.m. / p.m., or an hour 0 or past 12); None for anything else ("3:4" is a
    ratio). With `dotted`, "H.MM" too, as British English writes a time ("10.15"): where the other answer is a clock
    time."""
    half_of_day = r"\s*(?:\\text\s*\{\s*)?([AaPp])\.?\s?[Mm]\.?\}?"
    m = re.fullmatch(rf"(\d{{1,2}})(?:{'[:.]' if dotted else ':'}([0-5]\d)(?:{half_of_day})?|{half_of_day})",
                     text.strip().rstrip(".").strip())
    if not m:
        return None
    hours, minutes, half = int(m.group(1)), int(m.group(2) or 0), m.group(3) or m.group(4)
    if half:
        return (hours % 12 + 12 * (half in "Pp"), minutes, True) if 1 <= hours <= 12 else None
    return (hours, minutes, hours == 0 or hours > 12) if hours < 24 else None


def same_time(a: tuple[int, int, bool], b: tuple[int, int, bool]) -> bool:
    """Whether two clock times are one time of day: where either leaves the half of the day unsaid, on a 12-hour
    clock (22:05 is 10:05, and "4:05" is 4:05 PM); 4:05 AM is not 4:05 PM."""
    return a[1] == b[1] and (a[0] == b[0] if a[2] and b[2] else a[0] % 12 == b[0] % 12)


def answers_match(reference: str, predicted: str) -> bool:
    """True if `predicted` is equivalent to `reference`, both cleaned first (`clean_answer`): two plain numbers
    compared exactly (to six decimals and six significant digits: grpo_cli/rewards/numbers.py), anything else by
    math-verify ("\\sqrt{8}" vs "2\\sqrt{2}" is True). Text that math-verify cannot read is compared as words,
    case-insensitively."""
    from math_verify import verify

    reference, predicted = clean_answer(reference), clean_answer(predicted)
    exact = read_number(reference), read_number(predicted)
    if exact[0] is not None and exact[1] is not None:
        if unreduced(reference, predicted):
            return False
        return numbers_match(*exact) or rounds_to(exact[0], predicted) or rounds_to(exact[1], reference)
    if exact[0] is not None and exact[1] is None and unevaluated(predicted):
        return False  # "\\boxed{11 + 18}" for 29: the question's own sum, not its answer
    texts = reference, predicted
    times = [clock_time(t) for t in texts]  # "07:00" is 7:00, the hour 7 is 7:00, and beside a time "10.15" is 10:15
    if any(times):
        a, b = (times[k] or clock_time(texts[k], dotted=True)
                or (exact[k] is not None and exact[k].denominator == 1 and (int(exact[k]), 0, False)) for k in (0, 1))
        if a and b and same_time(a, b):
            return True
        t = times[1]  # an answer may write a duration on a clock's face (m:ss, h:mm): "5:30" answers 5.5
        if t and exact[0] is not None and not re.search(r"[AaPp]\.?\s?[Mm]\b", predicted) \
                and numbers_match(Fraction(t[0]) + Fraction(t[1], 60), exact[0]):
            return True
        if a and b:
            return False
    # "25%" is the answer 25 and the answer 0.25; "2 hours and 30 minutes" is 2.5 and 150; "2.75M" 2.75 and 2750000
    readings = [percent_value(t) or quantity_values(t) or millions_value(t) for t in (reference, predicted)]
    if any(r is not None for r in readings):
        a, b = (readings[k] if readings[k] is not None else [exact[k]] for k in (0, 1))
        return any(x is not None and y is not None and numbers_match(x, y) for x in a for y in b) or \
            percent_rounds_to(exact[0], predicted) or percent_rounds_to(exact[1], reference)
    timeout = math_verify_timeout()
    gold, pred = parse_math(reference, timeout), parse_math(predicted, timeout)
    if not gold or not pred:
        return " ".join(reference.lower().split()) == " ".join(predicted.lower().split())
    for value, text in ((gold[0], predicted), (pred[0], reference)):  # "78.5" for 25 pi, either way round
        if read_number(text) is not None and getattr(value, "is_number", False) and value.is_real and rounds_to(
                float(value.evalf()), text):
            return True
    return bool(verify(gold, pred, timeout_seconds=timeout))
