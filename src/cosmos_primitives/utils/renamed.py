"""Older keyword names of a quantity that now has one name (issue 33): they still work, with a
``FutureWarning`` naming the keyword to write instead."""

from __future__ import annotations

import warnings
from typing import Any


def renamed_keyword(value: Any, old_value: Any, *, new: str, old: str, where: str, stacklevel: int = 3) -> Any:
    """``value`` (the keyword ``new``), or ``old_value`` when the caller spelled it ``old`` (warned).

    ``None`` means "not given" for both. ``stacklevel`` counts from this function's caller's caller
    (3: the user's call of a function that calls this).

    Raises:
        TypeError: both spellings given with different values.
    """
    if old_value is None:
        return value
    if value is not None and value != old_value:
        raise TypeError(f"{where}: {new}={value!r} and {old}={old_value!r} differ (one setting, two names); "
                        f"pass {new} only")
    warnings.warn(f"{where}({old}=...) is now {new}=... (one name per quantity); {old} is read as {new} for now",
                  FutureWarning, stacklevel=stacklevel)
    return old_value
