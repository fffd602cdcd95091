"""The reward server's connections parse requests with aiohttp's pure-Python parser.

Why: aiohttp's C request parser (``aiohttp._http_parser``, seen in 3.14.5) drops a broken chunked
body when the request's headers arrived in an earlier read. It raises the error to the protocol,
which queues a 400 behind the request being handled, but never passes it to that request's body
stream. The handler reading the body then waits ``body_timeout_s`` and answers 408 where it should
answer 400 at once, and the connection and the body's memory budget are held all that time. In the
repository's hostile-request test that happened in about one run of four. The pure-Python parser
hands the error to the body stream (``RequestPayloadError``), which ``read_body`` answers 400.
Both parsers implement the same HTTP/1.1 grammar; the reward server's request bodies are large
binary arrays, which the Python parser slices without parsing.

aiohttp has no public switch for this per server (``AIOHTTP_NO_EXTENSIONS`` is process-wide and read
at import), so :func:`python_parser_protocol` replaces the parser of each new connection's
``RequestHandler``. It touches aiohttp internals; if they differ (another aiohttp version), the
handler keeps aiohttp's own parser and the server still works, with the C parser's behaviour.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def with_python_parser(handler: Any) -> Any:
    """Give a fresh aiohttp ``RequestHandler`` (before ``connection_made``) the pure-Python request
    parser, configured like the one aiohttp made; return the handler."""
    from aiohttp import http_parser, web_protocol

    c_parser = getattr(http_parser, "HttpRequestParserC", None)
    if c_parser is None or not isinstance(getattr(handler, "_parser", None), c_parser):
        return handler  # aiohttp runs without its C extension already, or its internals differ
    python_parser = http_parser.HttpRequestParserPy
    options: dict[str, Any] = {
        "max_line_size": handler.max_line_size, "max_field_size": handler.max_field_size,
        "max_headers": handler.max_headers, "payload_exception": web_protocol.RequestPayloadError,
    }
    if "max_msg_queue_size" in inspect.signature(python_parser.__init__).parameters:
        options["max_msg_queue_size"] = getattr(web_protocol, "MAX_MSG_QUEUE_SIZE", 0)
    try:
        handler._parser = python_parser(handler, handler._loop, getattr(handler, "_read_bufsize", 2**16),
                                        **options)
    except (AttributeError, TypeError) as exc:
        log.debug("reward server: keeping aiohttp's C request parser (%s)", exc)
    return handler


def python_parser_protocol(server: Callable[[], Any]) -> Callable[[], Any]:
    """A protocol factory for ``loop.create_server``: ``server()`` (an aiohttp ``web.Server``,
    e.g. ``AppRunner.server``) with :func:`with_python_parser` applied to each connection."""
    return lambda: with_python_parser(server())
