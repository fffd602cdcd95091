"""3-D multimodal rotary position ids (mRoPE) of one Qwen2.5-VL sequence.

Rule (the Qwen2.5-VL release; vLLM computes the same for generation):
text tokens advance all three axes together by one per token; a vision block of grid
``(t, h, w)`` patches (``h' = h / merge``, ``w' = w / merge`` tokens per side) starting at
position ``s`` gets temporal ``s + floor(i_t * interval)``, height ``s + i_h``, width ``s + i_w``,
where ``interval = tokens_per_second * second_per_grid`` for videos (0 steps for an image's single
temporal slice); text after a block resumes at ``max(all positions so far) + 1``.

Note: ``transformers`` 5.x ``Qwen2_5_VLModel.get_rope_index`` resumes text after a video at
``s + max(h', w')`` instead, which differs when ``(t - 1) * interval >= max(h', w')`` (long,
low-resolution videos); for images and short videos both agree. We keep the release rule so that
training positions match those of the vLLM rollout engine and of the released checkpoints.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch


@attrs.define(frozen=True)
class MRopeSpec:
    """The model constants mRoPE positions depend on (read them with :meth:`from_config`)."""

    image_token_id: int = 151655
    video_token_id: int = 151656
    spatial_merge_size: int = 2
    tokens_per_second: float = 2.0

    @classmethod
    def from_config(cls, config: Any) -> MRopeSpec:
        """From a ``Qwen2_5_VLConfig`` (or a model holding one as ``.config``)."""
        config = getattr(config, "config", config)
        vision = config.vision_config
        return cls(image_token_id=int(config.image_token_id), video_token_id=int(config.video_token_id),
                   spatial_merge_size=int(vision.spatial_merge_size),
                   tokens_per_second=float(vision.tokens_per_second))


def mrope_position_ids(input_ids: torch.Tensor, spec: MRopeSpec, image_grid_thw: torch.Tensor | None = None,
                       video_grid_thw: torch.Tensor | None = None,
                       second_per_grid_ts: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids ``[3, L]`` int64 (temporal, height, width) of one unpadded sequence.

    Args:
        input_ids: ``[L]`` with each image / video expanded to its ``t * h' * w'`` pad tokens.
        image_grid_thw: ``[num_images, 3]`` patch grids, in order of appearance.
        video_grid_thw: ``[num_videos, 3]``; ``second_per_grid_ts``: ``[num_videos]`` seconds of video
            per temporal patch (default 1.0).

    Raises:
        ValueError: the pad-token runs do not match the grids.
    """
    ids = input_ids.tolist()
    grids = {spec.image_token_id: _rows(image_grid_thw), spec.video_token_id: _rows(video_grid_thw)}
    seconds = [1.0] * len(grids[spec.video_token_id])
    if second_per_grid_ts is not None:
        seconds = [float(x) for x in torch.as_tensor(second_per_grid_ts).reshape(-1).tolist()]
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
