"""Seeds derived from keys: stable across processes and versions, unrelated for neighbouring keys."""

from __future__ import annotations

import torch

from cosmos_primitives.utils import derived_generator, derived_seed


def test_derived_seed_depends_on_the_keys_alone() -> None:
    # pinned: a resumed run in another process (or release) must derive the very same seeds
    assert derived_seed(0, 1, 0, "x") == 1245354867688368356
    seeds = {derived_seed(7, step, rank, "rollout", i) for step in range(50) for rank in range(4) for i in range(8)}
    assert len(seeds) == 50 * 4 * 8 and all(0 <= s < 2**63 for s in seeds)
    assert derived_seed(1, 2) != derived_seed(2, 1) and derived_seed(1, "2") != derived_seed(1, 2)


def test_derived_generator_replays_its_stream() -> None:
    first = torch.rand(5, generator=derived_generator(3, 10, "window"))
    assert torch.equal(first, torch.rand(5, generator=derived_generator(3, 10, "window")))
    assert not torch.equal(first, torch.rand(5, generator=derived_generator(3, 11, "window")))
