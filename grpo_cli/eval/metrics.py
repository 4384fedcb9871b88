"""`grpo eval`'s metrics from its per-completion records: accuracy, pass@k (the unbiased estimator of Chen et al.
2021, arXiv:2107.03374), maj@k (a majority vote over answers grouped by mathematical equivalence), reward means,
format compliance, lengths."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product, stable for large n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def normalize_answer(answer: str) -> str:
    """Canonical text for voting: numbers exactly as numbers (1,000 == 1000.0 == 1000; no float, so
    2**53 + 1 stays itself), dashes/dollars/digit groups cleaned as for accuracy, other text stripped."""
    from decimal import Decimal, InvalidOperation

    from grpo_cli.rewards.notation import clean_answer

    text = clean_answer(answer).strip().rstrip(".").strip()
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return text
    if not value.is_finite() or abs(value.adjusted()) > 100:  # "1e400" is not worth 400 digits
        return text
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def majority_answer(answers: list[str | None], match: Callable[[str, str], bool] | None = None) -> str | None:
    """Most common extracted answer, votes grouped by mathematical equivalence (`answers_match`:
    "3/4", "0.75" and "\\frac{3}{4}" are one vote); ties: the group seen first; None if nothing was
    extracted. Returns the group's first normalised text. Equal normalised texts are one vote without
    asking math-verify, so u distinct texts cost at most u*(u-1)/2 `match` calls (pass a cached one)."""
    if match is None:
        from grpo_cli.rewards import answers_match as match
    groups: list[list[Any]] = []  # [first text, votes], in order of first appearance
    for text, votes in Counter(normalize_answer(a) for a in answers if a is not None).items():
        group = next((g for g in groups if g[0] == text or match(g[0], text)), None)
        if group is None:
            groups.append([text, votes])
        else:
            group[1] += votes
    return max(groups, key=lambda g: g[1])[0] if groups else None  # max keeps the first of equals


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [k for k in (2**i for i in range(int(math.log2(n)) + 1)) if k <= n]
    return ks if ks[-1] == n else ks + [n]


def summarize(samples: list[dict[str, Any]], n: int) -> dict[str, float]:
    """Metrics from the per-completion records of evaluate_model."""
    greedy = [s for s in samples if s["kind"] == "greedy"]
    m: dict[str, float] = {"num_problems": float(len(greedy))}
    m["accuracy"] = sum(s["correct"] for s in greedy) / max(len(greedy), 1)
    for name in greedy[0]["rewards"] if greedy else []:
        vals = [s["rewards"][name] for s in greedy if s["rewards"][name] is not None]
        m[f"rewards/{name}/mean"] = sum(vals) / len(vals) if vals else float("nan")
    m["format_compliance"] = sum(s["extracted"] is not None for s in greedy) / max(len(greedy), 1)
    m["completions/mean_length"] = sum(s["length"] for s in greedy) / max(len(greedy), 1)
    m["completions/clipped_ratio"] = sum(s["truncated"] for s in greedy) / max(len(greedy), 1)
    if n > 1:
        by_problem: dict[int, list[dict[str, Any]]] = {}
        for s in samples:
            if s["kind"] == "sample":
                by_problem.setdefault(s["index"], []).append(s)
        matchers = {i: _cached_match() for i in by_problem}  # one cache per problem, shared by its k's
        for k in k_values(n):
            m[f"pass@{k}"] = sum(pass_at_k(n, sum(x["correct"] for x in xs), k) for xs in by_problem.values()) / len(by_problem)
            votes = [_majority_correct(xs[:k], matchers[i]) for i, xs in by_problem.items()]
            m[f"maj@{k}"] = sum(votes) / len(by_problem)
    return m


def _cached_match() -> Callable[[str, str], bool]:
    from functools import cache

    from grpo_cli.rewards import answers_match

    return cache(answers_match)


def _majority_correct(xs: list[dict[str, Any]], match: Callable[[str, str], bool] | None = None) -> bool:
    """The majority answer of xs (grouped by equivalence) matches the reference."""
    match = match or _cached_match()
    winner = majority_answer([x["extracted"] for x in xs], match)
    return bool(winner is not None and xs[0]["answer"] is not None and match(xs[0]["answer"], winner))
