"""A reward for the dynamic-sampling tests: half the prompts (even answers) give every completion 0 (no
signal), the other half score the completion's length mod 3 (a random tiny model's completions differ)."""


def odd_answers_only(completions: list[str], answer: list[str], **_) -> list[float]:
    return [0.0 if int(a) % 2 == 0 else float(len(c) % 3) for c, a in zip(completions, answer)]


def digit_steps(completions: list[str], completion_offsets: list[list[int]], **_) -> list[list[tuple[int, float]]]:
    """A step-level reward a random tiny model can move: every non-space character is a step ending at its token,
    1 for a digit, 0 otherwise."""
    from grpo_cli.rewards.steps import token_at

    return [[(token_at(offsets, k + 1), 1.0 if ch.isdigit() else 0.0) for k, ch in enumerate(text) if not ch.isspace()]
            if offsets else [] for text, offsets in zip(completions, completion_offsets)]
