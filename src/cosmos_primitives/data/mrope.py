"""3-D multimodal rotary position ids (mRoPE) of one Qwen-VL sequence (Qwen2.5-VL, Qwen3-VL).

Rule (the Qwen2.5-VL release; vLLM computes the same for generation):
text tokens advance all three axes together by one per token; a vision block of grid
``(t, h, w)`` patches (``h' = h / merge``, ``w' = w / merge`` tokens per side) starting at
position ``s`` gets temporal ``s + floor(i_t * interval)``, height ``s + i_h``, width ``s + i_w``,
where ``interval = tokens_per_second * second_per_grid`` for videos (0 steps for an image's single
temporal slice); text after a block resumes at ``max(all positions so far) + 1``.

Qwen3-VL (:attr:`MRopeSpec.video_frames_are_blocks`) splits a video of ``t`` temporal patches into
``t`` blocks of grid ``(1, h, w)``, each after its own timestamp text (``<1.5 seconds>``), so every
frame block is laid out as an image; this equals transformers' ``Qwen3VLModel.get_rope_index``.

Note: ``transformers`` 5.x ``Qwen2_5_VLModel.get_rope_index`` resumes text after a video at
``s + max(h', w')`` instead, which differs when ``(t - 1) * interval >= max(h', w')`` (long,
low-resolution videos); for images and short videos both agree. We keep the release rule so that
training positions match those of the vLLM rollout engine and of the released checkpoints.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from cosmos_primitives.data.vl_family import vl_family


@attrs.define(frozen=True)
class MRopeSpec:
    """The model constants mRoPE positions depend on (read them with :meth:`from_config`).

    ``video_frames_are_blocks``: each temporal patch of a video is its own block (Qwen3-VL, see
    :class:`~cosmos_primitives.data.vl_family.VLFamily`); ``tokens_per_second`` then plays no part.
    """

    image_token_id: int = 151655
    video_token_id: int = 151656
    spatial_merge_size: int = 2
    tokens_per_second: float = 2.0
    video_frames_are_blocks: bool = False

    @classmethod
    def from_config(cls, config: Any) -> MRopeSpec:
        """From a Qwen-VL config (``Qwen2_5_VLConfig``, ``Qwen3VLConfig``; or a model holding one as
        ``.config``); the family comes from ``config.model_type``.

        Raises:
            ValueError: an unknown family, or one that times video positions without
                ``vision_config.tokens_per_second``.
        """
        config = getattr(config, "config", config)
        family = vl_family(config)
        vision = config.vision_config
        tokens_per_second = getattr(vision, "tokens_per_second", None)
        if tokens_per_second is None and not family.video_frames_are_blocks:
            raise ValueError(f"{config.model_type} config has no vision_config.tokens_per_second, which its video "
                             "positions need; add it to the model's config.json")
        return cls(image_token_id=int(config.image_token_id), video_token_id=int(config.video_token_id),
                   spatial_merge_size=int(vision.spatial_merge_size),
                   tokens_per_second=float(tokens_per_second or 0.0),
                   video_frames_are_blocks=family.video_frames_are_blocks)


def mrope_position_ids(input_ids: torch.Tensor, spec: MRopeSpec, image_grid_thw: torch.Tensor | None = None,
                       video_grid_thw: torch.Tensor | None = None,
                       second_per_grid_ts: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids ``[3, L]`` int64 (temporal, height, width) of one unpadded sequence.

    Args:
        input_ids: ``[L]`` with each image / video expanded to its ``t * h' * w'`` pad tokens.
        image_grid_thw: ``[num_images, 3]`` patch grids, in order of appearance.
        video_grid_thw: ``[num_videos, 3]``; ``second_per_grid_ts``: ``[num_videos]`` seconds of video
            per temporal patch (default 1.0; unused with ``spec.video_frames_are_blocks``, where the
            ``t`` frame blocks of a video are separate runs of ``h' * w'`` pad tokens).

    Raises:
        ValueError: the pad-token runs do not match the grids.
    """
    ids = input_ids.tolist()
    video_grids = _rows(video_grid_thw)
    seconds = [1.0] * len(video_grids)
    if second_per_grid_ts is not None:
        seconds = [float(x) for x in torch.as_tensor(second_per_grid_ts).reshape(-1).tolist()]
    if spec.video_frames_are_blocks:
        # one (1, h, w) block per temporal patch; all at one temporal position, so no seconds
        video_grids = [[1, h, w] for t, h, w in video_grids for _ in range(t)]
        seconds = [0.0] * len(video_grids)
    grids = {spec.image_token_id: _rows(image_grid_thw), spec.video_token_id: video_grids}
    used = {spec.image_token_id: 0, spec.video_token_id: 0}
    merge = spec.spatial_merge_size
    pieces: list[torch.Tensor] = []
    next_pos, i, length = 0, 0, len(ids)
    while i < length:
        token = ids[i]
        if token not in grids:
            j = i
            while j < length and ids[j] not in grids:
                j += 1
            pieces.append(torch.arange(next_pos, next_pos + j - i).expand(3, -1))
            next_pos += j - i
            i = j
            continue
        k = used[token]
        if k >= len(grids[token]):
            raise ValueError(f"more vision blocks of token {token} in input_ids than grids given ({k})")
        t, h, w = grids[token][k]
        h, w = h // merge, w // merge
        n = t * h * w
        if ids[i:i + n] != [token] * n:
            raise ValueError(f"vision block {k} of token {token} at position {i} should span {n} tokens "
                             f"(grid {t}x{h}x{w} after merging)")
        # float32 like the processor's second_per_grid_ts, so rounding matches the model's own code
        interval = torch.tensor(seconds[k] if token == spec.video_token_id else 0.0, dtype=torch.float32)
        temporal = (torch.arange(t) * (spec.tokens_per_second * interval)).long()
        block = torch.stack([
            temporal.view(t, 1, 1).expand(t, h, w),
            torch.arange(h).view(1, h, 1).expand(t, h, w),
            torch.arange(w).view(1, 1, w).expand(t, h, w),
        ]).reshape(3, n) + next_pos
        pieces.append(block)
        next_pos = int(block.max()) + 1
        used[token] = k + 1
        i += n
    for token, count in used.items():
        if count != len(grids[token]):
            raise ValueError(f"{len(grids[token])} grids given for token {token} but {count} blocks found")
    if not pieces:
        return torch.zeros(3, 0, dtype=torch.long)
    return torch.cat(pieces, dim=1).to(torch.long)


def _rows(grid: torch.Tensor | None) -> list[list[int]]:
    return [] if grid is None else [[int(v) for v in row] for row in torch.as_tensor(grid).reshape(-1, 3).tolist()]
