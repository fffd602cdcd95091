"""Base class of every config section (keyword-only, unknown keys rejected) and the ranges that
numeric keys are checked against at load time."""

from __future__ import annotations

from typing import Annotated

import msgspec

AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
"""A count or size: 0 or negative would train nothing or divide by zero."""
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
"""A value in [0, 1]."""
ShareBelowOne = Annotated[float, msgspec.Meta(ge=0, lt=1)]
"""A share in [0, 1) (a float ``test_size``: 0.0 holds nothing out)."""


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A typed config table. Fields with a default of ``None`` are omitted when dumped to TOML."""
