"""An endless stream of one rank's prompts, epoch after epoch, skipping bad rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cosmos_primitives.data.bad_samples import (
    BadSampleBudgetExceeded,
    BadSampleError,
    BadSampleTracker,
    bad_sample_boundary,
)
from cosmos_primitives.data.sampler import ResumableDistributedSampler


def prompt_stream(dataset: Any, sampler: ResumableDistributedSampler, bad: BadSampleTracker) -> Iterator[Any]:
    """``dataset[i]`` for the indices ``sampler`` yields, forever: at the end of an epoch the sampler
    moves to the next one. A row that raises (any ``Exception``, as a :class:`BadSampleError`) is
    recorded in ``bad`` (which raises past its budget) and skipped; a whole epoch without one good row
    raises :class:`BadSampleBudgetExceeded`. The sampler's state is the stream's position (resumable)."""
    while True:
        good, whole_epoch = 0, sampler.position == 0
        for index in sampler:
            try:
                with bad_sample_boundary(f"sample {index}"):  # any error of one row skips that row
                    item = dataset[index]
            except BadSampleError as error:
                bad.record(error, sample=index)
                continue
            good += 1
            yield item
        if good == 0 and whole_epoch and len(sampler) > 0:
            # an unlimited budget must not turn an all-bad dataset into an endless loop
            raise BadSampleBudgetExceeded(f"every sample of epoch {sampler.epoch} was bad.\n{bad.report()}")
        sampler.set_epoch(sampler.epoch + 1)
