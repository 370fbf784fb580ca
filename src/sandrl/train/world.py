"""The training ranks this process belongs to: its rank, how many there are, sums across them.

A trainer that runs alone (no ``torch.distributed`` process group) is rank 0 of 1, and every
collective here is the identity, so the same code trains in one process or in many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        """This process's place in the default process group (rank 0 of 1 without one)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def distributed(self) -> bool:
        return self.size > 1 or (dist.is_available() and dist.is_initialized())

    def sum(self, values: Sequence[float], device: torch.device) -> list[float]:
        """Each value summed over the ranks (float64, so counts stay exact)."""
        if not self.distributed:
            return [float(v) for v in values]
        total = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return [float(v) for v in total.tolist()]

    def sum_tensor(self, table: torch.Tensor) -> torch.Tensor:
        """``table`` summed over the ranks, in place (each rank fills the rows it computed, zeros elsewhere)."""
        if self.distributed:
            dist.all_reduce(table)
        return table

    def share(self, count: int) -> tuple[list[int], int]:
        """This rank's items of ``range(count)`` (round robin) and how many each rank runs (the most any has).

        Every rank forwards the same number of micro-batches, because FSDP2 gathers and reduces in
        collectives that all ranks must join: a rank with fewer real ones runs empty ones.
        """
        mine = list(range(self.rank, count, self.size))
        return mine, -(-count // self.size)
