"""Objects named by import path (``"my_pkg.data:MyDataset"``): how configs name users' plug-ins."""

from __future__ import annotations

import importlib
from typing import Any


def is_import_path(text: str) -> bool:
    """Whether ``text`` has the ``module:attribute`` shape of an import path."""
    module, sep, attribute = text.partition(":")
    return bool(sep and module and attribute) and all(part.isidentifier() for part in module.split("."))


def import_object(path: str, what: str = "plug-in") -> Any:
    """The object ``path`` (``"package.module:name"``, ``name`` may be dotted: ``"mod:Class.method"``) names.

    Raises:
        ImportError: the path is malformed, its module does not import, or it lacks the attribute;
            the message names the path and ``what`` it was for (e.g. the config key).
    """
    if not is_import_path(path):
        raise ImportError(f"{what}: {path!r} is not an import path; write 'package.module:name'")
    module_name, _, attribute = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{what}: cannot import module {module_name!r} of {path!r} ({exc}); is it installed "
                          "or on PYTHONPATH?") from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{what}: module {module_name!r} has no attribute {attribute!r} ({path!r})") from None
    return obj
