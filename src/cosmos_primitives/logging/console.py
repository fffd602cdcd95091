"""The library's Python logger: ``[cosmos] <time> - <level> - <message>`` with the rank in front.

While a tqdm progress bar is on screen, records are printed through ``tqdm.write``: the bar is
cleared, the line printed, the bar redrawn below it, instead of the line being glued to the bar's end.
"""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "[rank{rank}]:[cosmos] %(asctime)s - %(levelname)s - %(message)s"


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time, so redirections made later are honoured."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)  # no bar can be on screen before tqdm is imported
        if tqdm is None or not getattr(tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must not raise: report as logging does
            self.handleError(record)


def get_logger(name: str = "cosmos") -> logging.Logger:
    """The ``cosmos`` logger (or a child of it), printing to stderr once per process.

    ``COSMOS_LOG_LEVEL`` sets the level (default INFO).
    """
    root = logging.getLogger("cosmos")
    # its own handler, not any handler: pytest attaches its capture handlers to non-propagating loggers
    if not any(isinstance(handler, _CurrentStderrHandler) for handler in root.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT.format(rank=os.environ.get("RANK", "0"))))
        root.addHandler(handler)
        root.setLevel(os.environ.get("COSMOS_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return root if name == "cosmos" else root.getChild(name.removeprefix("cosmos."))
