"""A check's verdict, as `grpo audit` and `grpo doctor` give them: ok, warn, fail or skip, with its evidence and what
to try; the worst one is the command's exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITY = {"skip": 0, "ok": 0, "warn": 1, "fail": 2}  # the exit code is the worst verdict's


@dataclass
class Verdict:
    check: str
    severity: str  # ok | warn | fail | skip (the run did not log what the check needs)
    finding: str
    evidence: list[str] = field(default_factory=list)
    advice: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def worst_first(verdicts: list[Verdict]) -> list[Verdict]:
    """Failures, warnings, ok, then the checks that could not run."""
    return sorted(verdicts, key=lambda v: -SEVERITY[v.severity] - (v.severity != "skip"))


def exit_code(verdicts: list[Verdict]) -> int:
    return max((SEVERITY[v.severity] for v in verdicts), default=0)


def verdicts_text(title: str, verdicts: list[Verdict]) -> str:
    """`title: <worst outcome>`, then each verdict, its evidence and what to try (grpo audit, grpo doctor)."""
    head = {0: "no problem found", 1: "warnings", 2: "failures"}[exit_code(verdicts)]
    lines = [f"{title}: {head}"]
    for v in verdicts:
        lines.append(f"{v.severity.upper():4} {v.check}: {v.finding}")
        lines.extend(f"       {e}" for e in v.evidence)
        if v.advice:
            lines.append(f"       try: {v.advice}")
    return "\n".join(lines)
