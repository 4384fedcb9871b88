"""How often `grpo`'s built-in accuracy agrees with a careful grader, against math-verify (issue 39 item 5).

Each set in bench/data/answers_*.jsonl holds completions written to read like models' answers to word problems,
each with its problem's reference answer and a grader's verdict (1: the completion's final answer is the
reference). `grpo` scores with the `accuracy` reward (mode auto); math-verify parses the whole completion and
verifies it against the reference, as TRL's accuracy reward does. A set measures the rule only while it was not
used to change it: set1 was written before the day's changes and then used to fix five of its misses (15cfb3e), set2
was written after 15cfb3e and used to fix two (723ffd7). From set3 on, each set was written before any of its misses
were looked at, measured, then used to fix some: set3 to set6 before 8bf2ffb (on rules between 13b29c6 and 8bf2ffb
that were never committed; bench/RESULTS.md gives each count), set7 before c007f5a, set8 before d16a24e, set9 before
the commit after it, set10 on 868f539 before the commit after it, set11 on e3ba026 likewise, set12 on a7ad9b1, set13 on
eea4910, set14 on d53facb, and from set15 on each with its problems' questions (which the bench does not read): set15
on ef6ab47, set16 on d5aed69, set17 on 87496d7, set18 on 31314d1, set19 on d0cfb0c, set20 on 09c134b, set21 on ca50514,
set22 on a0d03d9, set23 on 24f6b90, set24 on 33c02c6, set25 on 5e7f6a8, set26 on 3831973, set27 on 8a80830,
set28 on 333b8ac, set29 on 5046c06, set30 on 5046c06, set31 on 55e0c58, set32 on 55e0c58, set33 on d3c35f9,
set34 on d3c35f9, set35 on eff48c9, set36 on eff48c9,
set37 on db6bbb8, set38 on db6bbb8, set39 on b00e68a, set40 on b00e68a,
set41 on 5291fbd, set42 on 5291fbd,
set43 on 3123854 and set44 on 20b2109 (completions SmolLM2-135M-Instruct sampled, graded by hand), set45 on
768b103, set46 on 16b49a0, set47 on dec8b53, set48 on
f75d530, set49 and set50 on 19e8298, set51 and set52 on
f6054d4, set53 on 72a7a21 (SmolLM2-135M-Instruct's samples, graded by hand), set54
and set55 on 03fa961, set56 and set57 on 2cb09ca,
set58 and set59 on 3fc9027, set60 and set61 on 8312d7f,
set62 on 974ffdc (SmolLM2-135M-Instruct's samples, graded by hand), set63 and set64 on
8b22c46, set65 and set66 on 93559cf, set67 and set68 on 36709a3, set69 and
set70 on 35c1284 (SmolLM2-135M-Instruct's samples, graded by hand), set71 and set72 on 633bc5a,
set73 on 7d39862 (SmolLM2-135M-Instruct's samples, graded by hand), set74 and set75 on 0bf49af, set76 and set77 on 31bdd7b (SmolLM2-135M-Instruct's
samples, graded by hand), set78 on 31bdd7b, set79 and set80 on 4337b00, set81 and set82 on 0339aa1, set83 and set84 on 8eb6b38, set85 on 4b134af, set86 on 563a419.
FRESH_FOR names the commits each set can measure.

    .venv/bin/python bench/answer_agreement.py [--show]     # --show: each disagreement

With PYTHONPATH=<a checkout of another commit> it measures that commit's rule on the same sets.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRESH_FOR = {"set1": "18cadd7 and 7f9b8d4", "set2": "18cadd7 and 15cfb3e", "set3": "13b29c6", "set4": "13b29c6",
             "set5": "13b29c6", "set6": "13b29c6", "set7": "8bf2ffb", "set8": "c007f5a", "set9": "d16a24e",
             "set10": "868f539", "set11": "e3ba026", "set12": "a7ad9b1", "set13": "eea4910", "set14": "d53facb",
             "set15": "ef6ab47", "set16": "d5aed69", "set17": "87496d7", "set18": "31314d1", "set19": "d0cfb0c",
             "set20": "09c134b", "set21": "ca50514", "set22": "a0d03d9",
             "set23": "24f6b90", "set24": "33c02c6", "set25": "5e7f6a8", "set26": "3831973", "set27": "8a80830",
             "set28": "333b8ac", "set29": "5046c06", "set30": "5046c06",
             "set31": "55e0c58", "set32": "55e0c58",
             "set33": "d3c35f9", "set34": "d3c35f9",
             "set35": "eff48c9", "set36": "eff48c9",
             "set37": "db6bbb8", "set38": "db6bbb8",
             "set39": "b00e68a", "set40": "b00e68a",
             "set41": "5291fbd", "set42": "5291fbd",
             "set43": "3123854", "set44": "20b2109", "set45": "768b103",
             "set46": "16b49a0", "set47": "dec8b53",
             "set48": "f75d530", "set49": "19e8298", "set50": "19e8298",
             "set51": "f6054d4", "set52": "f6054d4",
             "set53": "72a7a21", "set54": "03fa961", "set55": "03fa961",
             "set56": "2cb09ca", "set57": "2cb09ca",
             "set58": "3fc9027", "set59": "3fc9027",
             "set60": "8312d7f", "set61": "8312d7f",
             "set62": "974ffdc", "set63": "8b22c46", "set64": "8b22c46",
             "set65": "93559cf", "set66": "93559cf",
             "set67": "36709a3", "set68": "36709a3",
             "set69": "35c1284", "set70": "35c1284",
             "set71": "633bc5a", "set72": "633bc5a", "set73": "7d39862",
             "set74": "0bf49af", "set75": "0bf49af",
             "set76": "31bdd7b", "set77": "31bdd7b", "set78": "31bdd7b",
             "set79": "4337b00", "set80": "4337b00",
             "set81": "0339aa1", "set82": "0339aa1",
             "set83": "8eb6b38", "set84": "8eb6b38",
             "set85": "4b134af", "set86": "563a419"}


def math_verify_agrees(completion: str, reference: str) -> bool:
    from math_verify import parse, verify

    predicted = parse(completion)
    return bool(predicted) and bool(verify(parse(reference), predicted))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", action="store_true")
    a = ap.parse_args()
    from grpo_cli.rewards import extract_answer
    from grpo_cli.rewards.builtin import accuracy

    rows, totals = ["| set | completions | grpo agrees | math-verify agrees | fresh for |", "|---|---|---|---|---|"], [0, 0, 0]
    for path in sorted((ROOT / "bench/data").glob("answers_*.jsonl")):
        name = path.stem.removeprefix("answers_")
        items = [json.loads(line) for line in path.read_text().splitlines()]
        ours = mv = 0
        for it in items:
            got = accuracy([it["completion"]], [it["reference"]])[0]
            ours += got == it["grader"]
            mv += math_verify_agrees(it["completion"], it["reference"]) == bool(it["grader"])
            if a.show and got != it["grader"]:
                print(f"{name}: grader {it['grader']}, grpo reads {extract_answer(it['completion'])!r} against "
                      f"{it['reference']!r}: {it['completion'][-140:]!r}")
        rows.append(f"| {name} | {len(items)} | {ours} | {mv} | {FRESH_FOR.get(name, '?')} |")
        totals = [totals[0] + len(items), totals[1] + ours, totals[2] + mv]
    print("\n".join(rows))
    print(f"grpo agrees with the grader on {totals[1]} of {totals[0]}, math-verify on {totals[2]}")


if __name__ == "__main__":
    main()
