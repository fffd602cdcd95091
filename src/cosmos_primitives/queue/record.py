"""The rollout record that travels through the queue, and its msgpack encoding.

One record is one GRPO group: the ``n`` completions of one prompt, sampled with one weight version,
with their rewards and group advantages already computed on the rollout side. Media travel as
references (paths / URIs), never as bytes: the trainer re-reads them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from cosmos_primitives.queue.errors import MalformedRecordError

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.data.records import RolloutGroup

# content-part types of a Qwen2.5-VL conversation whose value is a media item
MEDIA_PART_TYPES = ("image", "video", "audio", "image_url", "video_url")

_JSON_SCALARS = (str, int, float, bool, type(None))


def _new_id() -> str:
    return uuid.uuid4().hex


class RolloutRecord(msgspec.Struct, kw_only=True):
    """One group of completions for one prompt, ready for the trainer.

    With ``n`` completions and ``L_i`` generated tokens in completion ``i``:

    - ``record_id``: unique id of this record (uuid4 hex by default); the trainer trains on a
      record id at most once.
    - ``prompt_id``: the prompt's id in the dataset; ``group_id``: id of this sampling of the prompt
      (several groups of one prompt have different group ids).
    - ``weight_version``: the policy weight version that sampled the completions (>= 0).
    - ``prompt_token_ids``: ``[P]`` int, the prompt as the engine saw it (vision placeholders included).
    - ``completions``: ``n`` decoded texts; ``completion_token_ids``: ``n`` lists ``[L_i]`` int;
      ``logprobs``: ``n`` lists ``[L_i]`` float, the sampling distribution's log-probability (nats)
      of each generated token; ``finish_reasons``: ``n`` of ``"stop"`` / ``"length"``.
    - ``rewards``, ``advantages``: ``[n]`` float.
    - ``media``: references (paths / URIs) of the prompt's images and videos, in placeholder order.
    - ``conversation``: the prompt conversation, JSON-like (media parts hold references).
    - ``meta``: small scalar extras (e.g. the reference answer).
    - ``created_at``: Unix time (seconds) when the record was made.

    Constructing or decoding a record checks that the per-completion lists agree in length.
    """

    record_id: str = msgspec.field(default_factory=_new_id)
    prompt_id: str
    group_id: str = ""
    weight_version: int
    prompt_token_ids: list[int]
    completions: list[str]
    completion_token_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    rewards: list[float]
    advantages: list[float]
    media: list[str] = msgspec.field(default_factory=list)
    conversation: list[dict[str, Any]] = msgspec.field(default_factory=list)
    meta: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    created_at: float = msgspec.field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.record_id:
            raise ValueError("record_id is empty")
        if self.weight_version < 0:
            raise ValueError(f"weight_version is {self.weight_version}; it must be >= 0")
        n = len(self.completions)
        if n == 0:
            raise ValueError("the record holds no completions")
        for name in ("completion_token_ids", "logprobs", "finish_reasons", "rewards", "advantages"):
            got = len(getattr(self, name))
            if got != n:
                raise ValueError(f"{name} has {got} entries but there are {n} completions")
        for i, (ids, lps) in enumerate(zip(self.completion_token_ids, self.logprobs)):
            if len(ids) != len(lps):
                raise ValueError(f"completion {i} has {len(ids)} token ids but {len(lps)} log-probs")
        for name in ("rewards", "advantages"):
            for i, value in enumerate(getattr(self, name)):
                if not math.isfinite(value):
                    raise ValueError(f"{name}[{i}] is {value}; rewards and advantages must be finite")
        _check_json_like(self.conversation, "conversation")

    @property
    def num_completions(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        """Generated tokens over all completions (prompt not counted)."""
        return sum(len(ids) for ids in self.completion_token_ids)


def _check_json_like(value: Any, where: str) -> None:
    if isinstance(value, _JSON_SCALARS):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_like(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}")
            _check_json_like(item, f"{where}[{key!r}]")
        return
    raise ValueError(
        f"{where} holds a {type(value).__name__}; records carry media as references (paths / URIs), "
        "never media bytes or decoded arrays"
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(RolloutRecord)


def encode_record(record: RolloutRecord) -> bytes:
    """The msgpack bytes of ``record`` (a map keyed by field name, so fields can be added later)."""
    return _ENCODER.encode(record)


def decode_record(data: bytes | bytearray | memoryview, entry_id: str = "<bytes>") -> RolloutRecord:
    """Decode and validate one record.

    Raises:
        MalformedRecordError: naming ``entry_id`` (the stream entry) and what is wrong: not msgpack,
            a missing or mistyped field (with its path, e.g. ``$.weight_version``), or lists of
            different lengths.
    """
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedRecordError(entry_id, f"payload of {len(data)} bytes is not msgpack ({exc})") from exc
    except msgspec.ValidationError as exc:
        raise MalformedRecordError(entry_id, f"not a valid RolloutRecord: {exc}") from exc


def media_references(conversation: Sequence[Mapping[str, Any]]) -> list[str]:
    """The media references (paths / URIs) in a Qwen2.5-VL conversation, in order of appearance.

    Content parts like ``{"type": "video", "video": "clips/a.mp4"}`` contribute their value; parts
    whose value is not a string (a decoded image, an array) raise, since they cannot be referenced.

    Raises:
        ValueError: naming the message and part index of an inline media item.
    """
    refs: list[str] = []
    for m, message in enumerate(conversation):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind not in MEDIA_PART_TYPES:
                continue
            value = part.get(kind)
            if isinstance(value, Mapping) and "url" in value:  # OpenAI-style {"image_url": {"url": ...}}
                value = value["url"]
            if not isinstance(value, str):
                raise ValueError(
                    f"conversation message {m} part {p} ({kind}) holds a {type(value).__name__}, not a path "
                    "or URI; keep media references in the conversation or pass media=[...] explicitly"
                )
            refs.append(value)
    return refs


def _floats(values: Any, name: str, n: int) -> list[float]:
    if hasattr(values, "tolist"):  # torch / numpy
        values = values.tolist()
    out = [float(v) for v in values]
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries but the group has {n} completions")
    return out


def record_from_group(
    group: RolloutGroup,
    rewards: Sequence[float] | Any,
    advantages: Sequence[float] | Any,
    *,
    media: Sequence[str] | None = None,
    include_conversation: bool = True,
    group_id: str | None = None,
    record_id: str | None = None,
    meta: Mapping[str, str | int | float | bool] | None = None,
) -> RolloutRecord:
    """A queue record from one :class:`~cosmos_primitives.data.records.RolloutGroup`.

    Args:
        group: the ``n`` completions of one prompt with the weight version that sampled them.
        rewards, advantages: ``[n]`` floats (lists, numpy arrays or torch tensors), in completion order.
        media: references of the prompt's media; default: those found in the conversation
            (:func:`media_references`).
        include_conversation: copy the prompt conversation into the record (it must hold
            references, not decoded media).
        group_id: default ``"<prompt_id>:<8 hex>"``; record_id: default a fresh uuid4 hex.
        meta: small scalar extras; the prompt's ``reference`` answer is added as ``"reference"``
            when it is set.

    Raises:
        ValueError: rewards / advantages of the wrong length, or decoded media in the conversation.
    """
    n = len(group.completions)
    prompt = group.prompt
    conversation = list(prompt.conversation) if include_conversation else []
    refs = list(media) if media is not None else media_references(prompt.conversation)
    extras: dict[str, str | int | float | bool] = dict(meta or {})
    if prompt.reference and "reference" not in extras:
        extras["reference"] = prompt.reference
    return RolloutRecord(
        record_id=record_id or _new_id(),
        prompt_id=prompt.prompt_id,
        group_id=group_id or f"{prompt.prompt_id}:{uuid.uuid4().hex[:8]}",
        weight_version=int(group.weight_version),
        prompt_token_ids=[int(t) for t in group.prompt_token_ids],
        completions=[c.text for c in group.completions],
        completion_token_ids=[[int(t) for t in c.token_ids] for c in group.completions],
        logprobs=[[float(lp) for lp in c.logprobs] for c in group.completions],
        finish_reasons=[c.finish_reason for c in group.completions],
        rewards=_floats(rewards, "rewards", n),
        advantages=_floats(advantages, "advantages", n),
        media=refs,
        conversation=conversation,
        meta=extras,
    )
