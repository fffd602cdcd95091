"""A data rank's world-model prompts (with their clips) in a resumable order, and fixed evaluation prompts."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from cosmos_primitives.config.wfm import WFMDataConfig
from cosmos_primitives.data.bad_samples import (
    BadSampleBudgetExceeded,
    BadSampleError,
    BadSampleTracker,
    bad_sample_boundary,
)
from cosmos_primitives.data.prompt_streaming import prompt_stream
from cosmos_primitives.data.sampler import ResumableDistributedSampler
from cosmos_primitives.data.wfm_clips import build_wfm_dataset, collate_clips
from cosmos_primitives.data.wfm_webdataset import build_wfm_webdataset


class WFMPromptSource:
    """This rank's prompts (with their clips) as ``[wfm.data]`` describes them, and where the run is in them.

    A map-style dataset (``kind = "mock"`` / ``"clip_folder"``) is read in the order of a resumable
    shuffled sampler; a web dataset (``kind = "webdataset"``) is a stream of tar shards whose reader
    knows its own position. ``bad`` counts the bad samples against ``bad_sample_budget``
    (``[train.train_policy.dataset]``). A checkpoint saves :meth:`state_dict` per rank (pass the
    source as ``CheckpointManager(sampler=...)``): the position (the sampler's, or the reader's epoch,
    shard and samples read) and the bad-sample counts, so a resumed run goes on where the saved one
    was with the budget it had left.

    Args:
        data: ``[wfm.data]``.
        seed: the shuffle's seed (``[train] seed``).
        rank, world_size: this reader among the readers of distinct prompts (the ranks of one
            ``[wfm] group_ranks`` group share a reader rank).
        per_step: prompts per step (``[wfm] rollout_batch_size``).
        bad_sample_budget: bad samples allowed before the run stops (-1: any number).
    """

    def __init__(self, data: WFMDataConfig, *, seed: int, rank: int, world_size: int, per_step: int,
                 bad_sample_budget: int) -> None:
        self.rank, self.per_step = rank, per_step
        self.position: Any
        if data.kind == "webdataset":
            def reader() -> Any:
                return build_wfm_webdataset(data, seed=seed, rank=rank, world_size=world_size,
                                            bad_sample_budget=bad_sample_budget)

            self.dataset, self.position = None, reader()
            self.bad: BadSampleTracker = self.position.bad
            self._eval_reader = reader  # a fresh reader: the stream's first items
        else:
            self.dataset = build_wfm_dataset(data, seed=seed)
            self.position = ResumableDistributedSampler(len(self.dataset), rank=rank, world_size=world_size, seed=seed)
            self.bad = BadSampleTracker(bad_sample_budget)

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def state_dict(self) -> dict[str, Any]:
        if self.dataset is None:
            return self.position.state_dict()  # the reader's state holds its bad-sample counts
        return {"sampler": self.position.state_dict(), "bad_samples": self.bad.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dataset is None:
            self.position.load_state_dict(state)
        elif "sampler" in state:
            self.position.load_state_dict(state["sampler"])
            self.bad.load_state_dict(state["bad_samples"])
        else:  # a checkpoint from before bad-sample counts were saved: the sampler's state alone
            self.position.load_state_dict(state)

    def steps_per_epoch(self) -> int:
        """Steps of ``per_step`` prompts in one pass over this rank's share (a map-style dataset only)."""
        if self.dataset is None:  # check_runnable refuses this config first
            raise ValueError('[wfm.data] kind = "webdataset" streams without a length: set [train] max_steps')
        return math.ceil(len(self.position) / self.per_step)

    def stream(self) -> Iterator[dict[str, Any]]:
        """The items (``collate_clips`` inputs), forever, from the current (possibly restored) position."""
        if self.dataset is None:
            return iter(self.position)
        return prompt_stream(self.dataset, self.position, self.bad)

    def eval_prompts(self) -> tuple[dict[str, Any], list[int]]:
        """``per_step`` fixed items, collated, and their ids: the dataset's from index ``rank * per_step``
        on, or the first good items of this rank's stream."""
        if self.dataset is None:
            stream = iter(self._eval_reader())
            items = [next(stream) for _ in range(self.per_step)]
            return collate_clips(items), list(range(self.per_step))
        return fixed_prompts(self.dataset, self.rank * self.per_step, self.per_step, self.bad)


def fixed_prompts(dataset: Any, first: int, count: int, bad: BadSampleTracker) -> tuple[dict[str, Any], list[int]]:
    """``count`` fixed items from index ``first`` on (wrapping), collated, and their indices; bad items
    are recorded in ``bad`` and passed over (an item repeats when the dataset has fewer good ones)."""
    items, indices = [], []
    for offset in range(len(dataset)):
        if len(items) == count:
            break
        index = (first + offset) % len(dataset)
        try:
            with bad_sample_boundary(f"sample {index}"):
                items.append(dataset[index])
            indices.append(index)
        except BadSampleError as error:
            bad.record(error, sample=f"evaluation {index}")
    if not items:
        raise BadSampleBudgetExceeded(f"no good item for the evaluation prompts.\n{bad.report()}")
    picks = [i % len(items) for i in range(count)]
    return collate_clips([items[i] for i in picks]), [indices[i] for i in picks]
