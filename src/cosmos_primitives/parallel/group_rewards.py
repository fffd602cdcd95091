"""Rewards of a prompt group spread over several data-parallel ranks (``[wfm] group_ranks``)."""

from __future__ import annotations

import torch

from cosmos_primitives.parallel.distributed import all_gather_object


def gather_group_rewards(rewards: torch.Tensor, *, data_rank: int, group_ranks: int, cp_rank: int = 0) -> torch.Tensor:
    """The rewards of every data rank of this rank's group, collective over the whole process group.

    Data ranks ``g * group_ranks .. (g + 1) * group_ranks - 1`` form group ``g``; the ranks of one
    context-parallel group hold the same rewards, so only ``cp_rank == 0`` rows are kept.

    Args:
        rewards: ``[n]`` this rank's rewards (the same ``n`` on every rank).
        data_rank: this rank's data-parallel index; cp_rank: its index in its context-parallel group.

    Returns:
        ``[group_ranks, n]`` float32 on ``rewards``' device, row ``i`` from data rank
        ``g * group_ranks + i``; this rank's row is ``data_rank % group_ranks``.

    Raises:
        RuntimeError: when the group's ranks did not all report (sizes that do not fit the world).
    """
    mine = data_rank // group_ranks
    rows = {rank: values for rank, cp, values in all_gather_object((data_rank, cp_rank, rewards.tolist()))
            if cp == 0 and rank // group_ranks == mine}
    expected = range(mine * group_ranks, (mine + 1) * group_ranks)
    if sorted(rows) != list(expected):
        raise RuntimeError(f"group {mine} of {group_ranks} data ranks got rewards from data ranks {sorted(rows)}; "
                           f"expected {list(expected)} ([wfm] group_ranks must divide the data-parallel size)")
    return torch.tensor([rows[r] for r in expected], dtype=torch.float32, device=rewards.device)
