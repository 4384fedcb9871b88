"""Step-level rewards (process supervision, DeepSeekMath sec. 4.1.3): what such a reward returns, checked,
and the token offsets it can map its steps with.

A reward with `level: step` in the recipe returns, per completion, a list of (token_index, reward) pairs, one
per reasoning step: token_index is the index in `completion_ids` of the step's last token, reward a float or
None (no reward for that step); or None for a completion without steps. It is called like any reward, plus
`completion_offsets`: per completion, the end of each token in the completion's text (character offsets of
`completions[i]`), so a step found in the text maps to its last token with `token_at(offsets, end)`.
"""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Any

from grpo_cli.errors import RewardError

Steps = list[tuple[int, float | None]]


def token_end_offsets(tokenizer: Any, completion_ids: list[list[int]]) -> list[list[int]]:
    """Per completion, where each token's text ends in the decoded completion (special tokens skipped)."""
    out = []
    for ids in completion_ids:
        ends, last = [], 0
        for k in range(len(ids)):
            last = max(last, len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)))
            ends.append(last)
        out.append(ends)
    return out


def token_at(offsets: list[int], end: int) -> int:
    """The index of the token whose text covers character `end - 1` (the last character of a span ending at `end`)."""
    return min(bisect.bisect_left(offsets, end), len(offsets) - 1)


def step_mean(steps: Steps | None) -> float | None:
    """A completion's mean step reward (what rewards/<name>/mean logs), None without rewarded steps."""
    given = [r for _, r in steps or [] if r is not None]
    return sum(given) / len(given) if given else None


def check_steps(log_name: str, out: Any, lengths: list[int], skip: bool) -> tuple[list[Steps | None], int]:
    """A step-level reward's result -> per completion its steps (None: none), and how many NaN/inf rewards were
    turned into None (`skip`; RewardError without). Anything else malformed raises RewardError naming it."""
    n = len(lengths)
    if not isinstance(out, (list, tuple)) or len(out) != n:
        raise RewardError(f"step reward {log_name!r} must return a list of {n} entries (one per completion: a list of "
                          f"(token_index, reward) pairs, or None); got {type(out).__name__} of length "
                          f"{len(out) if isinstance(out, (list, tuple)) else '-'}")
    result: list[Steps | None] = []
    nonfinite = 0
    for i, steps in enumerate(out):
        if steps is None:
            result.append(None)
            continue
        if not isinstance(steps, (list, tuple)):
            raise RewardError(f"step reward {log_name!r} returned a {type(steps).__name__} for completion {i}; "
                              "expected a list of (token_index, reward) pairs or None")
        checked: Steps = []
        for pair in steps:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], numbers.Integral)
                    and not isinstance(pair[0], bool)):
                raise RewardError(f"step reward {log_name!r}: completion {i} has step {pair!r}; expected "
                                  "(token_index: int, reward: float or None)")
            t, r = int(pair[0]), pair[1]
            if not 0 <= t < lengths[i]:
                raise RewardError(f"step reward {log_name!r}: completion {i} has a step ending at token {t}, outside "
                                  f"its {lengths[i]} tokens (token_index counts from 0 in completion_ids)")
            if r is not None:
                if not isinstance(r, numbers.Real) or isinstance(r, bool):
                    raise RewardError(f"step reward {log_name!r}: completion {i}, step at token {t} has reward "
                                      f"{r!r}; expected a float or None")
                if not math.isfinite(float(r)):
                    if not skip:
                        raise RewardError(f"step reward {log_name!r} returned {float(r)} for a step of completion {i}; "
                                          "return None for a step without reward, or set on_error: skip")
                    nonfinite += 1
                    r = None
                else:
                    r = float(r)
            checked.append((t, r))
        result.append(checked)
    return result, nonfinite
