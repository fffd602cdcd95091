"""The reward-service wire format (REFERENCE.md section 5), shared by the client and the server.

Enqueue body: UTF-8 JSON object, one newline byte, then the bytes of ``np.save(array,
allow_pickle=False)``. The JSON carries ``prompts`` (list of str, one per item), ``reward_fn``
({name: weight}; the server does not apply weights), ``media_type`` and ``video_infos``
([{"video_fps": 16.0}], one entry for the batch or one per item). Fetch: form fields ``uuid`` and
``type`` (a reward name); HTTP 400 means "not ready yet".

Arrays are read from the ``.npy`` header and raw bytes only (never ``np.load``): a pickle, an
``.npz`` archive or an object array is refused, never unpickled, and the declared size must match
the bytes sent before anything is allocated.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

ENQUEUE_PATH = "/api/reward/enqueue"
FETCH_PATH = "/api/reward/pull"
PING_PATH = "/api/reward/ping"

ENV_TOKEN = "REMOTE_REWARD_TOKEN"
ENV_ENQUEUE_URL = "REMOTE_REWARD_ENQUEUE_URL"
ENV_FETCH_URL = "REMOTE_REWARD_FETCH_URL"

# media_type -> (layout, number of dims)
MEDIA_LAYOUTS = {
    "latent": ("[B, C, T, H, W] floating point", 5),
    "image": ("[B, H, W, C] uint8", 4),
    "video": ("[B, C, T, H, W] uint8", 5),
}
# colour channels accepted for decoded media: grey, RGB, RGBA
PIXEL_CHANNELS = (1, 3, 4)

# Items whose reward could not be computed get this score (the existing service's convention).
FAILED_SCORE = -1.0


class ProtocolError(ValueError):
    """A request that breaks the protocol. ``status`` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_media(media: np.ndarray, media_type: str) -> None:
    """Check ``media`` against the layout of ``media_type``.

    Layouts: ``latent`` [B, C, T, H, W] float16/32/64; ``image`` [B, H, W, C] uint8 with C in
    1/3/4; ``video`` [B, C, T, H, W] uint8 with C in 1/3/4. Every dimension must be >= 1.

    Raises:
        ProtocolError: (status 422) naming the media type, the expected layout and what was received.
    """
    if media_type not in MEDIA_LAYOUTS:
        raise ProtocolError(
            422, f"unknown media_type {media_type!r}; expected one of {sorted(MEDIA_LAYOUTS)}"
        )
    layout, ndim = MEDIA_LAYOUTS[media_type]
    got = f"got shape {list(media.shape)} dtype {media.dtype}"
    if media.ndim != ndim:
        raise ProtocolError(422, f"media_type {media_type!r} needs an array {layout}; {got}")
    if min(media.shape) < 1:
        raise ProtocolError(422, f"media_type {media_type!r}: every dimension must be >= 1; {got}")
    if media_type == "latent":
        if media.dtype.kind != "f":
            raise ProtocolError(422, f"media_type 'latent' needs a floating point array {layout}; {got}")
        return
    if media.dtype != np.uint8:
        raise ProtocolError(422, f"media_type {media_type!r} needs uint8 pixels {layout}; {got}")
    channels = media.shape[-1] if media_type == "image" else media.shape[1]
    if channels not in PIXEL_CHANNELS:
        raise ProtocolError(
            422, f"media_type {media_type!r} ({layout}) needs {PIXEL_CHANNELS} channels, found {channels}; {got}"
        )


def encode_enqueue_body(meta: dict[str, Any], media: np.ndarray) -> bytes:
    """JSON of ``meta``, a newline, then ``np.save`` bytes of ``media`` (no pickle)."""
    buf = io.BytesIO()
    buf.write(json.dumps(meta).encode("utf-8") + b"\n")
    np.save(buf, np.ascontiguousarray(media), allow_pickle=False)
    return buf.getvalue()


def decode_enqueue_body(body: bytes) -> tuple[dict[str, Any], np.ndarray]:
    """Split and parse an enqueue body, never unpickling.

    Returns:
        ``(meta, media)``: the JSON object and the array exactly as sent (not yet checked against
        its media type; see :func:`check_media`).

    Raises:
        ProtocolError: 400 when there is no newline, the JSON is not a UTF-8 JSON object, or the
            rest is not a complete ``.npy`` array; 422 for arrays of objects / structured or string
            dtypes (those would need pickle or cannot be scored).
    """
    newline = body.find(b"\n")
    if newline < 0:
        raise ProtocolError(
            400, "enqueue body must be UTF-8 JSON, a newline, then np.save bytes; no newline was found"
        )
    try:
        meta = json.loads(body[:newline].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(400, f"the JSON before the first newline could not be parsed: {exc}") from exc
    if not isinstance(meta, dict):
        raise ProtocolError(400, f"the JSON before the first newline must be an object, got {type(meta).__name__}")
    stream = io.BytesIO(body[newline + 1 :])
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        raise ProtocolError(
            400, f"the bytes after the JSON are not an .npy array written by np.save(allow_pickle=False): {exc}"
        ) from exc
    if dtype.hasobject or dtype.kind not in "biuf":
        raise ProtocolError(
            422, f"array dtype {dtype} is not allowed: send numbers (uint8 pixels or floating point latents)"
        )
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    data = memoryview(body)[newline + 1 + stream.tell() :]
    if len(data) != expected:
        raise ProtocolError(
            400,
            f"the .npy array declares shape {list(shape)} dtype {dtype} ({expected} bytes) "
            f"but {len(data)} bytes follow its header",
        )
    media = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C").copy()
    return meta, media


def split_score_key(score_key: str) -> list[str]:
    """``"a+b"`` -> ``["a", "b"]``: the reply keys whose per-item scores are summed."""
    keys = [k.strip() for k in score_key.split("+")]
    if not all(keys):
        raise ValueError(f"score_key {score_key!r} has an empty part; write one key or keys joined by '+'")
    return keys
