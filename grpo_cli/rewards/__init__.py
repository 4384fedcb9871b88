"""Reward functions: the built-in registry, name resolution and scoring (see scoring.py for how calls run),
kwargs checks at validation (kwargs.py) and reward models as rewards (reward_model.py).

Importing this package must not import torch: the recipe validator checks reward names with it.
"""

from grpo_cli.rewards.builtin import EXTRACT_MODES, REWARDS, answers_match, extract_answer, reference_text
from grpo_cli.rewards.scoring import (
    check_reward,
    check_reward_name,
    resolve_reward,
    reward_log_name,
    score,
    score_rollout,
    unique_log_names,
    weighted_total,
)

__all__ = [
    "EXTRACT_MODES",
    "REWARDS",
    "answers_match",
    "check_reward",
    "check_reward_name",
    "extract_answer",
    "reference_text",
    "resolve_reward",
    "reward_log_name",
    "score",
    "score_rollout",
    "unique_log_names",
    "weighted_total",
]
