"""The rollout record that travels through the queue, and its msgpack encoding.

One record is one GRPO group: the ``n`` completions of one prompt, sampled with one weight version,
with their rewards and group advantages already computed on the rollout side. The prompt's media
travel as references (paths / URIs): the trainer re-reads them. The one exception is the images an
environment returned during a multi-turn episode (they exist nowhere else): PNG bytes, bounded in
size (:data:`MAX_EPISODE_IMAGE_BYTES`).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from cosmos_primitives.queue.errors import MalformedRecordError
from cosmos_primitives.utils.renamed import renamed_keyword

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.data.records import RolloutGroup

# content-part types of a Qwen2.5-VL conversation whose value is a media item
MEDIA_PART_TYPES = ("image", "video", "audio", "image_url", "video_url")
# what the rollout engines report (``cp.rollout``; vLLM's "repetition": stopped by its repetition
# detection; its "abort" / "error" completions are dropped by the engine, never recorded)
FINISH_REASONS = ("stop", "length", "repetition")
# deepest list / dict nesting accepted in a conversation (a chat message is 3-4 levels deep)
MAX_CONVERSATION_DEPTH = 32
# a log-probability above this (nats) is not a probability; the slack absorbs float rounding
_MAX_LOGPROB = 1e-3
# the trainer casts log-probs, rewards and advantages to float32: a value finite in float64 but beyond
# float32's range (1e300) becomes inf there and stops the step, so records are checked against this
FLOAT32_MAX = 3.4028234663852886e38
# the encoded size a record may take per token of its prompt and of each completion (a 9-byte
# msgpack int id, a 9-byte float64 log-prob, and up to 46 bytes of decoded text a token), plus a
# fixed allowance for ids, rewards, media references and meta: see record_byte_limit
BYTES_PER_TOKEN = 64
RECORD_BYTES_OVERHEAD = 64 << 10

# images an environment returned during a record's episodes: PNG bytes, at most this many bytes in all
# (record_byte_limit(..., episode_images=True) allows for them) and this many pixels a side
MAX_EPISODE_IMAGE_BYTES = 8 << 20
MAX_EPISODE_IMAGE_SIDE = 4096
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_JSON_SCALARS = (str, int, float, bool, type(None))


def _new_id() -> str:
    return uuid.uuid4().hex


class RolloutRecord(msgspec.Struct, kw_only=True):
    """One group of completions for one prompt, ready for the trainer.

    With ``n`` completions and ``L_i`` generated tokens in completion ``i``:

    - ``record_id``: unique id of this record, required. It is the idempotency key of the queue:
      the trainer trains on a record id once, however many copies of it were put (a put retried
      after a lost reply, a producer that re-sends after a crash). The producer assigns it once,
      when the record is made (:func:`record_from_group`: a uuid4), and every retry carries the
      same id; a consumer never invents one, since an id made at decode would differ for each copy
      and each would be trained. An id derived from the content was not chosen: two samplings that
      happen to agree (same prompt, tokens and version) are different data, and the content of a
      retried put is already the same bytes, so the producer-assigned id covers that case too.
    - ``prompt_id``: the prompt's id in the dataset; ``group_id``: id of this sampling of the prompt
      (several groups of one prompt have different group ids).
    - ``weight_version``: the policy weight version that sampled the completions (>= 0).
    - ``prompt_token_ids``: ``[P]`` int, the prompt as the engine saw it (vision placeholders included).
    - ``completions``: ``n`` decoded texts; ``completion_token_ids``: ``n`` lists ``[L_i]`` int;
      ``logprobs``: ``n`` lists ``[L_i]`` float, the sampling distribution's log-probability (nats)
      of each generated token; ``finish_reasons``: ``n`` of ``"stop"`` / ``"length"`` / ``"repetition"``.
    - ``rewards``, ``advantages``: ``[n]`` float.
    - ``loss_masks``: a multi-turn episode's ``n`` lists ``[L_i]`` of 1 (the model's tokens, trained) and
      0 (the environment's, context); empty: every token trained. ``turn_rewards``: ``n`` lists of the
      environment's reward after each model turn; empty for single-turn records. ``episode_images``:
      ``n`` lists of the images the environment returned in each episode, in order, as PNG bytes
      (:func:`encode_episode_image`; :data:`MAX_EPISODE_IMAGE_BYTES` in all); empty: none.
    - ``media``: references (paths / URIs) of the prompt's images and videos, in placeholder order.
    - ``conversation``: the prompt conversation, JSON-like (media parts hold references), or the
      prompt's plain text (a ``str``, used without a chat template).
    - ``meta``: small scalar extras (e.g. the reference answer).
    - ``created_at``: Unix time (seconds) when the record was made.

    Constructing or decoding a record runs :func:`check_record` (lengths that agree, finite
    numbers, known finish reasons, a non-empty prompt and conversation).
    """

    record_id: str
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
    loss_masks: list[list[int]] = msgspec.field(default_factory=list)
    turn_rewards: list[list[float]] = msgspec.field(default_factory=list)
    episode_images: list[list[bytes]] = msgspec.field(default_factory=list)
    media: list[str] = msgspec.field(default_factory=list)
    conversation: list[dict[str, Any]] | str = msgspec.field(default_factory=list)
    meta: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    created_at: float = msgspec.field(default_factory=time.time)

    def __post_init__(self) -> None:
        check_record(self)

    @property
    def num_completions(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        """Generated tokens over all completions (prompt not counted)."""
        return sum(len(ids) for ids in self.completion_token_ids)


def _check_episodes(record: RolloutRecord, n: int) -> None:
    """The multi-turn fields: one 0 / 1 loss mask per completion, as long as its tokens, training at
    least one token, and finite turn rewards."""
    for name in ("loss_masks", "turn_rewards", "episode_images"):
        got = len(getattr(record, name))
        if got not in (0, n):
            raise ValueError(f"{name} has {got} entries but there are {n} completions (or give none)")
    for i, (mask, ids) in enumerate(zip(record.loss_masks, record.completion_token_ids)):
        if len(mask) != len(ids):
            raise ValueError(f"loss_masks[{i}] has {len(mask)} entries for {len(ids)} token ids")
        if not set(mask) <= {0, 1}:
            raise ValueError(f"loss_masks[{i}] holds {sorted(set(mask) - {0, 1})}; a loss mask is 0 or 1 per token")
    total = sum(len(image) for images in record.episode_images for image in images)
    if total > MAX_EPISODE_IMAGE_BYTES:
        raise ValueError(f"episode_images hold {total} bytes, over the bound of {MAX_EPISODE_IMAGE_BYTES} "
                         "(MAX_EPISODE_IMAGE_BYTES); have the environment return smaller images")
    for i, images in enumerate(record.episode_images):
        for k, image in enumerate(images):
            if not image.startswith(PNG_SIGNATURE):
                raise ValueError(f"episode_images[{i}][{k}] is not PNG bytes; make records with record_from_group")
    for i, values in enumerate(record.turn_rewards):
        bad = [v for v in values if not abs(v) <= FLOAT32_MAX]
        if bad:
            raise ValueError(f"turn_rewards[{i}] holds {bad[0]}; rewards must be finite in float32")


def check_record(record: RolloutRecord, vocab_size: int | None = None) -> None:
    """Check that ``record`` can be trained on; the one validation of records (construction and decode).

    Checks: a non-empty ``record_id``; ``weight_version >= 0``; a non-empty prompt
    (``prompt_token_ids`` and ``conversation``); at least one completion and per-completion lists of
    one length; as many log-probs as token ids in each completion; token ids ``>= 0`` (and
    ``< vocab_size`` when given); log-probs that are not positive; rewards, advantages and ``meta``
    numbers finite in float32 (the trainer's dtype: ``1e300`` is refused); a finite ``created_at``;
    finish reasons in :data:`FINISH_REASONS`; a JSON-like conversation at most
    :data:`MAX_CONVERSATION_DEPTH` deep with media references (not media) that agree in number with ``media``.

    Raises:
        ValueError: naming the first field (and index) that is wrong and why.
    """
    if not record.record_id:
        raise ValueError("record_id is empty; the producer must give every record an id (record_from_group does)")
    if record.weight_version < 0:
        raise ValueError(f"weight_version is {record.weight_version}; it must be >= 0")
    if not record.prompt_token_ids:
        raise ValueError("prompt_token_ids is empty; a record needs the prompt the engine generated from")
    check_token_range(record, vocab_size)
    n = len(record.completions)
    if n == 0:
        raise ValueError("the record holds no completions")
    for name in ("completion_token_ids", "logprobs", "finish_reasons", "rewards", "advantages"):
        got = len(getattr(record, name))
        if got != n:
            raise ValueError(f"{name} has {got} entries but there are {n} completions")
    for i, (ids, lps) in enumerate(zip(record.completion_token_ids, record.logprobs)):
        if len(ids) != len(lps):
            raise ValueError(f"completion {i} has {len(ids)} token ids but {len(lps)} log-probs")
        # sum(), min() and max() run in C (a NaN or inf makes the sum non-finite); the slow scan only names the culprit
        if lps and not (math.isfinite(sum(lps)) and max(lps) <= _MAX_LOGPROB and min(lps) >= -FLOAT32_MAX):
            bad = next((lp for lp in lps if not -FLOAT32_MAX <= lp <= _MAX_LOGPROB), "values whose sum overflows")
            raise ValueError(f"logprobs[{i}] holds {bad}; log-probabilities must be <= 0 and finite in float32 "
                             f"(>= -{FLOAT32_MAX:.4g}), the dtype the trainer computes with")
    _check_episodes(record, n)
    for i, reason in enumerate(record.finish_reasons):
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish_reasons[{i}] is {reason!r}; expected one of {list(FINISH_REASONS)}")
    for name in ("rewards", "advantages"):
        for i, value in enumerate(getattr(record, name)):
            if not abs(value) <= FLOAT32_MAX:  # NaN fails too
                raise ValueError(f"{name}[{i}] is {value}; rewards and advantages must be finite in float32 "
                                 f"(|x| <= {FLOAT32_MAX:.4g}), the dtype the trainer casts them to")
    for key, value in record.meta.items():
        if isinstance(value, float) and not abs(value) <= FLOAT32_MAX:
            raise ValueError(f"meta[{key!r}] is {value}; numbers in meta must be finite in float32 (they are logged "
                             "as metrics)")
    if not math.isfinite(record.created_at):
        raise ValueError(f"created_at is {record.created_at}; it must be a finite Unix time")
    if not record.conversation:
        raise ValueError("conversation is empty; the trainer rebuilds the prompt from it, so records carry it")
    _check_json_like(record.conversation, "conversation")
    refs = media_references(record.conversation)
    if record.media and len(record.media) != len(refs):
        raise ValueError(f"media lists {len(record.media)} references but the conversation holds {len(refs)} "
                         "media parts")


def record_byte_limit(max_tokens: int, num_samples_per_prompt: int | None = None, *, episode_images: bool = False,
                      num_completions: int | None = None) -> int:
    """The largest encoded record (bytes) a trainer accepts: :data:`BYTES_PER_TOKEN` for each of the
    ``max_tokens`` a sequence may hold, for the prompt and each of its ``num_samples_per_prompt``
    completions, plus :data:`RECORD_BYTES_OVERHEAD`, plus :data:`MAX_EPISODE_IMAGE_BYTES` with
    ``episode_images`` (multi-turn runs). With ``[policy] model_max_length = 4096`` and 8 completions:
    2.4 MB; a record above it cannot fit the trainer's sequences whatever its content.
    ``num_completions`` is the older keyword of ``num_samples_per_prompt`` (``FutureWarning``)."""
    samples = renamed_keyword(num_samples_per_prompt, num_completions, new="num_samples_per_prompt",
                              old="num_completions", where="record_byte_limit")
    if samples is None:
        raise TypeError("record_byte_limit needs num_samples_per_prompt ([grpo] num_samples_per_prompt)")
    if max_tokens < 1 or samples < 1:
        raise ValueError(f"record_byte_limit(max_tokens={max_tokens}, num_samples_per_prompt={samples}): both "
                         "must be >= 1")
    images = MAX_EPISODE_IMAGE_BYTES if episode_images else 0
    return BYTES_PER_TOKEN * max_tokens * (samples + 1) + RECORD_BYTES_OVERHEAD + images


def encode_episode_image(image: Any) -> bytes:
    """PNG bytes (lossless) of an image an environment returned: a ``[H, W, 3]`` uint8 array or a PIL image."""
    import io

    import numpy as np
    from PIL import Image

    picture = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))
    out = io.BytesIO()
    picture.convert("RGB").save(out, format="PNG")
    return out.getvalue()


def decode_episode_image(data: bytes, where: str) -> Any:
    """The ``[H, W, 3]`` uint8 array of PNG ``data``; ``where`` names it in the ``ValueError`` for bytes
    that are not a PNG image or whose sides exceed :data:`MAX_EPISODE_IMAGE_SIDE` (checked before the
    pixels are decoded)."""
    import io

    import numpy as np
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as picture:
            if max(picture.size) > MAX_EPISODE_IMAGE_SIDE:
                raise ValueError(f"{where} is {picture.size[0]}x{picture.size[1]} pixels, over "
                                 f"{MAX_EPISODE_IMAGE_SIDE} a side (MAX_EPISODE_IMAGE_SIDE)")
            return np.asarray(picture.convert("RGB"))
    except ValueError:
        raise
    except Exception as exc:  # hostile bytes: any decoder failure is the record's fault
        raise ValueError(f"{where} cannot be decoded as a PNG image ({type(exc).__name__}: {exc})") from exc


def check_record_size(record: RolloutRecord, max_tokens: int) -> None:
    """Check that every sequence of ``record`` (its prompt followed by one completion) fits ``max_tokens``
    tokens (``[policy] model_max_length``), the longest sequence the trainer takes.

    Raises:
        ValueError: naming the completion, its length and the bound.
    """
    longest = max((len(ids) for ids in record.completion_token_ids), default=0)
    if len(record.prompt_token_ids) + longest > max_tokens:
        i = next(i for i, ids in enumerate(record.completion_token_ids) if len(ids) == longest)
        raise ValueError(f"its prompt ({len(record.prompt_token_ids)} tokens) and completion {i} ({longest} tokens) "
                         f"exceed the trainer's {max_tokens}-token sequences ([policy] model_max_length)")


def check_token_range(record: RolloutRecord, vocab_size: int | None = None) -> None:
    """Check that every token id of ``record`` is ``>= 0`` and, when ``vocab_size`` is given, below it.

    Raises:
        ValueError: naming the list and the first id out of range.
    """
    _check_ids(record.prompt_token_ids, "prompt_token_ids", vocab_size)
    for i, ids in enumerate(record.completion_token_ids):
        _check_ids(ids, f"completion_token_ids[{i}]", vocab_size)


def _check_ids(ids: list[int], name: str, vocab_size: int | None) -> None:
    if not ids:
        return
    low = min(ids)
    if low < 0:
        raise ValueError(f"{name} holds the token id {low}; token ids are >= 0")
    if vocab_size is not None and (high := max(ids)) >= vocab_size:
        raise ValueError(f"{name} holds the token id {high}, outside the vocabulary of {vocab_size} tokens "
                         "(a different tokenizer on the rollout side?)")


def _check_json_like(value: Any, where: str) -> None:
    # iterative, so that a hostile nesting depth is refused with a reason instead of a RecursionError
    stack = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, _JSON_SCALARS):
            continue
        if depth >= MAX_CONVERSATION_DEPTH:
            raise ValueError(f"{path} is nested deeper than {MAX_CONVERSATION_DEPTH} levels")
        if isinstance(item, list):
            stack += [(sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item)]
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"{path} has a non-string key {key!r}")
                stack.append((sub, f"{path}[{key!r}]", depth + 1))
        else:
            raise ValueError(
                f"{path} holds a {type(item).__name__}; records carry media as references (paths / URIs), "
                "never media bytes or decoded arrays"
            )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(RolloutRecord)


def encode_record(record: RolloutRecord) -> bytes:
    """The msgpack bytes of ``record`` (a map keyed by field name, so fields can be added later)."""
    return _ENCODER.encode(record)


def decode_record(data: bytes | bytearray | memoryview, entry_id: str = "<bytes>",
                  vocab_size: int | None = None, *, max_tokens: int | None = None,
                  max_bytes: int | None = None) -> RolloutRecord:
    """Decode and validate one record (:func:`check_record`, token ids against ``vocab_size``, sequences
    against ``max_tokens`` (:func:`check_record_size`) and the payload against ``max_bytes``, each when
    given: see :func:`record_byte_limit`).

    Never raises anything but :class:`MalformedRecordError` for bad content, whatever the bytes:
    this is the boundary where a consumer meets data it did not make.

    Raises:
        MalformedRecordError: naming ``entry_id`` (the stream entry) and what is wrong: not msgpack,
            nested too deep, a missing or mistyped field (with its path, e.g. ``$.weight_version``),
            or a failed check (lists of different lengths, a NaN log-prob, ...).
    """
    if max_bytes is not None and len(data) > max_bytes:  # refused before decoding a byte of it
        raise MalformedRecordError(entry_id, f"payload of {len(data)} bytes exceeds the trainer's bound of "
                                   f"{max_bytes} bytes (record_byte_limit of its sequence length)")
    try:
        record = _DECODER.decode(data)  # runs check_record without a vocabulary
        if vocab_size is not None:
            check_token_range(record, vocab_size)
        if max_tokens is not None:
            check_record_size(record, max_tokens)
        return record
    except msgspec.ValidationError as exc:  # a DecodeError (and a ValueError): caught first
        raise MalformedRecordError(entry_id, f"not a valid RolloutRecord: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MalformedRecordError(entry_id, f"payload of {len(data)} bytes is not msgpack ({exc})") from exc
    except ValueError as exc:  # check_token_range, check_record_size
        raise MalformedRecordError(entry_id, f"not a valid RolloutRecord: {exc}") from exc
    except RecursionError as exc:
        raise MalformedRecordError(entry_id, f"payload of {len(data)} bytes is nested too deep to decode") from exc
    except Exception as exc:  # any other failure on hostile bytes is the entry's fault too
        raise MalformedRecordError(entry_id, f"cannot decode it ({type(exc).__name__}: {exc})") from exc


def media_references(conversation: Sequence[Mapping[str, Any]] | str) -> list[str]:
    """The media references (paths / URIs) in a Qwen2.5-VL conversation, in order of appearance
    (none in a plain-text prompt).

    Content parts like ``{"type": "video", "video": "clips/a.mp4"}`` contribute their value; parts
    whose value is not a string (a decoded image, an array) raise, since they cannot be referenced.

    Raises:
        ValueError: naming the message and part index of an inline media item.
    """
    refs: list[str] = []
    if isinstance(conversation, str):
        return refs
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
        group_id: default ``"<prompt_id>:<8 hex>"``; record_id: default a fresh uuid4 hex.
        meta: small scalar extras; the prompt's ``reference`` answer is added as ``"reference"``
            when it is set.

    Raises:
        ValueError: rewards / advantages of the wrong length, decoded media in the conversation,
            episode images over :data:`MAX_EPISODE_IMAGE_BYTES` in all (``Completion.images``, the
            images the environment returned: carried as PNG bytes), or any failed
            :func:`check_record` (the record would be refused by the trainer).
    """
    n = len(group.completions)
    prompt = group.prompt
    conversation = prompt.conversation if isinstance(prompt.conversation, str) else list(prompt.conversation)
    refs = list(media) if media is not None else media_references(conversation)
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
        loss_masks=[list(c.loss_mask) if c.loss_mask is not None else [1] * len(c.token_ids)
                    for c in group.completions] if any(c.loss_mask is not None for c in group.completions) else [],
        turn_rewards=[[float(r) for r in c.turn_rewards] for c in group.completions]
        if any(c.turn_rewards for c in group.completions) else [],
        episode_images=[[encode_episode_image(image) for image in c.images] for c in group.completions]
        if any(c.images for c in group.completions) else [],
        media=refs,
        conversation=conversation,
        meta=extras,
    )
