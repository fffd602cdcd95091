"""Turn one conversation + its media into token ids, assistant-only labels, positions and pixel tensors.

Labels: the tokens of every assistant message's content and its closing ``<|im_end|>`` are
trained; everything else — system and user turns, vision tokens, the ``<|im_start|>assistant\\n``
header and the newline after ``<|im_end|>`` — is ``-100``. Labels are aligned with ``input_ids``
the Hugging Face way (``labels[t]`` is the target *at* position ``t``; the loss shifts by one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from cosmos_primitives.data.conversation import ConversationSample
from cosmos_primitives.data.mrope import MRopeSpec, mrope_position_ids
from cosmos_primitives.data.video_sampling import video_metadata
from cosmos_primitives.data.vl_family import video_processor_kwargs

IGNORE_INDEX = -100
MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


@attrs.define
class EncodedSample:
    """One encoded training sample (no batch dimension).

    ``input_ids``: ``[L]`` int64; ``labels``: ``[L]`` int64, ``-100`` where not trained;
    ``position_ids``: ``[3, L]`` int64 mRoPE (temporal, height, width) for Qwen-VL models, ``[L]`` for
    text models; ``pixel_values``: ``[num_image_patches, C * 2 * patch * patch]`` float32 and
    ``image_grid_thw``: ``[num_images, 3]`` int64; ``pixel_values_videos`` / ``video_grid_thw`` the
    same for videos, ``second_per_grid_ts``: ``[num_videos]`` float32 seconds per temporal patch
    (Qwen2.5-VL only).
    ``source``: a path or id naming the sample in messages.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    source: str = ""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_target_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def is_multimodal_rope(self) -> bool:
        return self.position_ids.dim() == 2


def encode_conversation(processor: Any, sample: ConversationSample | list[dict[str, Any]], *,
                        mrope: MRopeSpec | None = None, images: Sequence[np.ndarray] = (),
                        videos: Sequence[np.ndarray] = (), video_fps: Sequence[float] = (),
                        video_meta: Sequence[dict[str, Any] | None] = ()) -> EncodedSample:
    """Encode a whole conversation for training.

    Args:
        processor: a Qwen-VL processor (Qwen2.5-VL, Qwen3-VL; has ``.tokenizer`` and ``.image_processor``), or a plain
            tokenizer with a chat template for text-only models.
        sample: a :class:`ConversationSample` (its media are used) or a bare conversation, in which
            case ``images`` / ``videos`` (``[T, H, W, 3]`` uint8) / ``video_fps`` give the media, with
            ``video_meta`` (:attr:`~cosmos_primitives.data.SampledVideo.metadata` of each video: source
            fps and frame indices) when known, else the frames are taken as consecutive at ``video_fps``.
        mrope: the model's mRoPE constants (``MRopeSpec.from_config(model.config)``); required with a
            VL processor, ignored for a tokenizer.
    """
    source = ""
    if isinstance(sample, ConversationSample):
        conversation, images, videos, video_fps = sample.conversation, sample.images, sample.videos, sample.video_fps
        video_meta = sample.video_metadata
        source = sample.media_paths[0] if sample.media_paths else sample.sample_id
    else:
        conversation = sample
    tokenizer = getattr(processor, "tokenizer", processor)
    is_vl = hasattr(processor, "image_processor")
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    if is_vl:
        if mrope is None:
            raise ValueError("encoding for a Qwen-VL processor needs mrope=MRopeSpec.from_config(model.config)")
        if len(video_fps) != len(videos):
            raise ValueError(f"{len(videos)} videos but {len(video_fps)} video_fps values")
        kwargs: dict[str, Any] = {}
        if images:
            kwargs["images"] = list(images)
        if videos:
            kwargs["videos"] = list(videos)
            metadata = list(video_meta) or [None] * len(videos)
            if len(metadata) != len(videos):
                raise ValueError(f"{len(videos)} videos but {len(metadata)} video_metadata entries")
            # frames are already sampled and sized: the processor keeps them, with their source timing
            videos_kwargs = {"video_metadata": [video_metadata(len(v), f, m)
                                                for v, f, m in zip(videos, video_fps, metadata)],
                             **video_processor_kwargs(processor, videos)}
            kwargs["videos_kwargs"] = videos_kwargs
        out = processor(text=[text], return_tensors="pt", **kwargs)
        input_ids = out["input_ids"][0].to(torch.long)
        media = {key: out[key] for key in MEDIA_KEYS if key in out}
        if "second_per_grid_ts" in media:
            media["second_per_grid_ts"] = torch.as_tensor(media["second_per_grid_ts"], dtype=torch.float32)
        for key in ("image_grid_thw", "video_grid_thw"):
            if key in media:
                media[key] = media[key].to(torch.long)
        position_ids = mrope_position_ids(input_ids, mrope, media.get("image_grid_thw"), media.get("video_grid_thw"),
                                          media.get("second_per_grid_ts"))
    else:
        if images or videos or _has_media(conversation):
            raise ValueError("the conversation has images or videos but a text-only tokenizer was given; "
                             "pass the model's Qwen-VL processor")
        input_ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        media = {}
        position_ids = torch.arange(input_ids.shape[0])
    labels = assistant_labels(input_ids, tokenizer, expected_turns=sum(m["role"] == "assistant" for m in conversation))
    return EncodedSample(input_ids=input_ids, labels=labels, position_ids=position_ids, source=source, **media)


def assistant_labels(input_ids: torch.Tensor, tokenizer: Any, expected_turns: int | None = None) -> torch.Tensor:
    """``labels`` ``[L]``: ``input_ids`` on assistant content + its ``<|im_end|>``, ``-100`` elsewhere.

    Assistant turns are found by their ``<|im_start|>assistant\\n`` header (the Qwen chat format).

    Raises:
        ValueError: ``expected_turns`` is given and a different number of headers was found.
    """
    ids = input_ids.tolist()
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    role = tokenizer.encode("assistant", add_special_tokens=False)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    header = [im_start, *role]
    turns, i, n = 0, 0, len(ids)
    while i < n:
        if ids[i:i + len(header)] != header:
            i += 1
            continue
        start = i + len(header)
        if ids[start:start + len(newline)] == newline:
            start += len(newline)
        end = start
        while end < n and ids[end] != im_end:
            end += 1
        end = min(end + 1, n)  # the closing <|im_end|> is a target: it teaches the model to stop
        labels[start:end] = input_ids[start:end]
        turns += 1
        i = end
    if expected_turns is not None and turns != expected_turns:
        raise ValueError(f"found {turns} '<|im_start|>assistant' headers in the tokenized conversation but it has "
                         f"{expected_turns} assistant messages; is the chat template a Qwen (ChatML) template?")
    return labels


def _has_media(conversation: list[dict[str, Any]]) -> bool:
    return any(isinstance(m["content"], list) and any(p.get("type") in ("image", "video") for p in m["content"])
               for m in conversation)
