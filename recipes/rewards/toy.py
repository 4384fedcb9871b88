"""Toy rewards that a random tiny model can move (CI checks that training changes behaviour).

Any file like this can be named in a recipe as `path/to/file.py:function`; the signature is TRL's:
fn(prompts, completions, completion_ids, **dataset_columns) -> list[float | None].
"""


def digit_fraction(completions: list[str], **_) -> list[float]:
    """Fraction of non-space characters that are digits: 0 for prose, 1 for a bare number."""
    out = []
    for text in completions:
        chars = [c for c in text if not c.isspace()]
        out.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return out
