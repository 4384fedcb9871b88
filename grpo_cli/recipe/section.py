"""The base of every recipe section: unknown keys are errors, and a validated recipe never changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
