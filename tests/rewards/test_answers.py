r"""Answer checking, table-driven: each row is a completion, a reference and the accuracy it must get.

One table per class of mistake found by comparing with math-verify, reasoning-gym's scorer and TRL
(issue 10, item 8): an escaped dollar (`\$23`), a Unicode minus ("−3"), an unboxed inline LaTeX
fraction, digit grouping ("1 000 000"), and the order of answers (only the final one counts: the
right number followed by a wrong one scores 0). Then maj@k voting by mathematical equivalence.
"""

import json
import math
from pathlib import Path

import pytest

from grpo_cli.eval.metrics import majority_answer, normalize_answer, summarize
from grpo_cli.rewards import answers_match, extract_answer
from grpo_cli.rewards.builtin import accuracy


def rows(*table):
    """(completion, reference, expected[, mode]) -> pytest params, mode `auto` unless given."""
    return [pytest.param(*(r if len(r) == 4 else (*r, "auto")), id=f"{i}") for i, r in enumerate(table)]


DOLLAR = rows(
    (r"The total is \boxed{\$23}.", "23", 1.0),
    (r"\boxed{\$ 23}", "23", 1.0),
    (r"\boxed{23\,\$}", "23", 1.0),
    (r"\boxed{\$23.00}", "23", 1.0),
    (r"\boxed{\$1,234}", "1234", 1.0),
    (r"\boxed{\text{\$}23}", "23", 1.0),
    (r"\boxed{\textdollar 23}", "23", 1.0),
    (r"\boxed{-\$23}", "-23", 1.0),
    (r"So she pays \$23.", "23", 1.0),
    (r"So she pays $\$23$.", "23", 1.0),
    (r"#### \$23", "23", 1.0),
    (r"<answer>\$23</answer>", "23", 1.0),
    (r"\boxed{\$23}", r"\$23", 1.0),  # a reference written with the dollar
    (r"\boxed{\$23}", "24", 0.0),
    (r"\boxed{\$23}", "23", 1.0, "boxed"),
    ("It costs $5 and then $7.", "7", 1.0),  # plain-text dollars are not a math span
    ("So, the simple interest is Rs 1,200/-", "1200", 1.0),  # a whole amount written the Indian way
    ("The price is Rs. 500/- only.", "500", 1.0),
    ("x = 12 - 5 = 7", "7", 1.0),
)

MINUS = rows(
    ("The answer is \u22123.", "-3", 1.0),  # U+2212 MINUS SIGN
    ("The answer is \u22123.", "3", 0.0),
    ("\\boxed{\u22123}", "-3", 1.0),
    ("\\boxed{\u22123}", "3", 0.0),
    ("<answer>\u22123</answer>", "-3", 1.0),
    ("#### \u22123", "-3", 1.0),
    ("so x = \u20133", "-3", 1.0),  # U+2013 EN DASH used as a minus
    ("so x = \uff0d3", "-3", 1.0),  # U+FF0D FULLWIDTH HYPHEN-MINUS
    ("the temperature is \u22123.5 degrees", "-3.5", 1.0),
    ("the temperature is \u22123.5 degrees", "3.5", 0.0),
    ("a loss of \u22121,000", "-1000", 1.0),
    # "below zero" is a sign too
    ("The new temperature is 8 degrees below zero.", "-8", 1.0),
    ("The new temperature is 8 degrees below zero.", "8", 0.0),
    ("It is eight degrees below zero.", "-8", 1.0),
    ("It fell to 5° below zero.", "-5", 1.0),
    ("The midnight temperature was minus 4°C.", "-4", 1.0),  # a sign word before a degree sign
    ("The midnight temperature was minus 4°C.", "4", 0.0),
    ("It was negative 3.5 °F.", "-3.5", 1.0),
    ("The low was 3.5 °C below zero.", "-3.5", 1.0),
    ("It is 10 below zero tonight.", "-10", 1.0),
    ("The water is 4 degrees above zero.", "4", 1.0),
    # a minus before a dollar sign is the amount's sign, after no number
    ("Profit = 85,000 − 100,000 = −$15,000 (a loss).", "-15000", 1.0),
    ("The profit is -$15,000.", "-15000", 1.0),
    ("The profit is -$15,000.", "15000", 0.0),
    ("Her balance is now -$230.50.", "-230.5", 1.0),
    ("Net change: - $40", "-40", 1.0),
    ("$100 - $15 = $85", "85", 1.0),  # a difference keeps its sign to itself
    ("$100 -$15 = $85", "85", 1.0),
    ("The answer is -3.", "\u22123", 1.0),  # the reference has the Unicode minus
    ("\\boxed{\u2212\\frac{3}{4}}", "-0.75", 1.0),
    ("$x = \u2212\\frac{1}{2}$", "-1/2", 1.0),
    ("The answer is \u22123.", "-3", 1.0, "last_number"),
    ("from 10\u22123 we get", "3", 1.0, "last_number"),  # after a digit it is a subtraction, as with "-"
)

LATEX = rows(
    (r"So the answer is \frac{3}{4}.", "3/4", 1.0),
    (r"So the answer is $\frac{3}{4}$.", "3/4", 1.0),
    (r"So the answer is $\frac{3}{4}$.", "4", 0.0),
    (r"The probability is \dfrac{3}{4}", "0.75", 1.0),
    (r"The probability is \tfrac34", "0.75", 1.0),
    (r"hence $p = \frac{3}{4}$", "3/4", 1.0),
    (r"hence \(\frac{3}{4}\)", "3/4", 1.0),
    ("hence\n\\[ \\frac{3}{4} \\]\n", "3/4", 1.0),
    ("hence\n$$\\frac{3}{4}$$", "3/4", 1.0),
    (r"So $-\frac{3}{4}$", "-3/4", 1.0),
    (r"The answer is \frac{-3}{4}", "-0.75", 1.0),
    (r"The answer is $\sqrt{2}$.", r"\sqrt{2}", 1.0),
    (r"The answer is $\sqrt{2}$.", "2", 0.0),
    (r"The answer is $2^{10}$.", "1024", 1.0),
    (r"The area is $\pi r^2 = 4\pi$.", r"4\pi", 1.0),
    (r"So $3 \times 4 = 12$.", "12", 1.0),
    (r"So the answer is \frac{3}{4}.", "3/4", 1.0, "last_number"),
)

GROUPING = rows(
    ("There are 1 000 000 grains.", "1000000", 1.0),
    (r"There are 1\,000\,000 grains.", "1000000", 1.0),
    (r"There are $1\,000\,000$ grains.", "1000000", 1.0),
    (r"\boxed{1\,000\,000}", "1000000", 1.0),
    (r"\boxed{1 000 000}", "1000000", 1.0),
    ("There are 1\u2009000\u2009000 grains.", "1000000", 1.0),  # thin space
    ("There are 1\u202f000\u202f000 grains.", "1000000", 1.0),  # narrow no-break space
    ("There are 1\u00a0000 grains.", "1000", 1.0),  # no-break space
    (r"There are $1{,}000{,}000$ grains.", "1000000", 1.0),
    (r"There are 1{,}000{,}000 grains.", "1000000", 1.0),
    (r"\boxed{1{,}000{,}000}", "1000000", 1.0),
    ("#### 1 000 000", "1000000", 1.0),
    (r"It is 12\,345.5 m.", "12345.5", 1.0),
    ("There are 1 000 000 grains.", "1000", 0.0),
    ("There are 1,000,000.5 grains.", "1000000.5", 1.0),
    ("There are 1 000 000 grains.", "1000000", 1.0, "last_number"),
    ("so 2 apples and 3 pears make 5", "5", 1.0),  # no grouping across words
    (r"\boxed{12 500}", "12500", 1.0),  # one plain space: one number when it is the whole answer
    ("She has 2 100 dollar bills, so 200", "200", 1.0),  # ... but two numbers in running text
    ("She has 2 100 dollar bills.", "2100", 0.0),
    ("In total, the class collected 1 234 cans.", "1234", 1.0),  # one plain space in running text: one number
    ("After the growth, the population is 13 500.", "13500", 1.0),
    ("It weighs 2 500 g.", "2500", 1.0),
    ("It weighs 2 500 g.", "500", 0.0),
    ("She buys 2 100-page notebooks, so 200 pages.", "200", 1.0),  # ... unless the second names what is counted
    ("20% off, so the new price is 1.000,00 €.", "1000", 1.0),  # thousands grouped by dots, a decimal comma
    ("Der Preis beträgt 2.499,50 €.", "2499.5", 1.0),
    ("The city has 1.250.000 inhabitants.", "1250000", 1.0),  # two dot groups: thousands
    ("The city has 1.250.000 inhabitants.", "1.25", 0.0),
    ("Pi is about 3.141.", "3.141", 1.0),  # one dot group, no comma: a decimal point
)

ORDER = rows(
    (r"I first thought 23 but the answer is \boxed{24}", "23", 0.0),
    (r"I first thought 23 but the answer is \boxed{24}", "24", 1.0),
    (r"\boxed{23} is wrong; the answer is \boxed{24}", "23", 0.0),
    ("The answer is 23. Wait, no: 24.", "23", 0.0),
    ("The answer is 23. Wait, no: 24.", "24", 1.0),
    (r"So $p = \frac{3}{4}$, which gives 5 marbles", "3/4", 1.0),  # both stated (rule 5; 0.0 with strict: test_strict_reads_one_answer)
    (r"So $p = \frac{3}{4}$, which gives 5 marbles", "5", 1.0),
    ("<answer>23</answer> hmm <answer>24</answer>", "23", 0.0),
    ("#### 23\n#### 24", "23", 0.0),
    ("\u22123, or maybe 3", "-3", 0.0),
    ("\u22123, or maybe 3", "3", 0.0),  # a second answer offered: neither is the answer (results.hedges)
    ("\u22123, or maybe 3", "3", 1.0, "last_number"),
    ("23 is wrong, the answer is \u221223", "23", 0.0),
    (r"\$23, no: \$24", "23", 0.0),
    ("1 000 000, then 2", "1000000", 0.0),
    (r"I thought \frac{1}{2} but it is 0.75", "1/2", 0.0),
    (r"I thought \frac{1}{2} but it is 0.75", "0.75", 1.0),
    (r"I thought 0.75 but it is \frac{1}{2}", "1/2", 1.0),
)

# issue 21, defect 4: classes read wrong on completions no test had seen. The rule (grpo_cli/rewards/answers.py):
# marked answers, then the stated answer (after the last answer phrase; corrections replace it; later mentions do
# not), then a concluding clause's number, then the last number.
STATED = rows(
    ("Final answer: 42. Note that 40 would be wrong.", "42", 1.0),
    ("Final answer: 42. Note that 40 would be wrong.", "40", 0.0),
    ("The answer is 42. (We checked 6 jars of 7.)", "42", 1.0),
    ("The answer is 42, which is 2 more than 40.", "42", 1.0),
    ("So the answer is 42; the other candidate, 40, fails the check.", "42", 1.0),
    ("Answer: 42\n\nCheck: 6 x 7 = 42, and 6 x 6 = 36 is too small.", "42", 1.0),
    ("**Final Answer:** 42 marbles. Earlier I thought 36.", "42", 1.0),
    ("The answer is not 40 but 42.", "42", 1.0),
    ("The answer isn't 40; it is 42.", "42", 1.0),
    ("the answer to the question would be 42, since 6 jars hold 7 each", "42", 1.0),
    ("The answer is 23. Wait, no: 24.", "24", 1.0),  # a correction replaces it
    ("The answer is 23, or rather 24.", "24", 1.0),
    ("The answer is 23. Actually, I mis-added: it is 24.", "24", 1.0),
    ("The final answer is 23. Sorry, 25 - 1 = 24.", "24", 1.0),
    ("so 42 marbles fit in 6 jars", "42", 1.0),
    ("so 42 marbles fit in 6 jars", "6", 0.0),
    ("Each jar holds 7, so 42 marbles fill 6 jars.", "42", 1.0),
    ("Therefore 42 marbles, 7 in each of the 6 jars.", "42", 1.0),
    ("Thus the total is 42, which is 2 more than 40.", "42", 1.0),
    ("In total, 6 jars hold 42 marbles.", "42", 1.0),  # a link ("hold") says which number is the result
    ("So 5 apples and 3 apples make 8 apples.", "8", 1.0),
    ("20 + 8 = 28 wheels. Hmm, wait: bikes have 2 wheels, so 4 × 2 = 8, and yes, 28.", "28", 1.0),  # "yes,"
    ("20 + 8 = 28 wheels. Hmm, wait: bikes have 2 wheels, so 4 × 2 = 8, and yes, 28.", "8", 0.0),
    ("So far we have 3 apples; adding 5 gives 8.", "8", 1.0),  # "so far" is no conclusion
    ("Let's find the answer: first, 3 + 4 = 7, then 7 * 2 = 14.", "14", 1.0),  # the statement's result
    ("The answer is 7 because 3 + 5 = 8 minus 1.", "7", 1.0),
    ("So, after 2 hours, the train travels 120 km.", "120", 1.0),  # "after 2 hours" is context
    ("Thus in 6 jars we find 42 marbles.", "42", 1.0),
    ("In total, she spent $45 on 3 books.", "45", 1.0),
    ("Thus, she will have 10 - 4 = 6 apples left after giving 4 away.", "6", 1.0),
    ("The answer is 19. I hope this helps! Let me know if you have 2 more questions.", "19", 1.0),
    ("So 3 + 4 = 7. Then 7 * 2 = 14.", "14", 1.0),  # the conclusion must be in the last numbered sentence
    ("She had 9 and gave 3 away, so she kept 6 (half of 12).", "6", 1.0),
)

SCIENTIFIC = rows(
    ("The distance is 3.2e4 km.", "32000", 1.0),
    ("The distance is 3.2E4 km.", "32000", 1.0),
    ("So the concentration is 6E-3 mol/L.", "0.006", 1.0),
    ("The answer is 6e-3.", "0.006", 1.0),
    (r"\boxed{3.2e4}", "32000", 1.0),
    (r"The answer is $3.2 \times 10^{4}$.", "32000", 1.0),
    ("The answer is 3.2 × 10^4.", "32000", 1.0),
    ("It comes to 2.5 x 10^-3 seconds.", "0.0025", 1.0),
    ("#### -4.1e2", "-410", 1.0),
    ("The answer is 3.2e4.", "3.2", 0.0),  # not 3.2 and then 4
    ("The answer is 3.2e4.", "4", 0.0),
    ("The answer is 3.2e4.", "3.2e5", 0.0),
    ("The answer is 32000.", "3.2e4", 1.0),  # a reference written that way
)

WORDS = rows(
    ("The answer is five.", "5", 1.0),
    ("The answer is minus twelve.", "-12", 1.0),
    ("The answer is negative three.", "-3", 1.0),
    ("Final answer: twenty-one", "21", 1.0),
    ("The answer is one hundred and five.", "105", 1.0),
    ("The answer is two thousand three hundred.", "2300", 1.0),
    (r"\boxed{five}", "5", 1.0),
    ("<answer>seven</answer>", "7", 1.0),
    ("There are five apples in the basket.", "5", 1.0),  # no digit anywhere: the last number word
    ("So there are twelve.", "12", 1.0),
    ("The answer is five.", "6", 0.0),
    ("The answer is 42, the only one that works.", "42", 1.0),  # "one" after the number is no answer
    ("There are 42 apples in the one basket.", "42", 1.0),  # with digits, words are not numbers there
    ("The answer is five.", "five", 1.0),  # a reference in words
)

MIXED = rows(
    ("The answer is 3 3/4.", "3.75", 1.0),
    ("The answer is 3 3/4.", "15/4", 1.0),
    ("The answer is 3 3/4.", "9/4", 0.0),  # not 3 times 3/4
    ("She needs 3 3/4 cups.", "3.75", 1.0),
    (r"\boxed{2\frac{1}{2}}", "2.5", 1.0),
    (r"The answer is $2\frac{1}{2}$.", "5/2", 1.0),
    ("#### 1 1/2", "1.5", 1.0),
    ("The answer is -1 1/2.", "-1.5", 1.0),
    ("It takes 2 1/4 hours.", "2.25", 1.0),
    ("It takes 2 1/4 hours.", "2", 0.0),
    ("The answer is 3 3/4.", "3 3/4", 1.0),  # a reference written that way
)

TOLERANCE = rows(  # two different small numbers are different; a decimal close to a fraction is that fraction
    (r"\boxed{1e-9}", "3e-9", 0.0),
    (r"\boxed{0.000000001}", "0.000000003", 0.0),
    (r"\boxed{0.000001}", "0.000002", 0.0),
    (r"\boxed{1000000.5}", "1000001", 0.0),
    (r"\boxed{1000000}", "1000001", 0.0),
    (r"\boxed{0.3333333}", "1/3", 1.0),
    (r"\boxed{3.141593}", "3.14159265", 1.0),
    (r"\boxed{0.33}", "1/3", 0.0),
    (r"\boxed{1e-9}", "0.000000001", 1.0),
    (r"\boxed{12345678901234567891}", "12345678901234567890", 0.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
)

KEEP = rows(  # what worked before must keep working
    ("x = 3-5 = -2, done", "-2", 1.0),
    ("from 3-5", "5", 1.0, "last_number"),
    ("They paid $1,500 in total.", "1500", 1.0),
    ("so x equals 3/4", "0.75", 1.0),
    (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
    ("<answer>Paris</answer>", "paris", 1.0),
    ("<answer>Pairs</answer>", "Paris", 0.0),
    ("I am not sure.", "72", 0.0),
    ("#### 6 then 7", "6", 0.0),
    ("There are 4 ways to choose $k$.", "4", 1.0),
    ("the answer is 12 dollars", "12", 1.0),
    ("The scores are 98, 100 and 100.", "100", 1.0),
)

UNICODE = rows(  # digits and fractions in any Unicode form, read by what the Unicode database says they are
    ("Answer: \uff14\uff12", "42", 1.0),  # fullwidth digits
    ("The answer is \u0664\u0662.", "42", 1.0),  # Arabic-Indic digits
    ("The answer is \u096a\u0968.", "42", 1.0),  # Devanagari digits
    ("The probability is \u00bd.", "0.5", 1.0),  # a vulgar fraction
    ("So each gets \u00be of a pie.", "3/4", 1.0),
    ("That makes 1\u00bd cups.", "1.5", 1.0),  # a mixed number: 1 1/2, not 11/2
    ("That makes 2\u00bc cups.", "2.25", 1.0),
    ("\\boxed{3\u20444}", "0.75", 1.0),  # the fraction slash
    ("The answer is 7\u22158.", "0.875", 1.0),  # the division slash
    ("The probability is \u00bd.", "0.25", 0.0),
    ("x\u00b2 = 49, so x = 7.", "7", 1.0),  # a superscript is an exponent, not a digit of the answer
)

PERCENT = rows(  # a percentage is the number and its hundredth: "25%" answers 25 and 0.25
    ("The answer is 25%.", "0.25", 1.0),
    ("The answer is 25%.", "25", 1.0),
    ("It grew by 12.5 percent.", "0.125", 1.0),
    (r"\boxed{40\%}", "0.4", 1.0),
    ("The discount is 30 \uff05.", "30", 1.0),
    ("The answer is 25%.", "0.3", 0.0),
    ("The answer is 25%.", "2.5", 0.0),
    ("The answer is 0.25", "25%", 1.0),  # a reference written as a percentage
)

REMARKS = rows(  # numbers after the answer that comment on it do not count
    ("It costs 42 dollars, which is 8 dollars less than 50.", "42", 1.0),
    ("Each box holds 12 eggs, since 3 rows of 4 make 12.", "12", 1.0),
    ("The train takes 5 hours \u2014 2 more than the bus.", "5", 1.0),
    ("We get 42.\n\nNote: if the price were 5, it would be 35.", "42", 1.0),
    ("She has 18 stickers left.\n\nCheck: 30 - 12 = 18.", "18", 1.0),
    ("Total: 56 apples.\n\n**Verification:** 7 * 8 = 56, and 56 / 7 = 8.", "56", 1.0),
    ("The answer is 9.\n\nDouble-check: 3 * 3 = 9 and 81 / 9 = 9.", "9", 1.0),
    ("Note: work in metres.\n\nThe wall is 12 metres long.", "12", 1.0),  # a note before the answer is no remark
    ("It costs 42 dollars, which is 8 dollars less than 50.", "50", 0.0),
)

WORDS_AROUND_DIGITS = rows(  # what people write in words around or instead of digits
    ("The answer is minus 3.", "-3", 1.0),
    ("The answer is negative 3.", "-3", 1.0),
    ("The temperature is negative 12 degrees.", "-12", 1.0),
    ("The probability is one third.", "1/3", 1.0),
    ("The probability is one half.", "0.5", 1.0),
    ("Three quarters of the pie is left: the answer is three quarters.", "0.75", 1.0),
    ("It is two and a half.", "2.5", 1.0),
    ("nine twentieths", "9/20", 1.0),  # denominators past ten
    ("The answer is seven twelfths.", "7/12", 1.0),
    ("It is 3 hundredths of the total.", "0.03", 1.0),
    ("She ran 5 and a half miles.", "5.5", 1.0),
    ("It takes 2 1/2.", "2.5", 1.0),  # a mixed number that ends the sentence
    ("The city has 1.5 million people.", "1500000", 1.0),
    ("The answer is 3 thousand.", "3000", 1.0),
    ("It costs $1.5k.", "1500", 1.0),
    ("47 plus 18 is sixty-five.", "65", 1.0),  # number words right after a result link, digits before them
    ("The result of adding 47 and 18 is sixty five.", "65", 1.0),
    ("Half of them left, so 20 stayed.", "20", 1.0),  # "half" alone is no number
    ("One of the 3 boxes is empty.", "3", 1.0),
    ("The probability is one half.", "0.25", 0.0),
)

UNICODE_MATH = rows(  # math written in Unicode symbols: read as the LaTeX it stands for
    ("The area is 25\u03c0 square units.", r"25\pi", 1.0),
    ("The answer is \u221a2.", r"\sqrt{2}", 1.0),
    ("The quotient is 9 (58 = 6 × 9 + 4).", "9", 1.0),  # the math of an aside after the number stays in it
    ("The quotient is 9 (58 = 6 × 9 + 4).", "4", 0.0),
    ("The answer is \u221a2.", "2", 0.0),  # the root of 2, not 2
    ("So x = 2\u221a3.", r"2\sqrt{3}", 1.0),
    ("The side is \u221b27 = 3 cm.", "3", 1.0),
    ("For 350 km it needs 3.5 × 6 = 21 L of fuel.", "21", 1.0),  # a one-letter unit after the result is no variable
    ("It takes 2 × 3 = 6 h.", "6", 1.0),
    ("For 350 km it needs 3.5 × 6 = 20 L of fuel.", "21", 0.0),
    ("So 3x × 2 = 6x.", "6x", 1.0),  # a letter written onto the number stays a variable
    ("The answer is 6 \u00d7 10\u00b3.", "6000", 1.0),  # superscripts are a power
    ("The answer is 10\u00b2.", "100", 1.0),
    ("The answer is 10\u00b2", "10", 0.0),
    ("3 \u00d7 6 = 18 cookies", "18", 1.0),
    ("We get 12 \u00f7 4 = 3.", "3", 1.0),
    ("The angle is 90\u00b0.", "90", 1.0),
    ("The volume is 4/3 \u03c0 r\u00b3 = 36\u03c0 cm\u00b3.", r"36\pi", 1.0),  # a unit's power is no number
    ("The area is 25 m\u00b2.", "25", 1.0),
    ("The answer is \u00b13.", r"\pm 3", 1.0),
    ("x\u207b\u00b9 = 0.5, so x = 2", "2", 1.0),
)

TAILS = rows(  # a condition, cause or scope after the stated number is not the answer
    ("There are 10 legs in total if you have 10 shrimps and 13 crabs.", "10", 1.0),
    ("It takes 6 hours assuming 3 workers.", "6", 1.0),
    ("She will have $21 after saving for 3 weeks.", "21", 1.0),
    ("After giving away 3, he ends up with 27 marbles.", "27", 1.0),
    ("The trip takes 4 hours when both of the 2 cars drive.", "4", 1.0),
    ("She pays 3 \u00d7 $6 = $18 for 3 shirts.", "18", 1.0),  # the result, not the scope after it
    ("12 + 19 = 31 in 12 steps.", "31", 1.0),
    ("We add 6 and 8, which is 6 + 8 = 14.", "14", 1.0),  # a tail that computes what the sentence did not state
    ("The answer is 7 because 3 + 5 = 8 minus 1.", "7", 1.0),
    ("She earns $18 daily (9 eggs \u00d7 $2).", "18", 1.0),  # a parenthesis that ends the sentence
    ("The answer is 2 * (3 + 4) = 14", "14", 1.0),
    ("There are 21 marbles: 5 red, 7 blue and 9 green.", "21", 1.0),  # a breakdown after the stated number
    ("08:50 to 10:50 is 120 min, then 25 more min to 11:15: 145 min total.", "145", 1.0),  # one number: no breakdown
    ("The total is 9 hours, ending at 17:30: 540 minutes in all.", "540", 1.0),
    ("There are 20 marbles, 6 blue: probability 6/20, or 0.3.", "3/10", 1.0),  # a breakdown begins with its numbers
    ("In 2 minutes it prints 50 pages, and in 0.4 minutes 10 pages, for 60 pages.", "60", 1.0),  # a tail's total
    ("She read 20 pages on Monday and 30 on Tuesday, for 50 pages in all.", "50", 1.0),
    ("She read 20 pages on Monday and 30 on Tuesday, for 60 pages in all.", "30", 1.0),  # no total: the tail goes
    ("He bought 3 shirts for $60.", "3", 1.0),
    ("Step 2: 12 * 3 = 36", "36", 1.0),  # a label before a colon is not a stated number
    ("Each day she sells 9 eggs for $2 apiece, for a total of $18.", "18", 1.0),
    ("She needs 2 more cups, for a total of 5 cups.", "5", 1.0),
    ("The probability is 1/6 \u2248 0.167.", "1/6", 1.0),  # an approximation's exact side
    ("So $p \\approx 0.167$.", "0.167", 1.0),
    ("Distance = 18 × 2.33 ≈ 42 km", "42", 1.0),  # ... not when it is a computation of rounded inputs
    ("It costs 3 × 1.99 + 0.5 ≈ $6.47.", "6.47", 1.0),
    ("x = 25π ≈ 78.5", "25\\pi", 1.0),
    ("Janet has 16 - 3 - 4 = 9 eggs to sell, at two dollars each: she makes eighteen dollars.", "18", 1.0),
    ("We need 7 buses, since 6 buses only hold 6 \u00d7 40 = 240 < 250 students.", "7", 1.0),  # a reason computes
    ("The cost is $45.99 per month, or about $552 a year.", "45.99", 1.0),  # an approximate restatement
    ("There are 10 legs in total if you have 10 shrimps and 13 crabs.", "13", 0.0),
)

SPELLED = rows(  # number words read by text2num; ordinals and a lone "one" are not numbers unless stated
    ("So the total is one hundred and five.", "105", 1.0),
    ("The answer is two point five.", "2.5", 1.0),
    ("Three thousand two hundred people came.", "3200", 1.0),
    ("Two buses are needed, with 5 empty seats.", "2", 1.0),  # a lone "two" before a plural noun counts
    ("It takes him two weeks (14 days).", "14", 1.0),  # ... and a restatement in brackets is a result too
    ("Zero apples are left, since 4 were eaten.", "0", 1.0),
    ("One of the 2 boxes is empty.", "1", 0.0),  # a lone "one" stays a word
    ("So there are twenty-two and a half liters.", "22.5", 1.0),
    ("He finished fifth with 12 points.", "12", 1.0),
    ("On the fourth day she reads 30 pages.", "30", 1.0),
    ("So she has 30 pages left on the 4th day.", "30", 1.0),
    ("Only one of the 7 boys stayed, so 6 went home.", "6", 1.0),
    ("The answer is zero.", "0", 1.0),
    ("The answer is one.", "1", 1.0),
    ("The final answer is 1.2k.", "1200", 1.0),
    ("The prize is 3bn dollars.", "3000000000", 1.0),
    ("He ran 5 km.", "5000", 0.0),  # k of a unit is no thousand
)

STATED_EXPRESSIONS = rows(  # a stated answer that is no number: a choice or an expression in plain text
    ("The answer is (C).", "C", 1.0),
    ("Answer: B", "B", 1.0),
    ("The answer is C.", "D", 0.0),
    ("The answer is \\frac{\\pi}{2}.", r"\frac{\pi}{2}", 1.0),
    ("So the answer is 2x + 3.", "2x+3", 1.0),
    ("So the answer is 2x + 3.", "2", 0.0),
    ("The answer is x = 5.", "5", 1.0),
    ("The answer is (B) 12.", "12", 1.0),  # a choice's label, then its value
    ("The answer is (B) 12.", "B", 1.0),  # ... which answers a reference of one letter too
    ("B) 12", "B", 1.0),
    ("15% of 80 = 12\n\n**(B)** 12", "B", 1.0),
    ("B) 12", "C", 0.0),
    ("A) 10\nB) 12", "B", 0.0),  # a list of the choices
    ("The answer is 12 dollars.", "12", 1.0),
    ("The answer is .5", "0.5", 1.0),
    ("The answer is 3 and 1/2.", "3.5", 1.0),
    ("The distance is 3,5 km.", "3.5", 1.0),  # a decimal comma
    ("The distance is 1,234 km.", "1234", 1.0),
    ("It will be 11:30 when he arrives.", "11:30", 1.0),  # a time is one answer
    ("The ratio is 3:4.", "3:4", 1.0),
    ("She has 2 dozen eggs, which is 24 eggs.", "24", 1.0),
    ("I bought a dozen eggs.", "12", 1.0),
    ("The temperature is now \u22123 \u00b0C.", "-3", 1.0),  # the minus before the degree sign, C no variable
)

COMPOUND_QUANTITIES = rows(  # two numbers with units of one kind are one answer, worth as much in either unit (pint)
    ("The answer is 2 hours and 30 minutes.", "150", 1.0),
    ("The answer is 2 hours and 30 minutes.", "2.5", 1.0),
    ("The answer is 2 hours and 30 minutes.", "2", 0.0),
    ("It takes 1 hour 45 minutes.", "105", 1.0),
    ("He is 5 feet 6 inches tall.", "66", 1.0),
    ("Each glass holds a quarter litre, 250 millilitres.", "250", 1.0),  # a fraction's unit starts no compound
    ("Each glass holds 3/4 litre, 750 mL.", "750", 1.0),
    ("The remaining amount is 18 dollars and 50 cents.", "18.5", 1.0),
    ("That comes to 12 euros and 40 cents.", "12.40", 1.0),  # a currency and its cents
    ("It costs 250 rupees and 50 paise.", "250.5", 1.0),
    ("Her change was one dollar and sixty-five cents.", "1.65", 1.0),  # a lone "one" that starts a compound quantity
    ("It took one hour and 20 minutes.", "80", 1.0),
    ("The times are 2 hours, 3 hours and 4 hours.", "4", 1.0),  # a list, not one quantity
    ("She spent 2 hours on Monday and 30 minutes on Tuesday.", "30", 1.0),
    ("2 apples and 3 oranges", "3", 1.0),  # no units
)


# rule 4: a number that only scopes the stated one (the time it took, a purpose, where it came from or went to, the
# rate it came at), a share restated as its count, a comparison or a range after it; and where these do not apply
SCOPES = rows(
    ("The shop sells 48 cupcakes in 6 hours.", "48", 1.0),
    ("She saves $45 in 3 weeks.", "45", 1.0),
    ("He earns $120 in an 8-hour shift.", "120", 1.0),
    ("It goes 150 miles in 2.5 hours.", "150", 1.0),
    ("They planted 300 trees over 4 days.", "300", 1.0),
    ("The 4 workers finish in 5 days.", "5", 1.0),  # the number before is the subject: the time is the answer
    ("The train covers the 300 km in 2.5 hours.", "2.5", 1.0),  # "the 300 km" is given
    ("The water level drops by 2.5 cm each hour; after 4 hours it has dropped 10 cm.", "10", 1.0),
    ("He needs 7 more stamps to complete his collection of 50.", "7", 1.0),
    ("She needs 3 cups of flour to bake 24 cookies.", "3", 1.0),
    ("Multiply 3 by 4 to get 12.", "12", 1.0),  # "to get" gives the result
    ("We have 3 choices for the first digit and 4 for the second, giving 3 · 4 = 12 numbers.", "12", 1.0),
    ("She got $10 back from her $20 bill.", "10", 1.0),
    ("Sam gave away 12 marbles in total to his 3 friends.", "12", 1.0),
    ("Only 3 of the 12 eggs were broken.", "3", 1.0),
    ("By the end, 60 of the original 120 guests remained.", "60", 1.0),
    ("She spent 4 of the last 10 days at home.", "4", 1.0),
    ("He swims 40 lengths of the 25 m pool.", "40", 1.0),
    ("21 students passed, 75% of the 28.", "21", 1.0),
    ("She has 28 quarters, worth $7.", "28", 1.0),
    ("There are 4 quarters in a dollar, so $7 is 28 quarters.", "28", 1.0),  # coins counted, no fraction
    ("She ate three quarters of the pizza.", "3/4", 1.0),
    ("She ate 3 quarters of the pizza.", "3/4", 1.0),
    ("So 14 students play both sports, out of 30 in the class.", "14", 1.0),
    ("The trip takes 2.5 hours at 60 mph.", "2.5", 1.0),
    ("It would take 7 weeks to save $210 at $30 a week.", "7", 1.0),
    ("He left at 7:15 and arrived at 8:45.", "8:45", 1.0),
    ("In 2019 the school had 850 students; by 2023 it had 1,020, an increase of 170.", "170", 1.0),
    ("The original price was $60 and the sale price is $48, a saving of $12.", "12", 1.0),
    ("A square with side 7 cm has an area of 49 cm^2.", "49", 1.0),
    ("She drove 135 km in 3 hours, an average speed of 45 km/h.", "45", 1.0),
    ("The bill was $84 and they left a 15% tip, $12.60, for a total of $96.60.", "96.6", 1.0),
    ("The increase is 20%, from 850 to 1,020 students.", "20", 1.0),
    ("The population doubled from 2,500 to 5,000 in 10 years.", "5000", 1.0),
    ("40% of the students walk to school, which is 12 students.", "12", 1.0),
    ("She has 3/4 of a pizza left, which is 6 slices.", "6", 1.0),
    ("So 12 of the 30 students walk, which is 40%.", "12", 1.0),
    ("Ben has 12 stickers, 6 fewer than Amy.", "12", 1.0),
    ("He scored 42 points, 6 more than his average of 36.", "42", 1.0),
    ("The least number of coins is 4: a quarter, a dime, a nickel and a penny.", "4", 1.0),
    ("Janet has 16 - 3 - 4 = 9 eggs to sell, at two dollars each: she makes eighteen dollars.", "18", 1.0),
    ("The temperature is -7 °C, 15 degrees colder than in the morning.", "-7", 1.0),
    ("The tower is 120 m tall, 40 m taller than the church.", "120", 1.0),
    ("5 boxes hold 120 cans, 24 in each box.", "120", 1.0),
    ("They paid $60, $15 each.", "60", 1.0),
    ("After 8 weeks she can buy the bike, with $20 left over.", "8", 1.0),
    ("A = 100π ≈ 314.16, or 314 with π = 3.14.", "314", 1.0),  # a value assumed
    ("The area is 314 square units, using pi = 3.14.", "314", 1.0),
    ("The fall takes 3 s, taking g = 9.8 m/s².", "3", 1.0),
    ("The area is 314 square units, using pi = 3.14.", "3.14", 0.0),
    ("(n − 2)·180 with n = 8 gives 1080 degrees.", "1080", 1.0),  # a value substituted on the way to the result
    ("Substituting, 2r with r = 7 gives 14 cm.", "14", 1.0),
    ("The vertex is at x = 3, where y = -4.", "-4", 1.0),  # "where" states a value
    (r"$1234 \equiv 1 \pmod 9$", "1", 1.0),  # a congruence states its residue
    ("2^20 ≡ 4 (mod 7)", "4", 1.0),
    (r"$x \equiv 3 \pmod{5}$", "5", 0.0),
    ("It is now 75 m below sea level.", "-75", 1.0),  # below sea level: a sign
    ("The diver is 30 feet below sea level.", "-30", 1.0),
    ("It is 27 degrees below freezing.", "27", 1.0),  # below freezing is no sign
    ("The stock decreased by 15%.", "-15", 1.0),  # a negative change stated as a decrease of its size
    ("The company made a loss of $15,000 this year.", "-15000", 1.0),
    ("He is overdrawn by $25.", "-25", 1.0),
    ("The stock decreased by 15%.", "15", 1.0),
    ("The stock decreased by 12%.", "-15", 0.0),
    ("The price fell to 68.", "-68", 0.0),  # a value fallen to is no decrease
    ("It dropped by 7 points, or maybe 8.", "-7", 0.0),  # a hedge
    ("7 × 8 = 54, or maybe 56.", "56", 0.0),  # a final statement that offers a second answer
    ("100 − 37 = 73. Check: 73 + 37 = 110, hmm, so it's 63? I'm not sure.", "63", 0.0),  # ... or asks its own
    ("7 × 8 = 56. Does that make sense?", "56", 1.0),  # a closing question is no hedge
    # a closing paragraph of notes is not the final statement: its doubt is no hedge
    ("So 7 boxes hold 7 × 8 = 56 eggs.\n\nNote: a quick guess might say 54, or maybe 58?", "56", 1.0),
    ("I'm not sure, but I think the answer might be around 40.", "40", 1.0),  # nor is a doubt alone
    (r"7 × 8 = \boxed{56}, or maybe 54.", "56", 1.0),  # a marked answer never hedges
    (r"The change is \boxed{7}, a drop of 7.", "-7", 0.0),  # a marked answer is the only one
    ("She can fill 7 bags, with 3 apples to spare.", "7", 1.0),
    ("So, Lily needs 6 packs of 8 to get 48 hot dog buns.", "6", 1.0),
    ("He must buy 4 boxes to have 48 pencils.", "4", 1.0),
    ("Add 7 and 5 to get 12.", "12", 1.0),  # no need stated: "to get" gives the result
    ("The restaurant needs 54 chairs for its 9 tables.", "54", 1.0),
    ("The tree will be 7 feet tall in 3 years.", "7", 1.0),
    ("The tree grows 2 feet per year, reaching 11 feet after 5 years.", "11", 1.0),
    ("4 workers finish in 5 days.", "5", 1.0),  # the subject: the time is the answer
    ("The cyclist rides 18 km in 45 minutes, which is 24 km/h.", "24", 1.0),  # the rate of a quantity in a time
    ("She types 300 words in 5 minutes, which is 60 words per minute.", "60", 1.0),
    ("Together they have 4 + 7 + 9 = 20 marbles, and if they share them equally each gets 20 / 4 = 5.", "5", 1.0),
    ("So y = 6 if x = 3.", "6", 1.0),  # a condition, no consequence
    ("There are 12 cookies if you have 3 boxes of 4.", "12", 1.0),
)

# "N out of M" is a fraction where a chance is spoken of; a sentence that ends in an equation for an expression
CHANCES_AND_EQUATIONS = rows(
    ("The chance of drawing a green ball is 7 out of 20.", "7/20", 1.0),
    ("So the chance of drawing a king is one in 13.", "1/13", 1.0),  # "one" in a chance
    ("So the probability is one in four.", "1/4", 1.0),
    ("The probability is 3 out of 8.", "3/8", 1.0),
    ("7 out of 20 balls are green.", "7", 1.0),  # a count
    ("The line is y = 3x - 4.", "3x - 4", 1.0),
    ("Expanding gives 3x + 9, and subtracting 5 leaves 3x + 4.", "3x + 4", 1.0),  # an expression after a link
    ("Expanding gives 3x + 9, and subtracting 5 leaves 3x + 4.", "4", 0.0),
    ("Factoring gives (x - 2)(x + 3).", "(x - 2)(x + 3)", 1.0),
    ("The rope is 6 m.", "6", 1.0),  # a unit is no expression
    ("The speed is 6 m/s.", "6", 1.0),
    ("So f(x) = 2x + 1.", "2x + 1", 1.0),
    ("So y = 11.", "11", 1.0),
    ("Solving gives 2x = 18, so x = 9.", "9", 1.0),
    ("The chance is 1 in 6.", "1/6", 1.0),  # "N in M" where a chance is spoken of
    ("3 in 10", "3/10", 1.0),  # ... or as the whole answer
    ("Dividing both by 4 gives 3 to 4.", "3:4", 1.0),  # "N to M" after a link, ending the sentence: a ratio
    ("It simplifies to 2 to 5.", "2:5", 1.0),
    ("The simplified ratio is 2 : 5.", "2:5", 1.0),  # "N to M" and "N : M" where a ratio is spoken of
    ("The ratio of boys to girls is 12 to 16, or 3 to 4 in lowest terms.", "3:4", 1.0),
    ("Step 2 : 5 apples remain.", "5", 1.0),  # a spaced colon elsewhere is no ratio
    ("The ratio is 3 to 4.", "3:4", 1.0),
    ("It takes 3 to 4 hours.", "3:4", 0.0),
    ("It rose from 3 to 4.", "3:4", 0.0),
    ("3 out of 10.", "3/10", 1.0),
    ("3 out of 10.", "10", 0.0),
    ("There is a 1 in 4 chance of rain.", "1/4", 1.0),
    ("The odds of winning are 2 in 9.", "2/9", 1.0),
    ("The probability of a red card is 1 in 2.", "1/2", 1.0),
    ("The chance is 1 in 6.", "1", 0.0),
)

# a conclusion's total ("16 days in total") after the step that led to it; a rate over the stretch it holds for; a
# range that starts below zero
TOTALS_RATES_RANGES = rows(
    ("In 10 days she reads 250 pages, so she needs 6 more days: 16 days in total.", "16", 1.0),
    ("So he buys 3 more packs: 8 packs in all.", "8", 1.0),
    ("So they need 2 more buses, 5 buses altogether.", "5", 1.0),
    ("So he adds 3 marbles and has 12 in total.", "12", 1.0),
    ("So she needs 6 more days.", "6", 1.0),
    ("The car averages 60 kilometres per hour over the 150 km trip.", "60", 1.0),
    ("She types 45 words per minute for the 10-minute test.", "45", 1.0),
    ("The pump moves 12 litres a minute during the 30-minute run.", "12", 1.0),
    ("The trip takes 2.5 hours at 60 mph.", "2.5", 1.0),
    ("3 x $6 = $18 for 3 shirts.", "18", 1.0),
    ("The data set 3, 7, 7, 9, 12 has a median of 7.", "7", 1.0),  # "12 has a median": not a rate
    ("It rose 13 degrees, from -8 to 5.", "13", 1.0),
    ("It rose 13 degrees, from minus eight to five.", "13", 1.0),
    ("The temperature climbed 7°C, from −3°C to 4°C.", "7", 1.0),
    ("The temperature went from -8 to 5.", "5", 1.0),  # a range that is the statement itself: its end
)

# closing sentences that only check or compare what came before, while a number comes before them
CLOSING_COMMENTS = rows(
    ("She has $8 left.\n\n**Explanation:** She spent 3 × 4 = $12 of her $20.", "8", 1.0),  # a closing explanation
    ("It takes 6 days.\n\nReasoning: 2 workers do 1/3 of the job a day, and 2/3 ÷ 1/3 = 2, so 4 + 2 = 6.", "6", 1.0),
    ("He has 54 chairs. That's 9 more than last year.", "54", 1.0),
    ("It takes 50 / 2.5 = 20 min. Let me know if you'd like the time in seconds (1200 s).", "20", 1.0),  # an offer
    ("It takes 20 minutes. Would you like it in seconds too (1200 s)?", "1200", 0.0),
    ("The total is 45. Want me to split it among 3 people (15 each)?", "45", 1.0),
    ("5/5 is 75 L. The full capacity is 75 litres. (The tank still needs 30 L to be full.)", "75", 1.0),  # an aside
    ("5/5 is 75 L. The full capacity is 75 litres. (The tank still needs 30 L to be full.)", "30", 0.0),
    ("It costs $40 (tax included).", "40", 1.0),
    ("y = 4\n\nAlternatively, we might guess y = 5, which gives 17.", "4", 1.0),  # another way, after the answer
    ("So the speed is 80 km/h. Alternatively, 80 × 3 = 240 km checks it.", "80", 1.0),
    ("The area is 60 cm². Another way to see it: 6 rows of 10 squares.", "60", 1.0),
    ("Alternatively, x = 7.", "7", 1.0),  # ... where none comes before, it states the answer
    ("She runs 35 km a week. That's 10 km more than her brother.", "35", 1.0),
    ("The tower is 120 m tall. This is twice as tall as the church.", "120", 1.0),
    ("So x = 9. Check: 2(9) - 7 = 11. ✓", "9", 1.0),
    ("The average score is 84. Let me verify: 82 + 90 + 76 + 88 = 336, and 336 / 4 = 84.", "84", 1.0),
    ("So x = 9. Verification: 2 × 9 − 7 = 11, as required.", "9", 1.0),
    ("Check: 2 + 2 = 4", "4", 1.0),  # nothing before it: the check is the answer
    ("That's 9 more than last year.", "9", 1.0),
    ("First guess: 7. Check: 3 + 5 = 8, so <answer>8</answer>", "8", 1.0),  # a marked answer counts wherever it is
)

# a number a result link or "at" names after "of" ("gives an average of 84"); a count of things a stated number is
# for or on ("15 cups for 6 cakes"); a per-item restatement after "or" (", or 25¢ each"); a time from an event after
# the stated number (", 55 minutes after it left"); "left with"; a description after ", with"; a closing
# counterfactual: the stated number is the answer
NAMED_SCOPES_EACH = rows(
    ("The total is 336, and dividing by 4 tests gives an average of 84.", "84", 1.0),
    ("The total is 336, and dividing by 4 tests gives an average of 84, which is 2 points above 82.", "84", 1.0),
    ("Selling 40 cups at $2 brings in $80, which makes a profit of $30.", "30", 1.0),
    ("The sides are 12 and 5, so the rectangle has an area of 60.", "60", 1.0),
    ("Adding the 3 bonus points yields a final score of 91.", "91", 1.0),
    ("It had 1,020, an increase of 170.", "170", 1.0),
    ("Ana finished 3rd.", "3", 1.0),  # a place stated by an ordinal when nothing else answers
    ("She came third.", "3", 1.0),
    ("She came third.", "2", 0.0),
    ("It took a second.", "2", 0.0),  # a unit of time
    (r"She came third: \boxed{4}", "3", 0.0),  # a marked answer is the only one
    ("2.5M + 0.25M = 2.75M", "2750000", 1.0),  # a capital M: millions, or a unit's M
    ("2.5M + 0.25M = 2.75M", "2.75", 1.0),
    ("The city now has 2.4M residents.", "2400000", 1.0),  # ... before a noun
    ("The city now has 2.4M residents.", "2.4", 1.0),
    ("The population is 2.75m.", "2750000", 0.0),  # a small m is metres
    ("All five sides are 7 cm, for a perimeter of 35 cm.", "35", 1.0),  # "for a <name> of" names a result too
    ("The class has 28 students; 7 of them walk.", "7", 1.0),  # a number of a group, not named: unchanged
    ("You need 15 cups of flour for 6 cakes.", "15", 1.0),
    ("You need 15 cups of flour for six cakes.", "15", 1.0),
    ("It takes 5 hours for 2 workers.", "5", 1.0),
    ("She pays $18 for 3 shirts.", "18", 1.0),
    ("He uses 42 eggs for 7 omelettes.", "42", 1.0),
    ("He buys 4 packs for 12 dollars.", "12", 1.0),  # money after "for": the price, as before
    ("The tickets cost $3 for 2 people, so 6 people pay $9.", "9", 1.0),  # paying is a result link
    ("So 4 friends spend $36 in all.", "36", 1.0),
    ("He has $20 and pays $5 for lunch, so he has $15 left.", "15", 1.0),
    ("12 pencils: $3 total, or 25¢ each.", "3", 1.0),
    ("They cost $3 total, or $0.25 each.", "3", 1.0),
    ("It costs $3, or 25 cents each.", "3", 1.0),
    ("The 6 friends pay $48, or $8 apiece.", "48", 1.0),
    ("Each friend pays $8.", "8", 1.0),
    ("It travels at an average of 80 km/h over the 180 km.", "80", 1.0),  # "at" names it too
    ("The train moves at an average speed of 90 km/h over the 270 km.", "90", 1.0),
    ("The runner keeps a pace of 12 km/h for 2 hours.", "12", 1.0),
    ("The team scored 45 points with an average of 15 per game.", "45", 1.0),  # "with" names no result
    # a time from an event after the stated number
    ("Arrival time: 8:35, 55 minutes after it left.", "8:35", 1.0),
    ("The shop opens at 9:15, 45 minutes after the bakery.", "9:15", 1.0),
    ("She finishes on day 12, 3 days before the deadline.", "12", 1.0),
    ("The cake is ready at 4:50, 20 minutes later.", "4:50", 1.0),
    ("It left at 7:40 and arrived 55 minutes later.", "55", 1.0),  # no stated number before it: the statement
    # "left with" and "up with" state a result ("with" alone is context)
    ("After selling 28, he is left with 107 cows, which is 28 fewer than before.", "107", 1.0),
    ("After selling 28, he is left with 107 cows.", "107", 1.0),
    ("She ends up with 14 marbles after giving 6 away.", "14", 1.0),
    ("He was left with $35 after buying 3 books.", "35", 1.0),
    # a scope "on" a count of things, as "for" one
    ("It can go 250 km on 20 litres.", "250", 1.0),
    ("She spent $12 on 4 notebooks.", "12", 1.0),
    ("The printer prints 90 pages on 3 cartridges.", "90", 1.0),
    # a purpose that opens a clause after ";" is no tail of the number before it
    ("It currently holds 200 litres; to fill it, add 300 litres.", "300", 1.0),
    ("The jar has 12 cookies; to make 30, bake 18 more.", "18", 1.0),
    ("He needs 7 more stamps to complete his collection of 50.", "7", 1.0),
    # ", with" and a few words before a number describes the stated one
    ("The area is 72 square centimetres, with sides of 6 cm and 12 cm.", "72", 1.0),
    ("The perimeter is 36 cm, with a length of 12 cm.", "36", 1.0),
    # a closing counterfactual ("if ... had ..., would have") comments on the answer before it
    ("The total is $45. If they had bought only adult tickets, it would have cost $60.", "45", 1.0),
    ("She saves $360. Had she saved $50 a week, she would have had $450.", "360", 1.0),
    ("If she saves $40 a week, she will have $360 after 9 weeks.", "360", 1.0),  # no counterfactual: the statement
    ("It would take 16 days.", "16", 1.0),
)

# a decimal of three significant digits or more is the answer whose decimals never end, to its last digit
ROUNDINGS = rows(
    ("The probability is 0.333.", "1/3", 1.0),
    ("The probability is 0.667.", "2/3", 1.0),
    ("The probability is 0.666.", "2/3", 1.0),  # cut, not rounded
    ("The probability is 0.668.", "2/3", 0.0),
    ("The probability is 0.33.", "1/3", 0.0),  # two digits say too little
    ("The area is about 78.5 square units.", "25\\pi", 1.0),
    ("The area is 78.54.", "25\\pi", 1.0),
    ("The area is 78.6.", "25\\pi", 0.0),
    (r"\boxed{3.14}", "\\pi", 1.0),
    (r"\boxed{3.1}", "\\pi", 0.0),
    ("The diagonal is 1.414 m.", "\\sqrt{2}", 1.0),
    ("The answer is 12.46.", "12.5", 0.0),  # 12.5's decimals end: only 12.5 is it
    ("25π ≈ 78.5 cm²", "78.5", 1.0),  # a reference rounded, the answer exact
    (r"The area is $25\pi$.", "78.5", 1.0),
    (r"The area is $25\pi$.", "78.6", 0.0),
    ("The probability is 1/3.", "0.333", 1.0),
    ("The probability is 1/3.", "0.33", 0.0),
    ("The probability is 1/4.", "0.2500", 1.0),
    ("The probability is 1/4.", "0.251", 0.0),
    ("The answer is 0.2.", "1/4", 0.0),
    ("The answer is 142.857.", "1000/7", 1.0),
    ("The probability is 33.3%.", "1/3", 1.0),  # a percentage rounds as its hundredth: 0.333
    ("The chance is 66.7 percent.", "2/3", 1.0),
    ("The probability is 33.4%.", "1/3", 0.0),
    ("The probability is 33%.", "1/3", 0.0),  # two digits say too little, as for 0.33
    ("The probability is 1/3.", "33.3%", 1.0),
    ("It grew by 14.29%.", "1/7", 1.0),
    ("It grew by 14.3%.", "100/7", 1.0),  # read as 14.3, a rounding of 14.2857...
    ("The share is 12.5%.", "1/8", 1.0),
    ("The share is 12.4%.", "1/8", 0.0),  # 1/8's decimals end: only 12.5% is it
)


def _small_model_rows():
    """Completions SmolLM2-135M-Instruct wrote (`grpo eval base`, sampled), each with the answer a careful reader
    takes as its final one (`read_as`) and the problem's own answer: extraction must find the first, and the accuracy
    against the second is whether the model was right."""
    path = Path(__file__).parent / "data" / "smollm2_completions.jsonl"
    table = [json.loads(line) for line in path.read_text().splitlines()]
    return rows(*[(r["completion"], r["read_as"], 1.0) for r in table],
                *[(r["completion"], r["reference"], r["correct"]) for r in table])


SMALL_MODEL = _small_model_rows()

# an answer that only writes the computation ("\boxed{11 + 18}" for "What is 11 + 18?") does not answer a number:
# math-verify evaluates it, which paid a policy for restating the question
UNEVALUATED = rows(
    (r"\boxed{11 + 18}", "29", 0.0),
    ("<answer>11+18</answer>", "29", 0.0),
    ("#### 7 * 2", "14", 0.0),
    (r"\boxed{7 \times 2}", "14", 0.0),
    (r"\boxed{12 - 5}", "7", 0.0),
    (r"\boxed{(3 + 4) \cdot 2}", "14", 0.0),
    (r"\boxed{29}", "29", 1.0),
    (r"\boxed{-5}", "-5", 1.0),
    (r"\boxed{1.5 \times 10^{4}}", "15000", 1.0),  # scientific notation is a number
    (r"\boxed{2^{10}}", "1024", 1.0),  # a power is a closed form
    (r"\boxed{3/4}", "0.75", 1.0),  # a fraction too
    ("11 + 18 = 29", "29", 1.0),
    (r"\boxed{2 \times 3 = 6}", "6", 1.0),  # a computation with its result
    ("#### 5 + 3 = 8", "8", 1.0),
    (r"\boxed{1 + \sqrt{2}}", r"1 + \sqrt{2}", 1.0),  # a reference that is an expression itself
)

# a restating tail after an operation the sentence states without its result gives the result
OPERATION_TAILS = rows(
    ("To calculate 29 + 24, you simply add them together, which is 52.", "52", 1.0),  # SmolLM2's; read as 24 before
    ("We add 6 and 8, which is 14.", "14", 1.0),
    ("Multiply 13 by 9, which is 117.", "117", 1.0),
    ("The total is 29 + 24, which is 53.", "53", 1.0),
    ("The cost is 3 x 4, which is 12 dollars.", "12", 1.0),
    ("The box is 3 x 4 inches, which is 12 square inches.", "12", 1.0),
    ("She has 12 apples, which is 4 more than Tom.", "12", 1.0),  # a stated result: the tail compares
    ("29 + 24 is 53, which is odd.", "53", 1.0),
)

# a reference in lowest terms is not answered by the same fraction unreduced (numbers.unreduced)
LOWEST_TERMS = rows(
    ("Dividing top and bottom by 2 gives 9/12.", "3/4", 0.0),
    ("The fraction is 3/4.", "3/4", 1.0),
    (r"\boxed{\frac{9}{12}}", "3/4", 0.0),
    (r"\boxed{\frac{9}{12}}", r"\frac{3}{4}", 0.0),
    ("The answer is -6/8.", "-3/4", 0.0),
    ("P = 6/36", "1/6", 0.0),  # a probability left unreduced: some graders take it, this rule does not
    ("The answer is 12/2.", "6", 1.0),  # a whole number written as a fraction: any fraction worth it
    ("So the answer is 6/8.", "0.75", 1.0),  # a decimal reference says nothing of the form
    ("The answer is 0.75.", "3/4", 1.0),
    ("The answer is 2/12.", "2/12", 1.0),  # a reference unreduced itself
    ("The answer is 1/6.", "2/12", 1.0),
    ("1972/12937 = 3/11", "116/761", 0.0),  # an equation's left side is what it computes, not a result
    ("12/16 = 3/4", "3/4", 1.0),
    (r"So, $\frac{44280}{59850}\frac{1}{1}$ is equal to 1.", "492/665", 0.0),
)

# a time of day in words (notation.py's clock step)
CLOCK_TIMES = rows(
    ("The show starts at seven o'clock.", "7:00", 1.0),
    ("The show starts at seven o'clock.", "7", 1.0),  # "o" was read as a zero
    ("The show starts at 7 o’clock.", "7:00", 1.0),
    ("It arrives at quarter past twelve.", "12:15", 1.0),
    ("It arrives at quarter past twelve.", "12", 0.0),
    ("They meet at half past three.", "3:30", 1.0),
    ("The film ends at a quarter to one.", "12:45", 1.0),
    ("The bus comes at twenty-five past 6.", "6:25", 1.0),
    ("She wakes at twenty minutes past nine.", "9:20", 1.0),
    ("Leave at 10 minutes to 9.", "8:50", 1.0),
    ("The class ends at ten to four.", "3:50", 0.0),  # as often a score or a range: "ten to four" stays
    ("Between 5 to 7 people came.", "7", 1.0),  # a range, no time
    ("It is 5 past 3 now, so 8 remain.", "8", 1.0),
    ("She ran twenty past six laps.", "6", 1.0),  # before a plural noun: no time
    ("The meeting is at 07:30.", "7:30", 1.0),  # a time's leading zero
    ("It starts at 7:00.", "7", 1.0),  # a whole hour is its hour
    ("It starts at 7.", "7:00", 1.0),
    ("It starts at 7:05.", "7:50", 0.0),
    ("It starts at 7:30.", "7", 0.0),
    ("The time will be 10.15.", "10:15", 1.0),  # British English writes a time with a dot
    ("We land at 08.05 local time.", "8:05", 1.0),
    ("The time will be 10.15.", "10:16", 0.0),
    ("It weighs 10.15 kg.", "10.15", 1.0),  # a decimal beside a decimal stays a number
    ("It will be 10.75.", "10:45", 0.0),  # no time has 75 minutes
    ("The movie will end at 22:05.", "10:05", 1.0),  # a 24-hour time is the same time on a 12-hour clock
    ("It ends at 10:05 p.m.", "22:05", 1.0),
    ("The movie will end at 22:05.", "10:15", 0.0),
    ("The movie will end at 21:05.", "10:05", 0.0),
    ("1:50 PM + 2 h 15 min = 4:05 PM", "4:05 PM", 1.0),  # the half of the day said: a.m. / p.m.
    ("The train leaves at 9:40 p.m.", "9:40 PM", 1.0),
    ("It ends at 4:05 in the afternoon.", "4:05 PM", 1.0),  # a time without its half of the day is either
    ("The alarm rings at 6:30 am.", "6:30", 1.0),
    ("It ends at 4:05 AM.", "4:05 PM", 0.0),  # the wrong half
    ("It ends at 4:05 AM.", "16:05", 0.0),
    ("It ends at 4:05 p.m.", "16:05", 1.0),
    ("It ends at 4 pm.", "16:00", 1.0),
    ("It ends at 4 pm.", "4:00 AM", 0.0),
    ("It ends at 3:65 PM, i.e. 4:05 PM.", "4:05 PM", 1.0),
    (r"\boxed{4:05 \text{ PM}}", "4:05 PM", 1.0),
    ("Her pace is 5:30 per kilometre.", "5.5", 1.0),  # a duration on a clock's face: minutes and seconds
    ("The trip takes 2:15.", "2.25", 1.0),  # hours and minutes
    ("Her pace is 5:20 per kilometre.", "5.5", 0.0),
    ("It ends at 5:30 pm.", "5.5", 0.0),  # a time of day is no duration
    ("It will be 10.75.", "10:45", 0.0),  # (a reference on a clock's face is answered on one)
)

# markdown's bold and italics around an answer (notation.py's emphasis step)
EMPHASIS = rows(
    ("3. Boxes: 144 ÷ 12 = **12**", "12", 1.0),
    ("144 ÷ 12 = **12**", "144", 0.0),
    ("144 ÷ 12 = *12*", "12", 1.0),
    ("144 ÷ 12 = __12__", "12", 1.0),
    ("So 144 / 12 = **12** boxes.", "12", 1.0),
    ("**Answer:** 12", "12", 1.0),
    ("**Total: $12**", "12", 1.0),
    ("The *new* price is 15 after a *20%* cut, from 18.75.", "15", 1.0),
    ("2 * 3 * 4 = 24", "24", 1.0),  # a product keeps its stars
    ("2*3*4 = 24", "24", 1.0),
)

# a reference of words, where the completion marks no answer (words.py)
WORD_ANSWERS = rows(
    ("17 mod 7 = 3, and Monday + 3 days = Thursday.", "Thursday", 1.0),  # the last day of the week named
    ("It will be a Thursday.", "Thursday", 1.0),
    ("**Thursday**", "Thursday", 1.0),
    ("17 = 2 × 7 + 3, so it's Wednesday.", "Thursday", 0.0),
    ("So it is Wednesday, not Thursday.", "Thursday", 0.0),  # a negated name is no answer
    ("The answer is Thursday.", "Thursday", 1.0),  # an answer phrase's clause
    ("Answer: thursday", "Thursday", 1.0),
    ("The answer is Friday. Thursday was yesterday.", "Thursday", 0.0),
    ("Two months after January comes March.", "January", 0.0),  # the last month named
    ("The capital of France is Paris.", "Paris", 1.0),  # otherwise the final sentence names it
    ("It is the Pacific Ocean.", "the Pacific Ocean", 1.0),
    ("Paris is lovely. The capital is Lyon.", "Paris", 0.0),
    ("It is red or blue.", "red", 0.0),  # a hedge names no answer
    ("Yes, because 12 is divisible by 3.", "yes", 1.0),  # a verdict word that stands as an answer
    ("No, it isn't.", "yes", 0.0),
    ("No.", "No", 1.0),
    ("2034 is not divisible by 4, so no.", "no", 1.0),
    ("I have no idea what the answer could be.", "no", 0.0),  # "no" as a determiner is no verdict
    ("I have no idea.", "no", 0.0),
    ("No — 91 is divisible by 7.", "No", 1.0),  # a dash after the verdict ends its clause
    ("No-one knows.", "No", 0.0),
    ("Yes (57 = 3 × 19).", "Yes", 1.0),  # a parenthesis after the verdict ends its clause too
    ("No (91 = 7 × 13).", "No", 1.0),
    ("I have no (real) idea.", "No", 0.0),
    ("It is not true.", "true", 0.0),
    ("The statement is false, since 7 is prime.", "false", 1.0),
    (r"\boxed{Friday}", "Thursday", 0.0),  # a marked answer is the only answer
    ("Thursday", "Thursday", 0.0, "last_number"),  # mode auto's
)

# a completion cut off mid-statement (a rollout stopped at max_completion_length) states no answer by its last number
CUT_OFF = rows(
    ("The number of eggs found by Noah is 6 (the number of eggs he discovered). The number of eggs found by Ava is",
     "6", 0.0),  # SmolLM2's, sampled on gsm_symbolic: read as 6 before
    ("So she sells 9 eggs, and 9 × 2 =", "2", 0.0),
    ("So she sells 9 eggs, and 9 × 2 =", "9", 0.0),
    ("Noah has 6 eggs and Ava has 12, so the total of", "12", 0.0),
    ("The answer is 42. Let me check: 6 × 7 is", "42", 1.0),  # an answer phrase states it all the same
    (r"\boxed{18} because 9 × 2 =", "18", 1.0),  # as a marked answer does
    ("Monday + 3 days = Thursday, and then the", "Thursday", 0.0),
    ("She sells 9 × 2 = 18 dollars a day.", "18", 1.0),  # a finished sentence
    ("Total: 26. Here is how:", "26", 1.0),  # a colon ends no statement
)

CLASSES = {"escaped_dollar": DOLLAR, "unicode_minus": MINUS, "inline_latex": LATEX, "digit_grouping": GROUPING,
           "only_the_final_answer_counts": ORDER, "stated_answer_then_mentions": STATED,
           "scientific_notation": SCIENTIFIC, "number_words": WORDS, "mixed_numbers": MIXED,
           "numeric_tolerance": TOLERANCE, "kept_behaviour": KEEP, "unicode_numbers": UNICODE, "percentages": PERCENT,
           "remarks_after_the_answer": REMARKS, "words_around_digits": WORDS_AROUND_DIGITS,
           "unicode_math": UNICODE_MATH, "tails_after_the_answer": TAILS, "spelled_numbers": SPELLED,
           "stated_expressions": STATED_EXPRESSIONS, "compound_quantities": COMPOUND_QUANTITIES,
           "small_model_completions": SMALL_MODEL, "scopes_and_sources": SCOPES,
           "closing_comments": CLOSING_COMMENTS, "roundings": ROUNDINGS,
           "chances_and_equations": CHANCES_AND_EQUATIONS, "totals_rates_ranges": TOTALS_RATES_RANGES,
           "named_scopes_each": NAMED_SCOPES_EACH, "clock_times": CLOCK_TIMES,
           "lowest_terms": LOWEST_TERMS, "operation_tails": OPERATION_TAILS,
           "unevaluated": UNEVALUATED, "markdown_emphasis": EMPHASIS}

# rule 5 (grpo_cli/rewards/results.py): where no answer is marked, each result the final sentence states answers
RESULTS = rows(
    ("Ben pays $36 and Ana pays $48.", "36", 1.0),
    ("Ben pays $36 and Ana pays $48.", "48", 1.0),
    ("Ben pays $36 and Ana pays $48.", "84", 0.0),
    ("Perimeter: 96 cm; area: 576 cm².", "96", 1.0),
    ("Ann: 7, Tom: 12", "7", 1.0),
    ("There are 12 boys and 18 girls.", "12", 1.0),
    ("The jacket now costs $60, a saving of $20.", "60", 1.0),  # a result an appositive names
    ("The jacket now costs $60, a saving of $20.", "20", 1.0),
    ("The total is $4.75, so she gets $5.25 change from $10.", "4.75", 1.0),
    ("The total is $4.75, so she gets $5.25 change from $10.", "10", 0.0),  # after a preposition: context
    ("The temperature dropped to -4 degrees, 11 below noon's 7.", "-4", 1.0),
    ("The legs are 9 and 12, so the hypotenuse is 15 and the area is 54.", "15", 1.0),
    ("The legs are 9 and 12, so the hypotenuse is 15 and the area is 54.", "9", 0.0),  # a list: no result
    ("The area is 15 × 10 = 160 cm².", "15", 0.0),  # operands
    ("The area is 15 × 10 = 160 cm².", "10", 0.0),
    ("It fills in 16 minutes at 15 L/min.", "16", 1.0),  # a sentence of context only: each number
    ("The solutions are x = 3 and x = −2.", "3", 0.0),  # a list of candidates
    ("The integers are 32, 33 and 34.", "33", 0.0),
    (r"The solutions are $x = 2$ and $x = -3$.", "2", 0.0),  # ... in math spans too
    ("The sum of 12 and 15 is 28.", "15", 0.0),  # a number listed with one after a preposition is context too
    ("The addition of 2 and 5 results in 7.", "5", 0.0),  # ... and a result linked by "results in" is none
    ("The addition of 2 and 5 results in 7.", "7", 1.0),
    ("Mixing them results in 12 L, in 3 bottles.", "3", 0.0),
    # a final statement that names its answer states that one only
    ("The final answer to the arithmetic problem of 7 + 9 = 16 is 20, which is odd.", "16", 0.0),
    ("The final answer to the arithmetic problem of 7 + 9 = 16 is 20, which is odd.", "20", 1.0),
    ("Adding 5 and 2 gives 7, which is the final answer.", "5", 0.0),
    ("Adding 5 and 2 gives 7, which is the final answer.", "7", 1.0),
    ("12 + 4 = 16x.", "16", 0.0),  # a coefficient is no result (the quickstart's step 16 wrote it)
    ("The line is y = 3x - 4.", "3", 0.0),
    ("The cable is 5km long, and the pole 12m.", "5", 1.0),  # a unit written onto the number is one
    ("The product of 3, 4 and 5 is 61.", "5", 0.0),
    ("In June he saves $27, and $117 over the six months.", "27", 1.0),  # each with its own scope: no list
    ("He gets a 15% discount, paying $85 instead of $100.", "85", 1.0),  # "paying", "costing" link a result
    ("The set is on sale, costing $40 rather than $50.", "40", 1.0),
    ("After 8 weeks Sam will have $240, enough for the bike.", "8", 1.0),  # a time the sentence states is a result
    ("Sara saves $40 a week, so she has $360 after 9 weeks.", "9", 1.0),
    ("After 16 days she has read all 400 pages.", "16", 1.0),
    ("After 16 days she has read all 400 pages.", "400", 1.0),
    ("She reads 25 pages a day for 16 days.", "25", 1.0),
    ("After 2 hours the tank holds 90 litres.", "3", 0.0),
    ("He started with 20, and ended up with 35 after buying 15.", "20", 1.0),  # "started with" states
    ("He started with 20, and ended up with 35 after buying 15.", "15", 0.0),
    ("She started with 20 stamps and now has 35.", "35", 1.0),
    ("It holds 120 cm³, i.e. 0.12 litres.", "120", 1.0),  # "i.e." ends no sentence
    ("Each costs 2.50 dollars, e.g. 10 cost 25 dollars.", "2.50", 1.0),
    ("I think it's 24, but it could also be 26.", "24", 0.0),  # hedges
    ("It is 24 or 26.", "24", 0.0),
    ("Ben pays $48 and Ana pays $36? No, Ana pays $48.", "36", 0.0),
    ("There are 10 legs in total if you have 10 shrimps and 13 crabs.", "10", 1.0),  # a premise states none
    (r"Ben pays \boxed{48} and Ana pays $36.", "36", 0.0),  # a marked answer is the only answer
    ("The answer is 48. Ana pays $36.", "36", 0.0),  # as is a stated one
    ("Ben pays $36.\n\nNote: Ana pays $48.", "48", 0.0),  # a closing note is no statement
    ("A is 1, B is 2, C is 3, D is 4 and E is 5.", "1", 0.0),  # more than four results
    ("A is 1, B is 2, C is 3 and D is 4.", "1", 1.0),
    ("25 * 0.8 = 20\n\nThe shirt costs $20 on sale. That's a saving of $5!", "20", 1.0),  # a remark naming another
    ("25 * 0.8 = 20\n\nThe shirt costs $20 on sale. That's a saving of $5!", "5", 1.0),  # quantity of the one before
    ("The shirt costs $20 on sale. That's a saving of $5!", "25", 0.0),
    ("It costs $25. That's a discount of $5.", "20", 0.0),
    ("He has 12 red and 30 blue. This is a total of 42.", "42", 1.0),
    ("She ran 5 km. That is 2 km more than Ben.", "2", 0.0),  # a comparison stays a closing comment
    ("The 5 books cost $30. That's about $6 per book.", "30", 1.0),  # a rate of the stated number
    ("The 5 books cost $30. That's about $6 per book.", "6", 1.0),
    ("The 5 books cost $30. That's about $6 per book.", "5", 0.0),
    ("Width: 7 cm. (Area would be 77 cm².)", "7", 1.0),  # a parenthesised remark naming another quantity
    ("Width: 7 cm. (Area would be 77 cm².)", "77", 1.0),
    ("Width: 7 cm. (Area would be 77 cm².)", "11", 0.0),
    ("The width is 7 cm. (The area is 77 cm².)", "7", 1.0),
    ("It costs $25 in all. (Tax: $2.)", "25", 1.0),
    ("The answer is 7. (Area would be 77.)", "77", 0.0),  # a stated answer is the only answer
    ("Girls = 7/12 × 240 = 140 girls.\n\nBoys would then be 100.", "140", 1.0),  # "<name> would be N": a remark too
    ("Girls = 7/12 × 240 = 140 girls.\n\nBoys would then be 100.", "100", 1.0),
    ("Area = l·w = 12·5 = 60 cm². The perimeter would be 34 cm.", "60", 1.0),
    ("Area = l·w = 12·5 = 60 cm². The perimeter would be 34 cm.", "12", 0.0),
    ("There are 140 girls.\nBoys: 100.", "100", 1.0),
    ("- Peter: 100 stamps\n- Quinn: 50 stamps", "100", 1.0),  # a closing block of labelled lines states each
    ("- Peter: 100 stamps\n- Quinn: 50 stamps", "150", 0.0),
    ("x = 12, so 3x = 36.\n\nJerry: 12 marbles\nTom: 36 marbles", "12", 1.0),
    ("a + 2a = 27, a = 9. Ann: 2 × 9 = 18 stickers. Bo: 9 stickers.", "18", 1.0),  # labelled sentences, each
    ("a + 2a = 27, a = 9. Ann: 2 × 9 = 18 stickers. Bo: 9 stickers.", "27", 0.0),
    ("Cost: $7.35. Change: $2.65.", "7.35", 1.0),
    ("Subtotal: $40. Total: $46.", "40", 0.0),
    ("Length: 9 m. Area: 81 m².", "9", 1.0),  # a unit's power is no computation
    ("The film lasts 90 minutes, which is 5400 seconds or 1.5 hours.", "1.5", 1.0),  # one quantity in two units
    ("It is 24 m or 26 m.", "24", 0.0),  # ... not two
    ("It is 24 m or 26 km.", "24", 0.0),
    ("She ran 5 km. Ben: 3 km.", "5", 0.0),  # a sentence without a label is no labelled result
    ("Subtotal: $360\nTax: $54\nTotal: $414", "360", 0.0),  # ... unless a line labels the total
    ("Subtotal: $360\nTax: $54\nTotal: $414", "414", 1.0),
    ("1. Total boxes: 144 / 12 = 12\n2. Sold: 9\n3. Remaining: 12 - 9 = 3", "9", 0.0),  # steps compute
    ("50% of 800 = 400", "50", 0.0),  # a share of a number is an operand
    ("The total rose by 18, which is 30 percent of 60.", "30", 1.0),  # ... unless it restates a stated number
    ("The total rose by 18, which is 30 percent of 60.", "60", 0.0),
    ("The bill rose by $6, i.e. 20% of $30.", "20", 1.0),
    ("He saved $12, which is 3/4 of 16 = 12.", "3/4", 0.0),
    ("50% of 800 = 400", "400", 1.0),
    ("So 3/4 of 12 is 9.", "3/4", 0.0),
    ("40% of the class are boys.", "40", 1.0),
    ("3a + 10 = 40, a = 10. Oliver is 20.", "10", 1.0),  # the variable solved just before a plain final statement
    ("3a + 10 = 40, a = 10. Oliver is 20.", "20", 1.0),
    ("3a + 10 = 40, a = 10. Oliver is 20.", "40", 0.0),
    ("So 4x = 48. Tom has 36.", "48", 0.0),  # a multiple of it is no variable solved
    ("x = 5. So y = 2x - 3 = 7.", "5", 0.0),  # a final statement that computes states its own result
    ("Ben pays $36 and Ana pays $48.", "36", 0.0, "last_number"),  # rule 5 is mode auto's
)
CLASSES["stated_results"] = RESULTS
CLASSES["word_answers"] = WORD_ANSWERS
CLASSES["cut_off"] = CUT_OFF

# what frames a chat reply states nothing: sign-offs, markdown rules and quotes, emoji, curly apostrophes, spacing
FRAMING = rows(
    ("He has 54 chairs. That's 9 more than last year.\n\nHope this helps!", "54", 1.0),
    ("He has 54 chairs. That's 9 more than last year.\n\nHope this helps!", "9", 0.0),
    ("He has 54 chairs. That’s 9 more than last year.", "54", 1.0),  # a curly apostrophe
    ("Jerry: 12 marbles\nTom: 36 marbles\n\nThank you for the question!", "12", 1.0),
    ("3 in 10\n\nLet me know if you have any other questions.", "3/10", 1.0),
    ("The capital of Australia is Canberra.\n\nLet me know if you have any other questions.", "Canberra", 1.0),
    ("Mixing blue and yellow gives green. Good luck! Is there anything else I can help with?", "green", 1.0),
    ("So she sold 48 + 24 = 72 clips.\n\n---", "72", 1.0),  # a markdown rule is no operator
    ("So she sold 48 + 24 = 72 clips.\n\n***\n\nI hope this is correct.", "72", 1.0),
    ("> No — 91 is divisible by 7.", "No", 1.0),  # a blockquote
    ("> Jerry: 12 marbles\n> Tom: 36 marbles", "12", 1.0),
    ("62% of 1,250 kg remain, that is 775 kg. Let me verify: 475 + 775 = 1,250. ✓ 😊", "775", 1.0),
    ("The total is 1.5\u00a0×\u00a010⁴ dollars.", "15000", 1.0),  # a no-break space that groups no digits
    ("The  farmer  is  left  with  107  cows,  which  is  28  fewer  than  before.", "107", 1.0),
    ("The population is 13\u00a0500.", "13500", 1.0),  # ... one that does
    ("Thanks to 3 friends, the total is 12.", "12", 1.0),  # a sentence with a digit is no sign-off
    ("Thanks for asking! The capital is Canberra.", "Canberra", 1.0),  # ... nor one before the answer
    ("Both trains meet after 2 hours, 120 km from station A", "120", 1.0),  # a label is no article: not cut off
    ("Each side is 9 cm long, since all three sides are equal", "9", 1.0),  # "are equal" is no link
    ("The number of eggs found by Ava is a", "6", 0.0),  # cut off on an article
    ("Then 4 × 8 = 32, so 32 it is", "32", 1.0),  # "32 it is" ends a statement
    # a closing paragraph that holds no number, equation, math or answer phrase, after a number
    ("He has 54 chairs. That's 9 more than last year.\n\nP.S. This kind of problem is common in exams.", "54", 1.0),
    ("Jerry: 12 marbles\nTom: 36 marbles\n\nIn summary, that is the result.", "12", 1.0),
    ("Tom has 36 marbles.\n\nThe answer is the number of marbles Jerry has, eleven.", "11", 1.0),  # an answer phrase
    # bullets, the marks of a numbered list, code fences; "N in M" on a line of its own
    ("- 28 is the largest of the three.", "28", 1.0),
    ("1. That's 8 eggs.\n2. Let me double-check: 8 eggs / 12 cups = 2/3 egg per cup. ✓", "8", 1.0),
    ("1. Jerry: 12 marbles\n2. Tom: 36 marbles", "12", 1.0),
    ("```text\nHe has 54 chairs. That's 9 more than last year.\n```", "54", 1.0),
    ("## Solution\n\n3 in 10", "3/10", 1.0),
    ("It is 12.\n\n3 in 10", "3/10", 1.0),
    # a postscript is a note; a verdict ends its clause at a line's end; a choice's line comes before a closing note
    ("Canberra.\n\nP.S. This kind of problem is common in exams.", "Canberra", 1.0),
    ("It is 12.\n\nP.S. Sydney has 5 million people.", "12", 1.0),
    ("TRUE\n\n**Explanation:** the steps above show the work.", "True", 1.0),
    ("Is 91 prime? No\n91 = 7 × 13", "No", 1.0),
    ("B) 12\n\n**Explanation:** the steps above show the work.", "B", 1.0),
    # typography: full-width punctuation, an ellipsis, tabs, zero-width and thin spaces, headings' marks
    ("The farmer has 135 cows。After selling 28，he is left with 107 cows，which is 28 fewer than before。", "107", 1.0),
    ("Hour 1：600\nHour 2：1200\nHour 5：9600", "9600", 1.0),
    ("2，6，18，54，162", "162", 1.0),  # a list's comma, not thousands
    ("**答案是 1020。**", "1020", 1.0),
    ("Dividing both by 4 gives 3 to 4…", "3:4", 1.0),
    ("The\ttotal\tis\t1.5\t×\t10⁴\tdollars.", "15000", 1.0),
    ("He has 54 chairs. That's 9 more than last year.".replace(" ", " \u200b"), "54", 1.0),
    ("3\u2009in 10", "3/10", 1.0),
    ("Jerry: 12 marbles\n### Tom: 36 marbles", "12", 1.0),
    ("**Blue + yellow = green 🎨**", "green", 1.0),
    ("The answer is B!!!", "B", 1.0),
)
CLASSES["chat_framing"] = FRAMING

# a reference of several values, a tuple or a relation (structured.py); a choice's label alone or named as an option
SEVERAL = rows(
    ("(x - 1)(x - 4) = 0, so x = 1 or x = 4.", "1, 4", 1.0),  # a list: every value and no other, in any order
    ("The solutions are 1 and 4.", "1, 4", 1.0),
    ("Solutions: 4, 1", "1, 4", 1.0),
    ("x = 4", "1, 4", 0.0),
    ("x = -1, x = -4", "1, 4", 0.0),
    ("So x = 1, 4 or 5.", "1, 4", 0.0),
    ("The vertex is at (3, -2).", "(3, -2)", 1.0),  # a tuple: each value in its place
    ("So P(3, -2).", "(3, -2)", 1.0),
    ("(-2, 3)", "(3, -2)", 0.0),
    ("3x - 1 > 8, so x > 3.", "x > 3", 1.0),  # a relation, letter first
    ("3 < x", "x > 3", 1.0),
    ("2x > 10, so x > 5…", "x > 5", 1.0),  # an ellipsis ends it
    ("x ≥ 3", "x >= 3", 1.0),
    ("x < 3", "x > 3", 0.0),
    ("x ≥ 3", "x > 3", 0.0),
    ("C", "C", 1.0),
    ("**(C)**", "C", 1.0),
    ("36, which is option C.", "C", 1.0),
    ("36, which is option D.", "C", 0.0),
    ("169 = 13 × 13 ∴ Yes", "Yes", 1.0),  # "∴" concludes a verdict
    ("169 = 13 × 13 ∴ No", "Yes", 0.0),
)
CLASSES["several_values"] = SEVERAL

# an answer stated first, then the two givens it came from (opening.py)
OPENING = rows(
    ("24 cookies. Mia baked 3 trays of 8.", "24", 1.0),
    ("24 cookies. Mia baked 3 trays of 8.", "8", 0.0),
    ("Nine. Of the 20 chairs, 11 are broken.", "9", 1.0),
    ("Sure! Here it is.\n\n24 cookies. Mia baked 3 trays of 8.", "24", 1.0),  # after a preamble
    ("```text\n24 cookies. Mia baked 3 trays of 8.\n```", "24", 1.0),
    ("$2.25. Split the $9 among the 4 friends.", "2.25", 1.0),
    ("60 m². A room of 10 m by 6 m.", "60", 1.0),
    ("Each week: $30. Over 4 weeks: $120.", "120", 1.0),  # a labelled step is no opening answer
    ("12 per box. 3 boxes hold 36.", "36", 1.0),  # ... nor one a result link goes on from
    ("Start: 90\nSold: 35\nLeft: 55", "55", 1.0),
    ("He saves $25 a week. After 8 weeks he has $200, enough for the $180 bike.", "200", 1.0),  # ... nor more givens
    ("7 rows. Each row has 6 seats, 42 seats in all.", "42", 1.0),
)
CLASSES["opening_answer"] = OPENING


@pytest.mark.parametrize("completion, reference", [
    (r"So $p = \frac{3}{4}$, which gives 5 marbles", "3/4"),
    ("Ben pays $36 and Ana pays $48.", "36"),
    ("The jacket now costs $60, a saving of $20.", "60"),
    ("The total is $4.75, so she gets $5.25 change from $10.", "4.75"),
])
def test_strict_reads_one_answer(completion, reference):
    """`strict=True` reads only `extract_answer`'s answer: another result stated beside it scores 0."""
    assert accuracy([completion], [reference]) == [1.0]
    assert accuracy([completion], [reference], strict=True) == [0.0]


@pytest.mark.parametrize("completion, reference, expected, mode", [
    pytest.param(*p.values, id=f"{name}-{p.id}") for name, table in CLASSES.items() for p in table
])
def test_accuracy_table(completion, reference, expected, mode):
    assert accuracy([completion], [reference], mode=mode) == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"So the answer is $\frac{3}{4}$.", r"\frac{3}{4}"),  # the fraction, not its last number
        (r"hence $p = \frac{3}{4}$", r"\frac{3}{4}"),  # the right-hand side of the last =
        ("The answer is \u22123.", "-3"),
        (r"\boxed{\$23}", "23"),
        (r"There are 1\,000\,000 grains.", "1000000"),
        ("There are 4 ways to choose $k$.", "4"),  # a math span without the last number is not the answer
        ("P(sum = 7) = 1/6 ≈ 0.167", "1/6"),  # a run of math begins after the words' parenthesis
        ("P(X = 2) = 3/8 ≈ 0.375", "3/8"),
        ("Area(ABC) = 6 × 4 / 2 = 12", "12"),
        ("P(7) = 1/6 ≈ 0.167", "1/6"),
        ("162 (×3 each time)", "162"),  # ... and ends before a parenthesis it opens and does not close
        ("All five sides are 7 cm, for a perimeter of 35 cm.", "35"),  # "for a <name> of" names the result
        ("It is 20 (× 2 for both is 40)", "20"),
        ("2,748 ≈ 2,700", "2,700"),  # a plain number's approximation is its rounding
        ("72 ÷ 3.6 = 20 m/s", "20"),  # a unit of one-letter parts after a computed result is no variable
        ("12 × 0.5 = 6 g/L", "6"),
        ("Rounded: 3.14159 ≈ 3.14", "3.14"),
        ("It simplifies to 4 times the square root of 3.", r"4\sqrt{3}"),  # roots in words or as a function
        ("The answer is 4sqrt(3).", r"4\sqrt{3}"),
        ("x = sqrt(48) = 4*sqrt(3)", r"4\sqrt{3}"),
        ("The cube root of 64 is 4.", "4"),
        ("r = sqrt(2) / 2", r"\sqrt{2} / 2"),
        # a conclusion before a semicolon concludes its own clause: the clause after it, with a number, states anew
        ("5 parts = 350 g, so 1 part = 70 g; you need 2 parts of sugar: 140 g.", "140"),
        ("So she saves $30 a week; in 8 weeks she saves $240.", "240"),
        ("Thus each part is 70 g; sugar is 2 parts, or 140 g.", "140"),
        ("So the width is 6 cm; the length is 12 cm.", "12"),
        ("So x = 5; check: 3(5) - 2 = 13", "13"),  # a check in the same sentence: as before (rule 3 read 13 too)
        # a breakdown after a colon is counted before a parenthesis that closes the sentence
        ("One part is 70 g, and sugar is 2 parts: 140 g (490 g of mixture in all).", "140"),
        ("There are 21 marbles: 5 red, 7 blue and 9 green (3 of them big).", "21"),
    ],
)
def test_extracted_text(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Final answer: 42. Note that 40 would be wrong.", "42"),
        ("so 42 marbles fit in 6 jars", "42"),
        ("The answer is 23. Wait, no: 24.", "24"),
        ("The distance is 3.2e4 km.", "3.2e4"),
        ("The answer is minus twelve.", "-12"),
        ("There are five apples.", "5"),
        ("She needs 3 3/4 cups.", "3 3/4"),
        (r"The answer is $3.2 \times 10^{4}$.", r"3.2 \times 10^{4}"),
    ],
)
def test_extracted_text_of_the_new_classes(text, expected):
    assert extract_answer(text) == expected


def test_plain_numbers_are_read_exactly():
    from fractions import Fraction

    from grpo_cli.rewards.spelled import words_value
    from grpo_cli.rewards.numbers import numbers_match, read_number

    assert [read_number(t) for t in ("1,234.5", "-3.2e4", "6E-3", r"3.2 \times 10^{4}", "1.5 x 10^-3", "3/4",
                                     r"\dfrac34", r"\frac{-3}{4}", "3 3/4", r"2\frac{1}{2}", "-1 1/2", "five",
                                     "minus twelve", "$0.5$", "{7}")] == [
        Fraction(2469, 2), -32000, Fraction(3, 500), 32000, Fraction(3, 2000), Fraction(3, 4), Fraction(3, 4),
        Fraction(-3, 4), Fraction(15, 4), Fraction(5, 2), Fraction(-3, 2), 5, -12, Fraction(1, 2), 7]
    assert [read_number(t) for t in (r"\sqrt{2}", "3 4", "x", "1e400", "3/0", "3 5/4", "five apples", "")] == [None] * 8
    assert [words_value(t) for t in ("twenty-one", "one hundred and five", "two thousand three hundred",
                                     "negative nine", "one million two hundred thousand", "and", "zero")] == [
        21, 105, 2300, -9, 1200000, None, 0]
    assert numbers_match(Fraction(1, 3), Fraction("0.3333333")) and not numbers_match(Fraction(1, 3), Fraction("0.33"))
    assert not numbers_match(Fraction("1e-9"), Fraction("3e-9")) and not numbers_match(Fraction(10**6), Fraction(10**6 + 1))


def test_answers_match_cleans_both_sides():
    assert answers_match("\u22123", "-3") and not answers_match("-3", "3")
    assert answers_match(r"\$1\,000", "1000") and answers_match("1 000 000", r"1{,}000{,}000")
    assert answers_match("4:05 PM", "4:05 p.m.") and answers_match("4:05 PM", "16:05")
    assert answers_match("4:05 PM", "4:05")  # a time without its half of the day is either
    assert not answers_match("4:05 PM", "4:05 AM") and not answers_match("12:30 AM", "12:30 PM")


# --------------------------------------------------------------------------- maj@k


def test_majority_groups_equivalent_answers():
    # "3/4", "0.75" and "\frac{3}{4}" are one vote of 3 against two "1"s; the first seen text names it
    assert majority_answer(["1", "3/4", "0.75", "1", r"\frac{3}{4}"]) == "3/4"
    # 1 == 1.0 (2 votes) ties 1,000 == 1000 (2 votes): the first seen wins
    assert majority_answer(["2", "1", "1.0", "1,000", "1000"]) == "1"
    assert majority_answer(["-3", "\u22123", "3"]) == "-3"  # the Unicode minus is a minus
    assert majority_answer([None, r"\$23", "23", "24"]) == "23"
    assert majority_answer([None, None]) is None


def test_majority_exact_integers():
    # 2^53 + 1 is not a float: the old vote merged it with 2^53 and returned "9007199254740992"
    assert 2**53 + 1 == 9007199254740993 and float(9007199254740993) == float(9007199254740992)
    assert majority_answer(["9007199254740992", "9007199254740993", "9007199254740993"]) == "9007199254740993"
    assert normalize_answer("12345678901234567891") == "12345678901234567891"
    assert normalize_answer("12,345,678,901,234,567,891.0") == "12345678901234567891"
    assert normalize_answer("1e400") == "1e400"  # no 400-digit integers from a typo


def _sample(i, extracted, answer, correct):
    return {"index": i, "kind": "sample", "sample": 0, "answer": answer, "extracted": extracted, "correct": correct,
            "rewards": None, "length": 1, "truncated": False}


def test_maj_at_k_scores_unanimous_big_integers_and_equivalent_forms():
    big = "12345678901234567891"
    samples = [_sample(0, big, big, True) for _ in range(4)]
    # problem 1: "0.75", "3/4" (one vote of 2 by equivalence) against "1" (1 vote) and "2" -> 3/4 wins, correct
    samples += [_sample(1, x, r"\frac{3}{4}", x != "1" and x != "2") for x in ("0.75", "1", "3/4", "2")]
    m = summarize(samples, 4)
    assert m["maj@4"] == 1.0 and m["maj@1"] == 1.0
    # maj@2 of problem 1: "0.75" vs "1", a tie -> the first seen, correct
    assert m["maj@2"] == 1.0
    assert math.isclose(m["pass@1"], (4 / 4 + 2 / 4) / 2)
