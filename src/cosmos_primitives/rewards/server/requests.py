"""The reference server's request boundary: every byte a client sends is read and checked here.

Whatever a client gets wrong ends here as a :class:`ProtocolError` carrying a 4xx status and the
reason, which the server answers with: a body over its limit (413), one that stalls (408), one the
memory budget cannot hold now (503), a bad token (401), unparsable bytes (400), fields that break
the protocol (422). A client that hangs up while sending is :class:`ClientGone`. Anything else the
parsing of client bytes raises (``ValueError``, ``OverflowError``, ``RecursionError``, ...) is the
client's input too and becomes a 400 (:func:`client_input`), so no client mistake reaches the
server's 500 path.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hmac
import logging
import math
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from cosmos_primitives.rewards.remote_protocol import ProtocolError, check_media, parse_json
from cosmos_primitives.rewards.server.memory import ByteBudget

# a fetch body is two short fields
MAX_FETCH_BODY_BYTES = 64 * 1024

_CLIENT_INPUT_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, UnicodeError, LookupError)


def _is_request_payload_error(exc: BaseException) -> bool:
    """aiohttp's ``web_protocol.RequestPayloadError`` (named, so that aiohttp stays a lazy import)."""
    return type(exc).__module__ == "aiohttp.web_protocol" and type(exc).__name__ == "RequestPayloadError"


class ClientMistakesLog(logging.LoggerAdapter):
    """aiohttp's own logger, for the requests it refuses before any handler runs (malformed HTTP,
    broken chunked encoding: answered 400 by aiohttp), and for a broken body that aiohttp drains
    after the handler answered it 400 (``RequestPayloadError``, logged by aiohttp as an "Unhandled
    exception"): one warning line each, not a traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, BaseException) and (type(exc_info).__module__.startswith("aiohttp.http")
                                                    or _is_request_payload_error(exc_info)):
            self.warning(f"{msg}: %s", *args, str(exc_info).replace("\n", " "), **kwargs)
        else:
            super().exception(msg, *args, exc_info=exc_info, **kwargs)


class ClientGone(Exception):
    """The client closed the connection before its request body arrived."""


@contextmanager
def client_input(what: str) -> Iterator[None]:
    """Code under this reads client input: whatever it raises is the client's mistake (400)."""
    try:
        yield
    except ProtocolError:
        raise
    except _CLIENT_INPUT_ERRORS as exc:
        raise ProtocolError(400, f"{what} could not be read: {type(exc).__name__}: {exc}") from None


def check_token(header: str, token: str) -> None:
    """``Authorization: Bearer <token>``; any other header (any bytes at all) is a 401."""
    scheme, _, given = header.partition(" ")
    if not header:
        raise ProtocolError(401, "missing header 'Authorization: Bearer <token>'")
    # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail on them
    sent = given.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent, token.encode("utf-8")):
        raise ProtocolError(401, "wrong token")


async def read_body(request: Any, sink: Callable[[bytes], None], *, limit: int, limit_name: str,
                    budget: ByteBudget, timeout_s: float, what: str) -> int:
    """Read ``request``'s body into ``sink`` chunk by chunk, within ``limit`` bytes, ``timeout_s``
    seconds and the memory budget.

    The declared ``Content-Length`` is taken from ``budget`` before any byte is read; a body without
    one takes its bytes as they arrive.

    Returns:
        The bytes taken from ``budget``; the caller releases them when it frees what it built.

    Raises:
        ProtocolError: 413 (over ``limit``, named ``limit_name`` in the message), 503 (budget full),
            408 (not all there within ``timeout_s``), 400 (broken transfer encoding, or what ``sink`` raises).
        ClientGone: the client hung up.
    """
    declared = request.content_length
    too_large = f"{what} over {limit_name}={limit} bytes; send smaller batches"
    if declared is not None and declared > limit:
        raise ProtocolError(413, too_large)
    held = 0

    def take(nbytes: int) -> None:
        nonlocal held
        if not budget.reserve(nbytes):
            raise ProtocolError(
                503, f"server memory budget full: {budget.used} of {budget.capacity} bytes held by bodies being "
                f"read, batches pending and finished results not fetched yet; retry later",
            )
        held += nbytes

    async def pump() -> None:
        received = 0
        async for chunk in request.content.iter_any():
            received += len(chunk)
            if received > limit:
                raise ProtocolError(413, too_large)
            if received > held:
                take(received - held)
            with client_input(what):
                sink(chunk)

    try:
        take(declared or 0)
        await asyncio.wait_for(pump(), timeout_s)
    except asyncio.TimeoutError:
        budget.release(held)
        raise ProtocolError(408, f"{what} did not arrive within body_timeout_s={timeout_s}s; "
                                 "send the whole body at once") from None
    except ConnectionError as exc:
        budget.release(held)
        raise ClientGone(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:
        budget.release(held)
        # aiohttp's HttpProcessingError family: a transfer encoding the client broke
        if not isinstance(exc, ProtocolError) and type(exc).__module__.startswith("aiohttp"):
            raise ProtocolError(400, f"{what} could not be read: {exc}") from None
        raise
    return held


def _positive_finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_enqueue(meta: dict[str, Any], media: np.ndarray, rewards: dict[str, Any]) -> dict[str, Any]:
    """Check a parsed enqueue against the protocol and the hosted rewards (runs in a worker thread:
    arrays may be large).

    Returns:
        The fields of a job: ``media``, ``media_type``, ``prompts``, ``video_infos``, ``rewards``,
        ``input_info`` (what every reply carries: shape, dtype, min, max, and the fps of each entry of
        ``video_infos``; nothing else the client sent is kept past the job).

    Raises:
        ProtocolError: 422 naming the field.
    """
    with client_input("the enqueue body"):
        return _check_enqueue(meta, media, rewards)


def _check_enqueue(meta: dict[str, Any], media: np.ndarray, rewards: dict[str, Any]) -> dict[str, Any]:
    media_type = meta.get("media_type", "latent")
    if not isinstance(media_type, str):
        raise ProtocolError(422, f"'media_type' must be a string, got {media_type!r}")
    check_media(media, media_type)
    if media.dtype.kind == "f" and not np.isfinite(media).all():
        raise ProtocolError(422, f"the {media_type} array holds NaN or infinite values")
    batch = media.shape[0]
    prompts = meta.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ProtocolError(422, "'prompts' must be a list of strings, one per item")
    if len(prompts) != batch:
        raise ProtocolError(422, f"{len(prompts)} prompts for a batch of {batch} items (shape {list(media.shape)})")
    reward_fn = meta.get("reward_fn")
    if not isinstance(reward_fn, dict) or not reward_fn:
        raise ProtocolError(422, "'reward_fn' must be a non-empty object {reward name: weight}")
    for name, weight in reward_fn.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ProtocolError(422, f"'reward_fn' weight of {name!r} must be a number (finite), got {weight!r}")
    unknown = sorted(set(reward_fn) - set(rewards))
    if unknown:
        raise ProtocolError(422, f"unknown reward(s) {unknown}; this server hosts {sorted(rewards)}")
    video_infos = meta.get("video_infos") or []
    if not isinstance(video_infos, list) or not all(isinstance(v, dict) for v in video_infos):
        raise ProtocolError(422, "'video_infos' must be a list of objects such as {\"video_fps\": 16.0}")
    if len(video_infos) not in (0, 1, batch):
        raise ProtocolError(422, f"'video_infos' has {len(video_infos)} entries; send 1 or one per item ({batch})")
    for i, info in enumerate(video_infos):
        fps = info.get("video_fps")
        if fps is not None and not _positive_finite(fps):
            raise ProtocolError(422, f"video_infos[{i}].video_fps must be a positive finite number, got {fps!r}")
    return {
        "media": media,
        "media_type": media_type,
        "prompts": prompts,
        "video_infos": video_infos,
        "rewards": tuple(reward_fn),
        "input_info": {
            "shape": list(media.shape),
            "dtype": str(media.dtype),
            "min": float(media.min()),
            "max": float(media.max()),
            "video_infos": [{"video_fps": info["video_fps"]} if "video_fps" in info else {} for info in video_infos],
        },
    }


def parse_fetch(body: bytes, content_type: str, content_type_header: str) -> tuple[str, str]:
    """``(uuid, reward name)`` from a fetch body: form fields (urlencoded or multipart) or a JSON object.

    Raises:
        ProtocolError: 400 for bytes that do not parse, 422 when a field is missing (never 400
            without a reason: a bare 400 means "not ready").
    """
    with client_input("the fetch body"):
        if content_type == "application/json":
            fields = parse_json(body, "the fetch body")
            if not isinstance(fields, dict):
                raise ProtocolError(422, "fetch body could not be read: the JSON body is not an object")
        elif content_type == "multipart/form-data":
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + content_type_header.encode("latin-1") + b"\r\n\r\n" + body
            )
            fields = {part.get_param("name", header="content-disposition"): part.get_content()
                      for part in message.iter_parts()}
        else:
            fields = dict(urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    uuid, name = fields.get("uuid"), fields.get("type")
    if not isinstance(uuid, str) or not uuid or not isinstance(name, str) or not name:
        raise ProtocolError(422, "fetch needs the form fields 'uuid' (from enqueue) and 'type' (a reward name)")
    return uuid, name
