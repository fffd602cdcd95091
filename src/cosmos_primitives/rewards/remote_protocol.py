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
# the names the world-model RL guide (cosmos-rl) tells users to set; read when ours are unset
SEED_ENV_ENQUEUE_URL = "WFM_REWARD_ENQUEUE_URL"
SEED_ENV_FETCH_URL = "WFM_REWARD_FETCH_URL"
SEED_ENV_TOKEN = "WFM_REWARD_TOKEN"

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


# nesting allowed in the JSON of a request or a reply: the protocol's own objects are 3 deep
MAX_JSON_DEPTH = 64
# an .npy header is a short dict literal; numpy's own reader refuses more than 10000 bytes
MAX_NPY_HEADER_BYTES = 10_000


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number: send finite numbers only")


def parse_json(data: bytes | bytearray, what: str, *, allow_nonfinite: bool = False) -> Any:
    """Parse UTF-8 JSON from the other side of the wire; every way it can be wrong is a ``ProtocolError``.

    Refuses (status 400, naming ``what``): bytes that are not UTF-8 JSON, nesting deeper than
    ``MAX_JSON_DEPTH`` (also what the parser itself cannot recurse into), and unless
    ``allow_nonfinite`` the non-standard constants ``NaN`` / ``Infinity``.
    """
    try:
        text = bytes(data).decode("utf-8")
        value = json.loads(text) if allow_nonfinite else json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ProtocolError(400, f"{what} is nested too deeply to parse (at most {MAX_JSON_DEPTH} levels)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(400, f"{what} could not be parsed: {exc}") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_JSON_DEPTH:
                    raise ProtocolError(400, f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
                stack.append((child, depth + 1))
    return value


class EnqueueBodyParser:
    """Parses an enqueue body fed in chunks, never unpickling and never holding the body whole.

    The JSON line is parsed when its newline arrives, the ``.npy`` header when it is complete; the
    array bytes then go straight into the array's own buffer, allocated once from the header after
    checking its shape (non-negative dims, at most ``max_array_bytes`` in all).

    Example::

        parser = EnqueueBodyParser(max_array_bytes=1 << 30)
        for chunk in chunks:
            parser.feed(chunk)
        meta, media = parser.finish()
    """

    def __init__(self, max_array_bytes: int) -> None:
        self.max_array_bytes = max_array_bytes
        self.meta: dict[str, Any] | None = None
        self._head = bytearray()
        self._searched = 0  # bytes of _head already searched for the newline
        self._flat: np.ndarray | None = None  # [nbytes] uint8, the array's buffer
        self._layout: tuple[tuple[int, ...], bool, np.dtype] | None = None
        self._received = 0  # array bytes received (may exceed the buffer: reported by finish)

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the body. Raises ``ProtocolError`` as soon as they break the format."""
        if self._flat is None:
            self._head += chunk
            self._parse_head()
        else:
            self._write(chunk)

    def finish(self) -> tuple[dict[str, Any], np.ndarray]:
        """The body ended: ``(meta, media)``, the JSON object and the array exactly as sent."""
        if self.meta is None:
            raise ProtocolError(
                400, "enqueue body must be UTF-8 JSON, a newline, then np.save bytes; no newline was found"
            )
        if self._flat is None or self._layout is None:
            raise ProtocolError(400, "the bytes after the JSON are not an .npy array written by "
                                     "np.save(allow_pickle=False): the body ended inside its header")
        shape, fortran_order, dtype = self._layout
        if self._received != self._flat.size:
            raise ProtocolError(
                400, f"the .npy array declares shape {list(shape)} dtype {dtype} ({self._flat.size} bytes) "
                f"but {self._received} bytes follow its header",
            )
        media = self._flat.view(dtype).reshape(shape, order="F" if fortran_order else "C")
        return self.meta, media

    def _parse_head(self) -> None:
        if self.meta is None:
            newline = self._head.find(b"\n", self._searched)
            if newline < 0:
                self._searched = len(self._head)
                return
            meta = parse_json(self._head[:newline], "the JSON before the first newline")
            if not isinstance(meta, dict):
                raise ProtocolError(
                    400, f"the JSON before the first newline must be an object, got {type(meta).__name__}"
                )
            self.meta = meta
            del self._head[: newline + 1]
        header_end = self._npy_header_end()
        if header_end is None:
            return
        stream = io.BytesIO(bytes(self._head[:header_end]))
        try:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        except (ValueError, EOFError, OSError, SyntaxError, TypeError) as exc:
            raise ProtocolError(400, f"the bytes after the JSON are not an .npy array written by "
                                     f"np.save(allow_pickle=False): {exc}") from None
        if dtype.hasobject or dtype.kind not in "biuf":
            raise ProtocolError(
                422, f"array dtype {dtype} is not allowed: send numbers (uint8 pixels or floating point latents)"
            )
        if any(d < 0 for d in shape):
            raise ProtocolError(400, f"the .npy header declares a negative dimension: shape {list(shape)}")
        nbytes = dtype.itemsize
        for dim in shape:  # python ints: a product too large for int64 is seen, not wrapped
            nbytes *= dim
        if nbytes > self.max_array_bytes:
            raise ProtocolError(
                413, f"the .npy header declares shape {list(shape)} dtype {dtype} ({nbytes} bytes), over "
                f"max_body_bytes={self.max_array_bytes}; send smaller batches",
            )
        self._layout = (tuple(shape), fortran_order, dtype)
        self._flat = np.empty(nbytes, dtype=np.uint8)
        rest = bytes(self._head[header_end:])
        self._head = bytearray()
        self._write(rest)

    def _npy_header_end(self) -> int | None:
        """Where the array bytes start, once the whole header is here; None while it is not."""
        head = self._head
        magic = b"\x93NUMPY"
        if head[: len(magic)] != magic[: len(head)]:
            raise ProtocolError(400, "the bytes after the JSON are not an .npy array written by "
                                     "np.save(allow_pickle=False): no .npy magic string")
        if len(head) < 12:
            return None
        major = head[6]
        if major == 1:
            start, length = 10, int.from_bytes(head[8:10], "little")
        elif major in (2, 3):
            start, length = 12, int.from_bytes(head[8:12], "little")
        else:
            raise ProtocolError(400, f"the .npy array has an unknown format version {major}")
        if length > MAX_NPY_HEADER_BYTES:
            raise ProtocolError(400, f"the .npy header is {length} bytes long, more than {MAX_NPY_HEADER_BYTES}")
        return start + length if len(head) >= start + length else None

    def _write(self, chunk: bytes) -> None:
        assert self._flat is not None
        room = self._flat.size - self._received
        if room > 0 and chunk:
            part = chunk[:room]
            self._flat[self._received : self._received + len(part)] = np.frombuffer(part, dtype=np.uint8)
        self._received += len(chunk)


def decode_enqueue_body(body: bytes, max_array_bytes: int | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Split and parse a whole enqueue body, never unpickling (see :class:`EnqueueBodyParser`).

    Returns:
        ``(meta, media)``: the JSON object and the array exactly as sent (not yet checked against
        its media type; see :func:`check_media`).

    Raises:
        ProtocolError: 400 when there is no newline, the JSON is not a UTF-8 JSON object, or the
            rest is not a complete ``.npy`` array; 422 for arrays of objects / structured or string
            dtypes (those would need pickle or cannot be scored); 413 for an array over ``max_array_bytes``.
    """
    parser = EnqueueBodyParser(len(body) if max_array_bytes is None else max_array_bytes)
    parser.feed(body)
    return parser.finish()


def split_score_key(score_key: str) -> list[str]:
    """``"a+b"`` -> ``["a", "b"]``: the reply keys whose per-item scores are summed."""
    keys = [k.strip() for k in score_key.split("+")]
    if not all(keys):
        raise ValueError(f"score_key {score_key!r} has an empty part; write one key or keys joined by '+'")
    return keys
