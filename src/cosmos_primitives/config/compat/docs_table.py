"""Keep the cosmos-rl key tables of ``docs/from_cosmos_rl.md`` equal to the rule list (the LLM / VLM
table and the world-model tables, all generated from ``config/compat/rules.py``'s ``RULE_LIST``).

    python -m cosmos_primitives.config.compat.docs_table           # exit 1 when the docs differ
    python -m cosmos_primitives.config.compat.docs_table --write   # rewrite the table in the docs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosmos_primitives.config.compat.cosmos_rl_wfm import render_tables
from cosmos_primitives.config.compat.rules import render_table

START = "<!-- cosmos-rl key table: generated, do not edit -->\n"
END = "<!-- end of cosmos-rl key table -->"
WFM_START = "<!-- cosmos-rl world-model key tables: generated, do not edit -->\n"
WFM_END = "<!-- end of cosmos-rl world-model key tables -->"
DOC = Path(__file__).resolve().parents[4] / "docs" / "from_cosmos_rl.md"


def table_in(text: str, where: str = "docs/from_cosmos_rl.md", start_marker: str = START,
             end_marker: str = END) -> tuple[int, int]:
    """``(start, end)`` offsets of the generated table between ``start_marker`` and ``end_marker`` inside ``text``."""
    if start_marker not in text or end_marker not in text:
        raise ValueError(f"{where}: the markers {start_marker.strip()!r} and {end_marker!r} around a generated "
                         "cosmos-rl key table are missing; put them back around the table")
    start = text.index(start_marker) + len(start_marker)
    return start, text.index(end_marker, start)


def with_table(text: str) -> str:
    """``text`` with its generated tables replaced: the LLM / VLM one by :func:`~.rules.render_table`,
    the world-model ones by :func:`~.cosmos_rl_wfm.render_tables`."""
    start, end = table_in(text)
    text = text[:start] + render_table() + text[end:]
    start, end = table_in(text, start_marker=WFM_START, end_marker=WFM_END)
    return text[:start] + render_tables() + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables in the docs file")
    parser.add_argument("--doc", type=Path, default=DOC, help="the docs file (default: docs/from_cosmos_rl.md)")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    updated = with_table(text)
    if args.write:
        if updated != text:
            args.doc.write_text(updated)
        return 0
    if updated != text:
        sys.stderr.write(f"{args.doc}: a cosmos-rl key table differs from config/compat/rules.py; "
                         "rewrite it with: python -m cosmos_primitives.config.compat.docs_table --write\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
