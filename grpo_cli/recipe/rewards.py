"""A recipe's rewards: each entry names a function, a reward model, a judge or a URL (rewards/ resolves them), with
its weight, settings and failure policy; a reward model's `update` keeps it learning during the run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from grpo_cli.recipe.section import Section


class RewardUpdateConfig(Section):
    every_steps: int = Field(
        ..., ge=1, description="Fine-tune the reward model after every N policy steps (DeepSeekMath Algorithm 1's "
        "iteration) on the completions of those steps, labelled by the `label` reward.",
    )
    label: str | None = Field(
        None, description="The verifiable reward whose values label the completions: its `name` in this recipe, or "
        "the name it is logged under (e.g. digit_fraction for path/to/toy.py:digit_fraction). "
        "Default: the recipe's only outcome reward that is not a reward model.",
    )
    objective: Literal["pointwise", "pairwise"] = Field(
        "pointwise", description="pointwise: binary cross-entropy of the score against the label in [0, 1] "
        "(Math-Shepherd / DeepSeekMath's RMs); pairwise: Bradley-Terry -log sigmoid(s_i - s_j) for every pair of "
        "the same prompt with label_i > label_j (InstructGPT's RM loss).",
    )
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate of each update (fresh moments, constant).")
    epochs: int = Field(1, ge=1, description="Passes over the update's samples (new + replayed).")
    batch_size: int = Field(8, ge=1, description="Completions per optimizer step (pairwise: whole groups).")
    replay_fraction: float = Field(
        0.1, ge=0, lt=1, description="Share of each update's training groups drawn from earlier periods' groups "
        "(the replay buffer): n_new x f / (1 - f) of them.",
    )
    buffer_groups: int = Field(512, ge=1, description="Groups the replay buffer keeps (the newest).")
    holdout_fraction: float = Field(
        0.1, ge=0, lt=1, description="Share of each period's groups never trained on; the reward model's accuracy "
        "on them after the update is logged.",
    )


class RewardConfig(Section):
    name: str = Field(
        ..., description="Built-in reward, `module:function`, `path/to/file.py:function` (relative to the recipe's folder), "
        "`model:PATH_OR_HUB_ID` (a reward model, num_labels 1) or an http(s) URL (a function behind an endpoint).",
    )
    weight: float = Field(1.0, description="Weight in the summed reward.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the function, checked against its signature.")
    timeout_s: float | None = Field(None, gt=0, description="Run in a child process killed after this many seconds (a URL reward: each request's timeout, default 60).")
    on_error: Literal["raise", "skip"] = Field("raise", description="`skip` turns an exception, a timeout or a NaN/inf value into a missing reward (the first one is printed).")
    level: Literal["outcome", "step"] = Field(
        "outcome", description="`outcome`: one reward per completion; `step`: process supervision (DeepSeekMath sec. "
        "4.1.3), the function returns (token_index, reward) pairs per completion, one per reasoning step.",
    )
    update: RewardUpdateConfig | None = Field(
        None, description="Reward models only: keep training it during the run on the policy's new completions, "
        "labelled by a verifiable reward, with a replay of earlier ones (DeepSeekMath Algorithm 1, last line).",
    )
