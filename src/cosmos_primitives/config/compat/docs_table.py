"""Keep the cosmos-rl key table of ``docs/from_cosmos_rl.md`` equal to the rule list.

    python -m cosmos_primitives.config.compat.docs_table           # exit 1 when the docs differ
    python -m cosmos_primitives.config.compat.docs_table --write   # rewrite the table in the docs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosmos_primitives.config.compat.rules import render_table

START = "<!-- cosmos-rl key table: generated, do not edit -->\n"
END = "<!-- end of cosmos-rl key table -->"
DOC = Path(__file__).resolve().parents[4] / "docs" / "from_cosmos_rl.md"


def table_in(text: str, where: str = "docs/from_cosmos_rl.md") -> tuple[int, int]:
    """``(start, end)`` offsets of the generated table inside ``text``."""
    if START not in text or END not in text:
        raise ValueError(f"{where}: the markers {START.strip()!r} and {END!r} around the cosmos-rl key table "
                         "are missing; put them back around the table")
    start = text.index(START) + len(START)
    return start, text.index(END, start)


def with_table(text: str) -> str:
    """``text`` with its generated table replaced by :func:`~.rules.render_table`."""
    start, end = table_in(text)
    return text[:start] + render_table() + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in the docs file")
    parser.add_argument("--doc", type=Path, default=DOC, help="the docs file (default: docs/from_cosmos_rl.md)")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    updated = with_table(text)
    if args.write:
        if updated != text:
            args.doc.write_text(updated)
        return 0
    if updated != text:
        sys.stderr.write(f"{args.doc}: the cosmos-rl key table differs from config/compat/rules.py; "
                         "rewrite it with: python -m cosmos_primitives.config.compat.docs_table --write\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
