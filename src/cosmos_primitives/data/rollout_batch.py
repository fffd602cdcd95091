"""Rollout groups -> one right-padded training batch (prompt + completion rows, media repeated)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from cosmos_primitives.data.prompt_inputs import PER_SEQUENCE_KEYS, encode_prompts, media_inputs, repeat_batch
from cosmos_primitives.data.records import RolloutGroup

# (patch rows, one block of t*h*w per image / video; grid [blocks, 3]) in the order the processor
# and the model take them
_MEDIA = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


@attrs.define
class RolloutBatch:
    """What a GRPO step trains on; ``N`` = prompts x completions, ``T`` = longest prompt + completion.

    Attributes:
        inputs: model inputs: ``input_ids`` / ``attention_mask`` ``[N, T]`` (right padded), plus
            ``mm_token_type_ids`` and media tensors (``pixel_values``, ``image_grid_thw``, ...) for VLMs.
        completion_mask: ``[N, T]`` float32, 1 on completion tokens (aligned with ``input_ids``:
            position ``t`` holds token ``t``, whose log-prob is ``logprobs[:, t]``).
        rollout_logprobs: ``[N, T]`` float32, the engine's log-prob of each completion token, 0 elsewhere.
        group_index: ``[N]`` int64, index of the prompt (group) each row belongs to.
        completion_lengths: ``[N]`` int64.
        weight_versions: ``[N]`` int64, the policy version that generated each row.
        images_per_row, videos_per_row: ``[N]`` int64, how many image / video blocks of the media
            tensors each row owns (rows own consecutive blocks, in row order; counts may differ).
    """

    inputs: dict[str, torch.Tensor]
    completion_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    group_index: torch.Tensor
    completion_lengths: torch.Tensor
    weight_versions: torch.Tensor
    images_per_row: torch.Tensor
    videos_per_row: torch.Tensor

    def to(self, device: torch.device | str) -> RolloutBatch:
        return attrs.evolve(
            self,
            inputs={k: v.to(device) for k, v in self.inputs.items()},
            completion_mask=self.completion_mask.to(device),
            rollout_logprobs=self.rollout_logprobs.to(device),
        )

    def __len__(self) -> int:
        return int(self.completion_mask.shape[0])

    def rows(self, rows: slice) -> dict[str, torch.Tensor]:
        """The model inputs of a contiguous row range, e.g. one micro-batch.

        ``input_ids`` / ``attention_mask`` / ``mm_token_type_ids`` are cut to ``[R, T]``; the media
        tensors keep only the blocks those rows own (``pixel_values`` ``[P_rows, D]`` with
        ``image_grid_thw`` ``[images, 3]``, the same for videos, ``second_per_grid_ts``
        ``[videos]``), found through ``images_per_row`` / ``videos_per_row``. A media kind the rows
        hold none of is left out, as the processor leaves it out of a batch without it.

        Raises:
            ValueError: ``rows`` has a step other than 1.
        """
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise ValueError(f"RolloutBatch.rows takes a contiguous slice, got step {step}")
        stop = max(start, stop)
        out = {k: v[start:stop] for k, v in self.inputs.items() if k in PER_SEQUENCE_KEYS}
        for (values_key, grid_key), per_row in zip(_MEDIA, (self.images_per_row, self.videos_per_row)):
            first, last = int(per_row[:start].sum()), int(per_row[:stop].sum())
            if grid_key not in self.inputs or first == last:
                continue
            patches = self.inputs[grid_key].prod(dim=-1)
            out[values_key] = self.inputs[values_key][int(patches[:first].sum()) : int(patches[:last].sum())]
            out[grid_key] = self.inputs[grid_key][first:last]
            if grid_key == "video_grid_thw" and "second_per_grid_ts" in self.inputs:
                out["second_per_grid_ts"] = self.inputs["second_per_grid_ts"][first:last]
        return out

    def subset(self, rows: slice) -> RolloutBatch:
        """The batch of a contiguous row range (``[grpo] rollouts_per_step``: one optimizer step's rows);
        its inputs as :meth:`rows` cuts them."""
        return RolloutBatch(inputs=self.rows(rows), completion_mask=self.completion_mask[rows],
                            rollout_logprobs=self.rollout_logprobs[rows], group_index=self.group_index[rows],
                            completion_lengths=self.completion_lengths[rows],
                            weight_versions=self.weight_versions[rows], images_per_row=self.images_per_row[rows],
                            videos_per_row=self.videos_per_row[rows])


    def lengths(self) -> torch.Tensor:
        """``[N]`` int64 tokens of each row: one past its last ``attention_mask`` position (0 for an
        empty row)."""
        mask = self.inputs["attention_mask"].bool()
        positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
        return (mask * positions).amax(dim=1) if mask.shape[1] else mask.new_zeros(mask.shape[0], dtype=torch.int64)

    def select(self, indices: Sequence[int]) -> RolloutBatch:
        """The batch of rows ``indices`` (any rows, in that order; a token-budget micro-batch), its
        columns cut to the longest of those rows (``[R, T']`` with ``T' = max lengths()[indices]``:
        only padding is dropped). The media tensors keep the blocks those rows own, in row order,
        as :meth:`rows` does.

        Raises:
            ValueError: no index, or one out of range.
        """
        index = [int(i) for i in indices]
        if not index or min(index) < -len(self) or max(index) >= len(self):
            raise ValueError(f"RolloutBatch.select: indices {index} must be a non-empty list of rows of a "
                             f"{len(self)}-row batch")
        index = [i % len(self) for i in index]
        rows = torch.tensor(index, dtype=torch.long)
        width = max(1, int(self.lengths()[rows.to(self.completion_mask.device)].max()))
        device_rows = rows.to(self.completion_mask.device)
        inputs = {k: v[device_rows, :width] for k, v in self.inputs.items() if k in PER_SEQUENCE_KEYS}
        for (values_key, grid_key), per_row in zip(_MEDIA, (self.images_per_row, self.videos_per_row)):
            if grid_key not in self.inputs or not int(per_row[rows].sum()):
                continue
            block_starts = torch.cat([per_row.new_zeros(1), per_row.cumsum(0)]).tolist()
            patches = self.inputs[grid_key].prod(dim=-1)
            patch_starts = torch.cat([patches.new_zeros(1), patches.cumsum(0)]).tolist()
            blocks = [b for i in index for b in range(block_starts[i], block_starts[i + 1])]
            patch_rows = [p for b in blocks for p in range(patch_starts[b], patch_starts[b + 1])]
            values = self.inputs[values_key]
            inputs[values_key] = values[torch.tensor(patch_rows, dtype=torch.long, device=values.device)]
            grid = self.inputs[grid_key]
            block_index = torch.tensor(blocks, dtype=torch.long, device=grid.device)
            inputs[grid_key] = grid[block_index]
            if grid_key == "video_grid_thw" and "second_per_grid_ts" in self.inputs:
                seconds = self.inputs["second_per_grid_ts"]
                inputs["second_per_grid_ts"] = seconds[block_index.to(seconds.device)]
        return RolloutBatch(inputs=inputs, completion_mask=self.completion_mask[device_rows, :width],
                            rollout_logprobs=self.rollout_logprobs[device_rows, :width],
                            group_index=self.group_index[rows], completion_lengths=self.completion_lengths[rows],
                            weight_versions=self.weight_versions[rows], images_per_row=self.images_per_row[rows],
                            videos_per_row=self.videos_per_row[rows])


def collate_rollouts(groups: Sequence[RolloutGroup], processor: Any, pad_token_id: int | None = None) -> RolloutBatch:
    """Build the training batch of ``groups`` (every group must hold the same number of completions).

    Each row is the group's ``prompt_token_ids`` (the prompt the engine generated from) followed by
    a completion, so the trainer scores exactly what was sampled; a multi-turn episode's environment
    tokens (``Completion.loss_mask`` 0) are context, left out of ``completion_mask``. The prompts are re-encoded with
    ``processor`` only to recover their media tensors; the re-encoding must hold the same tokens
    except for where vision blocks open and close (:func:`same_prompt_tokens`: vLLM writes a
    Qwen3-VL video without the template's outer ``<|vision_start|>`` / ``<|vision_end|>``,
    transformers 5's processor keeps them), and ``mm_token_type_ids`` are laid on the engine's ids.
    Completions that carry images an environment returned (``Completion.images``) give their rows
    media of their own: the prompt's, then those images, row by row, with their placeholders marked in
    ``mm_token_type_ids``.
    """
    if not groups:
        raise ValueError("collate_rollouts: no rollout groups")
    n = len(groups[0].completions)
    if any(len(g.completions) != n for g in groups):
        raise ValueError(f"collate_rollouts: groups hold different numbers of completions: "
                         f"{[len(g.completions) for g in groups]}")
    tokenizer = getattr(processor, "tokenizer", processor)
    pad = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
    prompts = [g.prompt for g in groups]
    encoded = encode_prompts(processor, prompts)
    markers = vision_block_markers(tokenizer)
    for g, row, mask in zip(groups, encoded["input_ids"], encoded["attention_mask"]):
        if not same_prompt_tokens(row[mask.bool()].tolist(), g.prompt_token_ids, markers):
            raise ValueError(f"prompt {g.prompt.prompt_id!r}: re-encoding the prompt gave different token ids than "
                             "the rollout engine used; is the same processor / chat template used for both?")
    if any(c.images for g in groups for c in g.completions):
        media = media_inputs(processor, [attrs.evolve(g.prompt, images=[*g.prompt.images, *c.images])
                                          for g in groups for c in g.completions])
    else:
        media = repeat_batch({k: v for k, v in encoded.items() if k not in PER_SEQUENCE_KEYS}, prompts, n)
    rows: list[list[int]] = []
    prompt_lengths: list[int] = []
    logprob_rows: list[list[float]] = []
    trained: list[list[int] | None] = []  # a multi-turn episode's loss mask (its environment tokens are 0)
    for g in groups:
        for c in g.completions:
            if c.loss_mask is not None and len(c.loss_mask) != len(c.token_ids):
                raise ValueError(f"prompt {g.prompt.prompt_id!r}: a completion's loss_mask has {len(c.loss_mask)} "
                                 f"entries for {len(c.token_ids)} tokens")
            rows.append(list(g.prompt_token_ids) + list(c.token_ids))
            prompt_lengths.append(len(g.prompt_token_ids))
            logprob_rows.append(list(c.logprobs))
            trained.append(c.loss_mask)
    width = max(len(r) for r in rows)
    count = len(rows)
    input_ids = torch.full((count, width), pad, dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    completion_mask = torch.zeros((count, width), dtype=torch.float32)
    rollout_logprobs = torch.zeros((count, width), dtype=torch.float32)
    for i, (ids, start, lps, loss_mask) in enumerate(zip(rows, prompt_lengths, logprob_rows, trained)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        completion_mask[i, start : len(ids)] = 1.0 if loss_mask is None else torch.tensor(loss_mask,
                                                                                          dtype=torch.float32)
        rollout_logprobs[i, start : start + len(lps)] = torch.tensor(lps, dtype=torch.float32)
    inputs: dict[str, torch.Tensor] = {"input_ids": input_ids, "attention_mask": attention_mask, **media}
    if "mm_token_type_ids" in encoded:
        # vision placeholders are marked per prompt token; completions hold none
        inputs["mm_token_type_ids"] = torch.zeros_like(input_ids)
        for p, (types, row, mask) in enumerate(zip(encoded["mm_token_type_ids"], encoded["input_ids"],
                                                    encoded["attention_mask"])):
            prompt_types = _types_on(groups[p].prompt_token_ids, row[mask.bool()].tolist(), types[mask.bool()],
                                     markers)
            for i in range(p * n, (p + 1) * n):
                inputs["mm_token_type_ids"][i, : len(prompt_types)] = prompt_types
        for i, c in enumerate(c for g in groups for c in g.completions):
            if c.images:  # the environment's image placeholders; a model token is text to the model
                start = prompt_lengths[i]
                types = torch.tensor(processor.create_mm_token_type_ids([list(c.token_ids)])[0], dtype=torch.long)
                if c.loss_mask is not None:
                    types = types * (1 - torch.tensor(c.loss_mask, dtype=torch.long))
                inputs["mm_token_type_ids"][i, start : start + len(types)] = types.to(inputs["mm_token_type_ids"].dtype)
    return RolloutBatch(
        inputs=inputs,
        completion_mask=completion_mask,
        rollout_logprobs=rollout_logprobs,
        group_index=torch.arange(len(groups)).repeat_interleave(n),
        completion_lengths=torch.tensor([len(c.token_ids) for g in groups for c in g.completions]),
        weight_versions=torch.tensor([g.weight_version for g in groups for _ in g.completions]),
        images_per_row=torch.tensor([len(g.prompt.images) + len(c.images) for g in groups for c in g.completions]),
        videos_per_row=torch.tensor([len(g.prompt.videos) for g in groups]).repeat_interleave(n),
    )


def vision_block_markers(tokenizer: Any) -> frozenset[int]:
    """The ids of ``<|vision_start|>`` / ``<|vision_end|>`` in ``tokenizer``'s vocabulary (none for a
    tokenizer without them)."""
    # convert_tokens_to_ids, not get_vocab(): the fast tokenizers build the whole 152k-entry dict on
    # every get_vocab() call (0.3 s), and the trainer asks once per record
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return frozenset()
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = (convert(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    return frozenset(i for i in ids if isinstance(i, int) and i != unknown)


def same_prompt_tokens(encoded: Sequence[int], engine: Sequence[int], markers: frozenset[int]) -> bool:
    """Whether a prompt re-encoded by the trainer's processor (``encoded``) and the prompt an engine
    generated from (``engine``) hold the same tokens once the vision-block markers (``markers``: the
    ``<|vision_start|>`` / ``<|vision_end|>`` ids) are left out of both. Text, placeholders and their
    order must agree; only where vision blocks open and close may differ, as vLLM's and transformers'
    Qwen3-VL video prompts do (docs/vllm.md)."""
    if list(encoded) == list(engine):
        return True
    return [t for t in encoded if t not in markers] == [t for t in engine if t not in markers]


def _types_on(engine: Sequence[int], encoded: Sequence[int], types: torch.Tensor,
              markers: frozenset[int]) -> torch.Tensor:
    """``mm_token_type_ids`` ``[len(engine)]`` for the engine's prompt ids: the processor's type of each
    token (``types`` ``[len(encoded)]``), markers 0 (they are text to the model)."""
    if list(engine) == list(encoded):
        return types
    kept = iter(types[torch.tensor([t not in markers for t in encoded], dtype=torch.bool)].tolist())
    return torch.tensor([0 if t in markers else next(kept) for t in engine], dtype=types.dtype)
