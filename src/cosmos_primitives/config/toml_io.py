"""Reading and writing TOML: tomllib for reading, a small writer for resolved configs."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file."""
    from cosmos_primitives.config.errors import ConfigError

    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a TOML text file (byte {exc.start} is not UTF-8); "
                          f"give the path of a .toml config") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; give the path of a .toml config file") from None
    except PermissionError:
        raise ConfigError(f"{path}: cannot read the config file (permission denied)") from None
    except RecursionError:
        raise ConfigError(f"{path}: arrays or tables nested too deeply to read; a config nests a few levels") from None


def parse_toml_value(text: str) -> Any:
    """Parse one TOML value (``2``, ``"a"``, ``[1, 2]``, ``true``); bare words stay strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        items = ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None)
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(data: dict[str, Any]) -> str:
    """Serialise nested dicts to TOML: scalars first, then one ``[table]`` per nested dict.

    ``None`` values are left out (TOML has no null); lists of tables become inline tables.
    """
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if v is not None and not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        if scalars or (prefix and not tables):
            lines.append("")
        for k, v in tables.items():
            emit(v, f"{prefix}.{_key(k)}" if prefix else _key(k))

    emit(data, "")
    return "\n".join(lines).rstrip("\n") + "\n"
