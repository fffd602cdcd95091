"""An endless stream of one rank's prompts, epoch after epoch, skipping bad rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cosmos_primitives.data.bad_samples import BadSampleError, BadSampleTracker
from cosmos_primitives.data.sampler import ResumableDistributedSampler


def prompt_stream(dataset: Any, sampler: ResumableDistributedSampler, bad: BadSampleTracker) -> Iterator[Any]:
    """``dataset[i]`` for the indices ``sampler`` yields, forever: at the end of an epoch the sampler
    moves to the next one. A row that raises :class:`BadSampleError` is recorded in ``bad`` (which
    raises past its budget) and skipped. The sampler's state is the stream's position (resumable)."""
    while True:
        for index in sampler:
            try:
                yield dataset[index]
            except BadSampleError as error:
                bad.record(error, sample=index)
        sampler.set_epoch(sampler.epoch + 1)
