"""A reward for the dynamic-sampling tests: half the prompts (even answers) give every completion 0 (no
signal), the other half score the completion's length mod 3 (a random tiny model's completions differ)."""


def odd_answers_only(completions: list[str], answer: list[str], **_) -> list[float]:
    return [0.0 if int(a) % 2 == 0 else float(len(c) % 3) for c, a in zip(completions, answer)]
