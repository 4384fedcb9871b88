"""Built-in reward functions, registered in `REWARDS` by name.

Every function follows the TRL calling convention: it is called with keyword arguments only
(`prompts`, `completions`, `completion_ids`, every dataset column such as `answer`, and the
recipe's `kwargs`), accepts and ignores the ones it does not need (`**_`), and returns one
float, or None for "no reward", per completion.

  accuracy                   final answer vs reference with math-verify (DeepSeekMath / Open-R1 style;
                             extraction and equivalence live in answers.py)
  format                     whole completion matches a regex (DeepSeek-R1 format reward)
  tag_count                  partial credit for well-formed <think>/<answer> tags (Open-R1)
  soft_overlong_punishment   DAPO length penalty, arXiv:2503.14476 eq. 13
  repetition_penalty         n-gram repetition penalty, arXiv:2502.03373 (as in Open-R1)
  arithmetic_steps           step-level (level: step): every "a op b = c" in the completion is a step,
                             1 if it is correct, else 0 (process supervision on the arithmetic data)
  reasoning_gym              a reasoning-gym task's own score_answer (data.generator: reasoning_gym)
  judge                      an LLM judge over an OpenAI-compatible endpoint, pointwise or group-wise (judges.py)

Importing this module must not import torch or math-verify (`grpo validate` stays fast).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from typing import Any

from grpo_cli.data import gym
from grpo_cli.rewards.judges import JudgeSettings, judge_for, judge_settings
from grpo_cli.registry import Registry
from grpo_cli.rewards.answers import EXTRACT_MODES, extract_answer  # noqa: F401
from grpo_cli.rewards.marks import reference_text
from grpo_cli.rewards.numbers import answers_match
from grpo_cli.rewards.results import hedges, stated_place, stated_results, states_decrease
from grpo_cli.rewards.steps import token_at
from grpo_cli.rewards.structured import states_several
from grpo_cli.rewards.words import states_choice, states_words, word_reference

REWARDS: Registry[Callable[..., list[float | None]]] = Registry("reward")

# --------------------------------------------------------------------------- rewards


@REWARDS.register("accuracy")
def accuracy(
    completions: list[str], answer: Sequence[Any] | None = None, *, mode: str = "auto", tag: str = "answer",
    strict: bool = False, **_: Any
) -> list[float | None]:
    """1.0 if the completion's final answer equals the reference `answer` column, else 0.0.

    The rule-based accuracy reward of DeepSeekMath (arXiv:2402.03300) / DeepSeek-R1, with
    equivalence decided by math-verify as in Open-R1's `accuracy_reward`. The answer is taken with
    `extract_answer(completion, mode, tag)`; in mode `auto`, unless `strict`, a completion that marks no answer is
    also right when the reference is one of the results its final sentence states ("Ben pays $36 and Ana pays $48",
    results.py) or a negative reference its final sentence states as a decrease ("a loss of $15,000" for -15000),
    and wrong when that sentence offers a second answer or asks its own ("54, or maybe 56", "so it's 63?"); a
    reference of words ("Thursday", "Paris") is read as words.py says, and one of several values, a tuple or a
    relation ("2, 3", "(5, 7)", "x > 4") as structured.py says. No extractable answer scores 0.0; a missing
    reference (None) gives None (no reward for that row).
    """
    if answer is None:
        raise ValueError(
            "reward 'accuracy' needs the reference answers: set data.answer_column to the dataset's answer column"
        )
    if mode not in EXTRACT_MODES:
        raise ValueError(f"reward 'accuracy': unknown mode {mode!r}; valid: {', '.join(EXTRACT_MODES)}")
    rewards: list[float | None] = []
    for completion, ref in zip(completions, answer, strict=True):
        gold = reference_text(ref)
        if gold is None:
            rewards.append(None)
            continue
        predicted = extract_answer(completion, mode, tag)
        rewards.append(1.0 if _right(completion, gold, predicted, mode == "auto", strict, tag) else 0.0)
    return rewards


def _right(completion: str, gold: str, predicted: str | None, auto: bool, strict: bool, tag: str) -> bool:
    """`accuracy`'s verdict on one completion (its docstring's rule); `predicted` is extract_answer's answer."""
    hedged = auto and not strict and hedges(completion, tag)  # "54, or maybe 56": neither is the answer
    if predicted is not None and answers_match(gold, predicted) and not hedged:
        return True
    if not auto:
        return False
    if not strict and (any(answers_match(gold, result) for result in stated_results(completion, tag)
                           if result != predicted) or states_decrease(completion, gold, tag)):
        return True
    if (words := word_reference(gold)) is not None and states_words(completion, words, tag):
        return True
    if re.fullmatch(r"[A-Za-z]", gold.strip()) and states_choice(completion, gold):
        return True  # "B) 12"
    if states_several(completion, gold, tag):
        return True  # "so x = 2 or x = 3" for "2, 3"; "The midpoint is (5, 7)."; "so x > 4"
    return predicted is None and (place := stated_place(completion, tag)) is not None and answers_match(gold, place)


@REWARDS.register("format")
def format_reward(
    completions: list[str], *, pattern: str = r"^<think>.*?</think>\s*<answer>.*?</answer>$", **_: Any
) -> list[float | None]:
    """1.0 if the whole completion (surrounding whitespace stripped) matches `pattern`, else 0.0.

    The format reward of DeepSeek-R1 (arXiv:2501.12948) and Open-R1's `format_reward`; `.` matches
    newlines (re.DOTALL) and the match is a full match.
    """
    regex = re.compile(pattern, flags=re.DOTALL)
    return [1.0 if regex.fullmatch(c.strip()) else 0.0 for c in completions]


@REWARDS.register("tag_count")
def tag_count(completions: list[str], *, tags: Sequence[str] = ("think", "answer"), **_: Any) -> list[float | None]:
    """Partial credit for tags: per tag +0.25 for exactly one `<tag>` and +0.25 for exactly one
    `</tag>`, divided by 0.5 * len(tags) so a well-formed completion scores 1.0.

    Open-R1's `tag_count_reward` (after willccbb's GRPO demo `count_xml`), normalised to [0, 1].
    """
    if isinstance(tags, str):
        tags = [tags]
    if not tags:
        raise ValueError("reward 'tag_count': kwargs.tags must name at least one tag")
    rewards: list[float | None] = []
    for c in completions:
        credit = sum(0.25 * (c.count(f"<{t}>") == 1) + 0.25 * (c.count(f"</{t}>") == 1) for t in tags)
        rewards.append(credit / (0.5 * len(tags)))
    return rewards


def _per_row(value: Any, n: int) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


@REWARDS.register("soft_overlong_punishment")
def soft_overlong_punishment(
    completion_ids: list[list[int]],
    *,
    max_completion_length: int | Sequence[int] | None = None,
    soft_punish_cache: int | None = None,
    **_: Any,
) -> list[float | None]:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), with L = len(ids):
    0 if L <= Lmax - Lcache; (Lmax - Lcache - L) / Lcache if Lmax - Lcache < L <= Lmax; -1 if L > Lmax.

    Lmax is `max_completion_length` (the engine passes rollout.max_completion_length), Lcache is
    `soft_punish_cache` (DAPO: 4096 of 20480). `completion_ids` must be unpadded.
    """
    if soft_punish_cache is None or not 0 < soft_punish_cache:
        raise ValueError(
            f"reward 'soft_overlong_punishment' needs kwargs.soft_punish_cache > 0 (got {soft_punish_cache!r}); "
            "DAPO uses 4096 with max_completion_length 20480"
        )
    if max_completion_length is None:
        raise ValueError("reward 'soft_overlong_punishment' needs max_completion_length (kwargs or column)")
    rewards: list[float | None] = []
    for ids, l_max in zip(completion_ids, _per_row(max_completion_length, len(completion_ids)), strict=True):
        if soft_punish_cache > l_max:
            raise ValueError(f"soft_punish_cache ({soft_punish_cache}) must be <= max_completion_length ({l_max})")
        length, start = len(ids), l_max - soft_punish_cache
        if length <= start:
            rewards.append(0.0)
        elif length <= l_max:
            rewards.append((start - length) / soft_punish_cache)
        else:
            rewards.append(-1.0)
    return rewards


@REWARDS.register("repetition_penalty")
def repetition_penalty(
    completions: list[str], *, ngram_size: int = 3, max_penalty: float = -1.0, **_: Any
) -> list[float | None]:
    """N-gram repetition penalty of "Demystifying Long Chain-of-Thought Reasoning in LLMs"
    (arXiv:2502.03373), as Open-R1's `get_repetition_penalty_reward`: with words = lower-cased
    whitespace split, (1 - distinct n-grams / n-grams) * max_penalty; 0 for fewer than n words.
    """
    if max_penalty > 0:
        raise ValueError(f"reward 'repetition_penalty': kwargs.max_penalty must be <= 0 (got {max_penalty})")
    if ngram_size < 1:
        raise ValueError(f"reward 'repetition_penalty': kwargs.ngram_size must be >= 1 (got {ngram_size})")
    rewards: list[float | None] = []
    for c in completions:
        words = c.lower().split()
        if len(words) < ngram_size:
            rewards.append(0.0)
            continue
        ngrams = list(zip(*[words[i:] for i in range(ngram_size)]))
        scaling = 1 - len(set(ngrams)) / len(ngrams)
        rewards.append(scaling * max_penalty + 0.0)  # + 0.0: no -0.0 in the logs
    return rewards


_STEP = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d+(?:\.\d+)?)\s*=\s*(-?\d+(?:\.\d+)?)")


@REWARDS.register("arithmetic_steps")
def arithmetic_steps(completions: list[str], completion_offsets: list[list[int]], **_: Any) -> list[list[tuple[int, float]]]:
    """Step-level reward (DeepSeekMath sec. 4.1.3 process supervision, rule-based): each "a op b = c" in the
    completion is a step ending at the token that holds its last character of c; 1.0 if a op b equals c
    (within 1e-6), else 0.0. A completion without such a line has no steps."""
    import operator

    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "x": operator.mul, "×": operator.mul,
           "/": operator.truediv, "÷": operator.truediv}
    out = []
    for text, offsets in zip(completions, completion_offsets, strict=True):
        steps = []
        for m in _STEP.finditer(text):
            a, op, b, c = float(m[1]), m[2], float(m[3]), float(m[4])
            right = op not in "/÷" or b != 0
            value = ops[op](a, b) if right else math.nan
            if offsets:
                steps.append((token_at(offsets, m.end()), 1.0 if right and abs(value - c) <= 1e-6 else 0.0))
        out.append(steps)
    return out


arithmetic_steps.reward_level = "step"  # type: ignore[attr-defined]


GYM_EXTRACT = ("tag", "whole", "auto")


@REWARDS.register("reasoning_gym")
def reasoning_gym_score(
    completions: list[str], task: Sequence[str], *, extract: str = "tag", tag: str = "answer", **columns: Any
) -> list[float | None]:
    """reasoning-gym's own scorer: the row's task's `score_answer(answer, entry)`, as its authors wrote it, on the
    entry the row was made from (data.generator: reasoning_gym; data/gym.py rebuilds it from the row's place).

    The answer is the last `<tag>...</tag>` (extract: tag, reasoning-gym's convention and `extract_answer`; none
    found is scored as its scorer scores no answer), the whole completion (whole), or grpo's rule for a final
    number (auto: answers.py).
    """
    if extract not in GYM_EXTRACT:
        raise ValueError(f"reward 'reasoning_gym': unknown extract {extract!r}; valid: {', '.join(GYM_EXTRACT)}")
    place = ("task_config", "task_seed", "task_size", "task_index", "metadata", "answer")
    rows = [{"task": t, **{k: columns[k][i] for k in place if k in columns}} for i, t in enumerate(task)]
    rewards: list[float | None] = []
    for completion, row in zip(completions, rows, strict=True):
        if extract == "tag":
            found = re.findall(rf"<{re.escape(tag)}>\s?(.*?)\s?</{re.escape(tag)}>", completion, flags=re.DOTALL)
            answer = found[-1].strip() if found else None
        else:
            answer = completion.strip() if extract == "whole" else extract_answer(completion, "auto")
        rewards.append(gym.task_score(answer, row))
    return rewards


@REWARDS.register("judge")
def judge(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """An LLM judge over an OpenAI-compatible endpoint (judges.py): pointwise (a rubric, `Score: N` parsed
    strictly, scaled to [0, 1]) or group-wise (the judge ranks a prompt's completions, best 1, worst 0). Its
    settings are its kwargs (base_url, model, rubric, mode, ...); a completion it could not score is missing."""
    names = JudgeSettings.__dataclass_fields__
    settings = judge_settings({k: v for k, v in columns.items() if k in names})
    questions = columns.get(settings.question_column) or prompts
    answers = columns.get("answer") or [None] * len(completions)
    return judge_for(settings).score(list(questions), completions, list(answers))


# a reward with timeout_s runs each call in a child process (scoring.py), where the judge's client and reply cache
# would start empty every step; its requests have their own bound
judge.stays_in_process = (  # type: ignore[attr-defined]
    "its client and reply cache live in this process; kwargs.request_timeout_s bounds each request, retries how often "
    "it is tried")
# in mode group it ranks a prompt's completions together: each process must hold whole groups (trainer/distributed.py)
judge.ranks_groups = lambda kwargs: kwargs.get("mode") == "group"  # type: ignore[attr-defined]
# its settings are keyword-only parameters, so `grpo validate` checks kwargs against them (kwargs.py)
judge.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("prompts", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     inspect.Parameter("completions", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     *(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None if f.default is MISSING else f.default)
       for f in fields(JudgeSettings)),
     inspect.Parameter("_", inspect.Parameter.VAR_KEYWORD)])


@REWARDS.register("environment")
def environment(completions: list[str], environment_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """The episode's environment's own verdict: its `reward()` (rollout.environment), None where it has none or
    its episode failed."""
    if environment_reward is None:
        raise ValueError("reward 'environment' needs rollout.environment: it returns the environment's reward()")
    return [None if r is None else float(r) for r in environment_reward]
