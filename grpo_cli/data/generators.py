"""Offline problem generators for `data.generator`: rows with "prompt" and "answer" columns, made from a seed.

`GENERATORS` maps a name to fn(n: int, seed: int, **kwargs) -> list[dict]. Importing this module must not
import torch, transformers or datasets: the recipe validator reads `GENERATORS` from it.
"""

from __future__ import annotations

import math
import operator
import random
from fractions import Fraction
from typing import Any, Callable

from grpo_cli.data import gym
from grpo_cli.errors import DataError
from grpo_cli.registry import Registry

# fn(n: int, seed: int, **kwargs) -> list[dict] with "prompt" and "answer" keys (+ any others)
GENERATORS: Registry[Callable[..., list[dict[str, Any]]]] = Registry("data generator")

_OPS: dict[str, Callable[[Any, Any], Any]] = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


@GENERATORS.register("arithmetic")
def arithmetic(
    n: int,
    seed: int,
    ops: list[str] | str = ("+",),
    min_value: int = 0,
    max_value: int = 99,
    num_operands: int = 2,
) -> list[dict[str, Any]]:
    """"What is 23 + 48?" problems with integer answers. Columns: prompt, answer, expression (Python syntax).

    Operands lie in [min_value, max_value] and the usual precedence applies. Every "/" divides
    exactly; in a chain like "a * b / c" with no divisor of a * b in range, that "/" becomes "*".
    """
    ops = list(ops)
    if not ops or any(o not in _OPS for o in ops):
        raise ValueError(f"ops must be a non-empty list drawn from {list(_OPS)}, got {ops}")
    if min_value > max_value:
        raise ValueError(f"min_value ({min_value}) must be <= max_value ({max_value})")
    if num_operands < 2:
        raise ValueError(f"num_operands must be >= 2, got {num_operands}")
    if "/" in ops and min_value == max_value == 0:
        raise ValueError("'/' needs a non-zero value in [min_value, max_value]")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        operands, chosen = _arithmetic_problem(rng, ops, min_value, max_value, num_operands)
        expression = _format_expression(operands, chosen)
        value = _evaluate(operands, chosen)
        assert value.denominator == 1, expression  # every division is exact by construction
        rows.append({"prompt": f"What is {expression}?", "answer": str(value.numerator), "expression": expression})
    return rows


def _arithmetic_problem(
    rng: random.Random, ops: list[str], lo: int, hi: int, k: int
) -> tuple[list[int], list[str]]:
    """Operands and operators, left to right; a "/" gets a divisor of the running product of its term."""
    chosen = [rng.choice(ops) for _ in range(k - 1)]
    operands = [rng.randint(lo, hi)]
    term = operands[0]  # value of the current * / chain (Python precedence: * and / bind first)
    term_start = 0
    for i, op in enumerate(chosen, start=1):
        if op in "+-":
            operands.append(rng.randint(lo, hi))
            term, term_start = operands[-1], i
        elif op == "*":
            operands.append(rng.randint(lo, hi))
            term *= operands[-1]
        elif i - 1 == term_start:
            # "a / d" at the start of a term: pick d, then redraw a as a multiple of d within range
            d, q = _divisor_and_quotient(rng, lo, hi)
            operands[-1] = d * q
            operands.append(d)
            term = q
        else:
            fits = [s * d for d in _divisors(term) for s in (1, -1) if lo <= s * d <= hi and d != 0]
            if fits:
                d = rng.choice(fits)
                term //= d
            else:  # no divisor of the term in range (e.g. the range excludes 1): multiply instead
                chosen[i - 1], d = "*", rng.randint(lo, hi)
                term *= d
            operands.append(d)
    return operands, chosen


def _divisor_and_quotient(rng: random.Random, lo: int, hi: int) -> tuple[int, int]:
    """A random non-zero d in [lo, hi] and q with d * q in [lo, hi]; avoids d = 1, q = 0 and q = 1 if it can."""
    fallback = None
    for attempt in range(2000):
        d = rng.randint(lo, hi)
        if d == 0:
            continue
        a, b = sorted((lo / d, hi / d))
        qmin, qmax = math.ceil(a), math.floor(b)
        if qmin > qmax:
            continue
        q = rng.randint(qmin, qmax)
        if d != 1 and q not in (0, 1):
            return d, q
        fallback = fallback or (d, q)
    if fallback is None:
        raise ValueError(f"no exact division has both operands in [{lo}, {hi}]")
    return fallback


def _divisors(v: int) -> list[int]:
    v = abs(v)
    if v == 0:
        return [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # 0 / d == 0 for any d
    small = [d for d in range(1, int(v**0.5) + 1) if v % d == 0]
    return sorted(set(small + [v // d for d in small]))


def _format_expression(operands: list[int], ops: list[str]) -> str:
    parts = [str(operands[0])]
    for op, x in zip(ops, operands[1:]):
        parts += [op, f"({x})" if x < 0 else str(x)]
    return " ".join(parts)


def _evaluate(operands: list[int], ops: list[str]) -> Fraction:
    """Exact value with the usual precedence (* and / before + and -)."""
    terms, term = [], Fraction(operands[0])
    signs = [1]
    for op, x in zip(ops, operands[1:]):
        if op in "+-":
            terms.append(term)
            signs.append(1 if op == "+" else -1)
            term = Fraction(x)
        else:
            term = _OPS[op](term, Fraction(x))
    terms.append(term)
    return sum((s * t for s, t in zip(signs, terms)), Fraction(0))


@GENERATORS.register("blank")
def blank(n: int, seed: int) -> list[dict[str, Any]]:
    """Rows whose prompt is empty, for an environment that owns its data: its reset() writes each prompt (the
    default data of a recipe with rollout.environment and no data section; TRL's placeholder dataset)."""
    return [{"prompt": ""} for _ in range(n)]


@GENERATORS.register("verifiers")
def verifiers_tasks(n: int, seed: int, taskset: str, taskset_config: dict | None = None) -> list[dict[str, Any]]:
    """A verifiers taskset's tasks, one row each: {"task": index, "prompt": text} (`rollout.agent: verifiers:...`
    runs them; data/tasksets.py)."""
    from grpo_cli.data.tasksets import task_rows

    try:
        return task_rows(n, seed, taskset, taskset_config)
    except ValueError as e:
        raise DataError(f"data.generator 'verifiers': {e}") from None


@GENERATORS.register("reasoning_gym")
def reasoning_gym_problems(n: int, seed: int, task: str | list[str] | dict[str, Any] = "basic_arithmetic",
                           **kwargs: Any) -> list[dict[str, Any]]:
    """Problems from reasoning-gym (`pip install reasoning-gym`): one task (task=gsm_symbolic | basic_arithmetic |
    chain_sum ..., extra kwargs are its settings) or a mix (`task: {chain_sum: {weight: 2, min_terms: 3}, lcm: {}}`).

    Columns: prompt, answer, task, metadata (JSON) and the row's place (task_config, task_seed, task_size,
    task_index), from which the reward `reasoning_gym` rebuilds the entry its task's own scorer reads (data/gym.py).
    """
    return gym.problems(n, seed, task, **kwargs)
