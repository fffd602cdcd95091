"""Each recipe in examples/ reads top to bottom in one sitting (ARCHITECTURE.md: <= ~300 lines); what
grows past that belongs in the library."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MAX_LINES = 300


def test_every_recipe_is_at_most_300_lines() -> None:
    recipes = sorted(EXAMPLES.glob("*.py"))
    assert len(recipes) >= 5  # the glob really found the recipes
    long = {p.name: n for p in recipes if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"recipes over {MAX_LINES} lines (move their reusable parts into the library): {long}"
