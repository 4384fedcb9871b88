"""Every recipe key the tools advise is one a user can set (issue 35: `grpo audit` advised algorithm.entropy_bonus,
a read-only property, so the override it suggested failed). Read from the sources of the tools that advise."""

import ast
import re
from pathlib import Path

from grpo_cli.recipe.schema import schema_keys

ROOT = Path(__file__).resolve().parents[2]
ADVISERS = ["grpo_cli/views/audit.py", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "grpo_cli/doctor").glob("*.py")),
            "grpo_cli/trainer/nonfinite.py", "grpo_cli/process/cpus.py"]
SECTIONS = ("model", "data", "algorithm", "rollout", "train", "checkpoint", "logging", "eval")
KEY = re.compile(r"\b(?:" + "|".join(SECTIONS) + r")\.[a-z_]+(?:\.[a-z_]+)*")


def settable() -> set[str]:
    """Every dotted key and every section above a leaf, as a user writes them in key=value overrides."""
    keys = set()
    for key, _ in schema_keys():
        parts = key.replace("[]", "").split(".")
        keys |= {".".join(parts[: i + 1]) for i in range(len(parts))}
    return keys


def named_keys(path: str) -> set[str]:
    """The dotted recipe keys in the string constants of a module (f-strings included)."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(KEY.findall(node.value))
    return found


def test_every_key_the_tools_advise_can_be_set():
    keys = settable()
    assert "algorithm.entropy_coef" in keys and "algorithm.entropy_bonus" not in keys
    named = {path: named_keys(path) for path in ADVISERS}
    assert sum(map(len, named.values())) > 20  # the scan reads the advice
    wrong = {path: sorted(k for k in found if k not in keys) for path, found in named.items()}
    assert not any(wrong.values()), wrong
