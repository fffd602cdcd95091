"""``python -m cosmos_primitives.plot RUN_DIR [--out PNG] [--keys k1 k2]``: curves of a run to PNG."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_primitives.plot", description=__doc__)
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    parser.add_argument("--keys", nargs="*", default=None, help="metrics to plot (default: loss / reward ones)")
    args = parser.parse_args(argv)
    from cosmos_primitives.logging.plot import plot_run

    try:
        out = plot_run(args.run_dir, args.out, args.keys)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
