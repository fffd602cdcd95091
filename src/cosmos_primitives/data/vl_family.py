"""What the data pipeline must know about each Qwen-VL family, in one small description per family.

Everything else (token ids, merge size, patch size, pixel budgets) is read from the model's config
or processor; only the facts that change *rules* live here:

- how a video sits in the token sequence: Qwen2.5-VL puts a whole video in one run of video pads
  whose temporal positions advance with its seconds (``tokens_per_second * second_per_grid_ts``);
  Qwen3-VL gives every temporal patch (two frames) its own ``<|vision_start|>`` ... block, preceded
  by its timestamp as text (``<1.5 seconds>``), all of one temporal position;
- whether the processor must keep video frames that are already sized (multiples of its pixel
  factor): Qwen3-VL's video processor budgets a whole clip, not a frame, so it would resize frames
  qwen-vl-utils already sized (the Qwen3-VL release passes ``do_resize=False`` after qwen-vl-utils).

A further family is one more :class:`VLFamily` given to :func:`register_vl_family`.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(frozen=True)
class VLFamily:
    """One vision-language family.

    ``model_type``: ``config.model_type`` (``"qwen2_5_vl"``); ``processor_class``: its processor's
    class name; ``video_frames_are_blocks``: each temporal patch of a video is its own vision block
    (separated by timestamp text) rather than one block for the whole video;
    ``keep_sized_videos``: frames whose sides are multiples of the processor's pixel factor go in
    with ``do_resize=False``.
    """

    model_type: str
    processor_class: str
    video_frames_are_blocks: bool = False
    keep_sized_videos: bool = False


QWEN2_5_VL = VLFamily("qwen2_5_vl", "Qwen2_5_VLProcessor")
QWEN3_VL = VLFamily("qwen3_vl", "Qwen3VLProcessor", video_frames_are_blocks=True, keep_sized_videos=True)

_FAMILIES: dict[str, VLFamily] = {}


def register_vl_family(family: VLFamily) -> VLFamily:
    """Make ``family`` known by its ``model_type`` and ``processor_class`` (a later one replaces)."""
    _FAMILIES[family.model_type] = family
    _FAMILIES[family.processor_class] = family
    return family


for _family in (QWEN2_5_VL, QWEN3_VL):
    register_vl_family(_family)


def vl_family(config: Any) -> VLFamily:
    """The family of a model config (or a model holding one as ``.config``), by ``model_type``.

    Raises:
        ValueError: an unknown ``model_type``, naming the known ones.
    """
    config = getattr(config, "config", config)
    model_type = str(getattr(config, "model_type", ""))
    family = _FAMILIES.get(model_type)
    if family is None:
        known = sorted({f.model_type for f in _FAMILIES.values()})
        raise ValueError(f"no vision-language family for model_type {model_type!r} (known: {known}); "
                         "describe it with cosmos_primitives.data.vl_family.register_vl_family")
    return family


def vl_family_of_processor(processor: Any) -> VLFamily:
    """The family of a VL processor, by class name; Qwen2.5-VL's rules for an unknown class (a
    processor subclass or wrapper keeps its base family when its class name is registered too)."""
    for cls in type(processor).__mro__:
        family = _FAMILIES.get(cls.__name__)
        if family is not None:
            return family
    return QWEN2_5_VL


def pixel_patch_size(processor: Any, default: int = 14) -> int:
    """The vision encoder's patch size a processor sizes media for (``image_processor.patch_size``;
    14: Qwen2.5-VL, 16: Qwen3-VL); ``default`` for a plain tokenizer or ``None``."""
    image_processor = getattr(processor, "image_processor", None)
    return int(getattr(image_processor, "patch_size", None) or default)


def video_processor_kwargs(processor: Any, videos: Any) -> dict[str, Any]:
    """The processor's ``videos_kwargs`` for ``videos`` (``[T, H, W, 3]`` arrays) already sampled
    and sized as qwen-vl-utils does: no resampling, and no resizing of frames already at a multiple
    of the pixel factor (families with ``keep_sized_videos``; others keep them through their own
    per-frame bounds with ``cap_pixels_per_frame=False``)."""
    kwargs: dict[str, Any] = {"do_sample_frames": False}
    video_processor = getattr(processor, "video_processor", None)
    if hasattr(video_processor, "cap_pixels_per_frame"):
        kwargs["cap_pixels_per_frame"] = False
    factor = 2 * pixel_patch_size(processor)
    sized = all(int(v.shape[1]) % factor == 0 and int(v.shape[2]) % factor == 0 for v in videos)
    if vl_family_of_processor(processor).keep_sized_videos and sized:
        kwargs["do_resize"] = False
    return kwargs
