"""Does `accuracy` keep its verdict when a completion is framed as chat models frame it (issue 39 item 5)?

The graded sets of bench/answer_agreement.py hold completions written one way each. A chat model writes the same
answer with a sign-off after it ("Hope this helps!"), a markdown rule or a code fence around it, a blockquote, a
bulleted or numbered list, emoji, curly apostrophes, no-break spaces, a preamble ("Sure! Let's solve this step by
step."), a closing paragraph that states nothing ("P.S. ...", "In summary, that is the result."). None of these
changes what a careful grader reads as the answer, so none may change the verdict. For every completion the rule
already agrees on, each framing below is applied alone and the verdict read again; the table counts the completions
whose verdict changed.

    .venv/bin/python bench/answer_robustness.py [--show N]     # --show: the first N changed completions a framing

A framing that changes many verdicts is a class of phrasings the rule has not learnt; each fix goes in as a rule
with rows in tests/rewards/test_answers.py, never as a case of this bench.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lines(c: str, mark) -> str:
    return "\n".join(mark(k, line) for k, line in enumerate(c.split("\n"), 1))


def _numbered(c: str) -> str:
    lines = [line for line in c.split("\n") if line.strip()]
    return "\n".join(f"{k}. {line}" for k, line in enumerate(lines, 1)) if len(lines) > 1 else c


FRAMINGS = {
    "sign-off: Hope this helps!": lambda c: c.rstrip() + "\n\nHope this helps!",
    "sign-off: Let me know if ...": lambda c: c.rstrip() + "\n\nLet me know if you have any other questions.",
    "sign-off: Thank you ...": lambda c: c.rstrip() + "\n\nThank you for the question!",
    "sign-off: Good luck ...": lambda c: c.rstrip() + "\n\nGood luck with your studies!",
    "sign-off: I hope this is correct.": lambda c: c.rstrip() + "\n\nI hope this is correct.",
    "sign-off: Is there anything else ...?": lambda c: c.rstrip() + "\n\nIs there anything else I can help you with?",
    "closing paragraph: P.S. ...": lambda c: c.rstrip() + "\n\nP.S. This kind of problem is common in exams.",
    "closing paragraph: In summary ...": lambda c: c.rstrip() + "\n\nIn summary, that is the result.",
    "closing paragraph: **Explanation:** ...":
        lambda c: c.rstrip() + "\n\n**Explanation:** the steps above show the work.",
    "preamble: Sure! ...": lambda c: "Sure! Let's solve this step by step.\n\n" + c,
    "preamble: ## Solution": lambda c: "## Solution\n\n" + c,
    "preamble: a think block": lambda c: "<think>\nLet me work through it carefully.\n</think>\n\n" + c,
    "markdown rule after": lambda c: c.rstrip() + "\n\n---",
    "code fence around": lambda c: "```text\n" + c.rstrip() + "\n```",
    "blockquote": lambda c: _lines(c, lambda k, line: "> " + line),
    "bullet on the last line": lambda c: (lambda ls: "\n".join(ls[:-1] + ["- " + ls[-1]]))(c.rstrip().split("\n")),
    "numbered list": _numbered,
    "indented lines": lambda c: _lines(c, lambda k, line: "  " + line),
    "emoji after": lambda c: c.rstrip() + " 😊",
    "curly apostrophes": lambda c: c.replace("'", "\u2019"),
    "no-break spaces": lambda c: c.replace(" ", "\u00a0"),
    "double spaces": lambda c: c.replace(" ", "  "),
    "CRLF line ends": lambda c: c.replace("\n", "\r\n"),
    "tabs for spaces": lambda c: c.replace(" ", "\t"),
    "zero-width spaces": lambda c: c.replace(" ", " \u200b"),
    "thin spaces before units": lambda c: re.sub(r"(\d) ([a-zA-Z])", "\\1\u2009\\2", c),
    "full-width . , :": lambda c: re.sub(r"\.(\s|$)", "\u3002\\1", c).replace(", ", "\uff0c").replace(": ", "\uff1a"),
    "heading on the last line": lambda c: (lambda ls: "\n".join(ls[:-1] + ["### " + ls[-1].strip()]))(
        c.rstrip().split("\n")),
    "… for the final period": lambda c: re.sub(r"\.\s*$", "…", c.rstrip()),
    "no final period": lambda c: re.sub(r"\.\s*$", "", c.rstrip()),
    "! for the final period": lambda c: re.sub(r"\.\s*$", "!", c.rstrip()),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    from grpo_cli.rewards.builtin import accuracy

    rows = [json.loads(line) for f in sorted((ROOT / "bench" / "data").glob("answers_set*.jsonl"))
            for line in f.read_text().splitlines()]
    completions, references = [r["completion"] for r in rows], [r["reference"] for r in rows]
    verdicts = accuracy(completions, references)
    agreed = [i for i, r in enumerate(rows) if verdicts[i] == r["grader"]]
    print(f"{len(agreed)} of {len(rows)} graded completions agree with the grader; each framing is applied to those\n")
    print("| framing | verdicts changed |\n|---|---|")
    kept = total = 0
    for name, frame in FRAMINGS.items():
        framed = accuracy([frame(completions[i]) for i in agreed], [references[i] for i in agreed])
        changed = [i for i, v in zip(agreed, framed) if v != rows[i]["grader"]]
        print(f"| {name} | {len(changed)} |")
        for i in changed[: a.show]:
            print(f"|   | grader {rows[i]['grader']}, reference {references[i]!r}: {frame(completions[i])[-120:]!r} |")
        kept, total = kept + len(agreed) - len(changed), total + len(agreed)
    print(f"\nverdicts kept under {len(FRAMINGS)} framings: {kept} of {total} ({100 * kept / total:.2f}%)")


if __name__ == "__main__":
    main()
