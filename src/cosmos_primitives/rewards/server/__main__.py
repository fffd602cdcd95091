"""``python -m cosmos_primitives.rewards.server``: see :func:`cosmos_primitives.rewards.server.main`."""

import sys

from cosmos_primitives.rewards.server import main

if __name__ == "__main__":  # walking the package (docs check, pydoc) imports this module too
    sys.exit(main())
