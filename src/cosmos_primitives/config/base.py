"""Base class of every config section: keyword-only, unknown keys rejected."""

from __future__ import annotations

import msgspec


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A typed config table. Fields with a default of ``None`` are omitted when dumped to TOML."""
