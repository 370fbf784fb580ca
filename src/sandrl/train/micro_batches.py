"""Micro-batches: which samples are forwarded together, and the tensors of one forward.

Two layouts, chosen by ``[train] packing``:

- **packed** (the default): samples laid end to end in one row of at most ``micro_batch_tokens``
  tokens, position ids restarting at 0 for every sample and no attention mask, which is the
  Hugging Face models' own packed-sequence path (their mask builder reads the restarts as sample
  boundaries and lets no token attend across one; flash-attention's varlen kernel does the same on
  GPU). Almost nothing is padding.
- **padded**: one sample per row, right-padded to the longest row of the micro-batch.

Everything the loss needs per token (loss mask, rollout log-probs, advantages, weights, the
proximal and reference log-probs) is laid out the same way through :meth:`MicroBatch.take`, so
both layouts train exactly the same tokens with the same numbers. Plans depend only on the
samples' lengths, so a resumed run (or another rank) forwards exactly the same micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sandrl.train.batch import TrainSample


@dataclass(frozen=True)
class Placement:
    """Where one sample's tokens sit in a micro-batch."""

    sample: int
    """Its index in the list the micro-batch was collated from."""
    row: int
    offset: int
    length: int


@dataclass(frozen=True)
class MicroBatch:
    """The tensors of one forward; all ``[rows, width]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    """1 on tokens, 0 on padding; None when packed (the position ids mark the samples)."""
    position_ids: torch.Tensor | None
    """Restarting at 0 for every sample when packed; None when padded (the model counts from 0)."""
    loss_mask: torch.Tensor
    """Float, 0 on padding and on the first token of every sample."""
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    """Each token carries its sample's advantage."""
    placements: tuple[Placement, ...]

    @property
    def index(self) -> tuple[int, ...]:
        """The samples in this micro-batch, in the order they were placed."""
        return tuple(p.sample for p in self.placements)

    @property
    def tokens(self) -> int:
        return sum(p.length for p in self.placements)

    @property
    def slots(self) -> int:
        """Positions forwarded, padding included."""
        return int(self.input_ids.numel())

    def take(self, table: torch.Tensor) -> torch.Tensor:
        """A ``[samples, tokens]`` table (a row per sample, aligned with its tokens) in this layout; 0 elsewhere."""
        out = torch.zeros(self.input_ids.shape, dtype=table.dtype, device=table.device)
        for p in self.placements:
            out[p.row, p.offset : p.offset + p.length] = table[p.sample, : p.length]
        return out

    def put(self, values: torch.Tensor, table: torch.Tensor) -> None:
        """Write ``values`` (in this layout) into the rows of ``table`` that belong to these samples."""
        for p in self.placements:
            table[p.sample, : p.length] = values[p.row, p.offset : p.offset + p.length]


def plan(lengths: Sequence[int], max_tokens: int, *, packing: bool) -> list[list[int]]:
    """The samples of each micro-batch (indices into ``lengths``), within the token budget.

    A sample longer than the budget is forwarded alone. Samples are taken longest first: padded
    rows of similar length share a micro-batch, and packed bins fill up (first fit decreasing).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if not packing:
        plans: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Longest first: the first row of a micro-batch is its widest.
            if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
                plans.append(current)
                current = []
            current.append(i)
        if current:
            plans.append(current)
        return plans
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max(max_tokens - lengths[i], 0))
    return bins


def collate(
    samples: Sequence[TrainSample],
    index: Sequence[int],
    *,
    pad_id: int,
    packing: bool = False,
    device: torch.device | str = "cpu",
) -> MicroBatch:
    """The samples ``samples[i] for i in index`` as one micro-batch on ``device`` (packed or right-padded)."""
    rows = [samples[i] for i in index]
    if packing:
        placements, offset = [], 0
        for i, s in zip(index, rows, strict=True):
            placements.append(Placement(i, 0, offset, s.num_tokens))
            offset += s.num_tokens
        shape = (1, offset)
    else:
        placements = [Placement(i, row, 0, s.num_tokens) for row, (i, s) in enumerate(zip(index, rows, strict=True))]
        shape = (len(rows), max(s.num_tokens for s in rows))
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    rollout = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    for p, s in zip(placements, rows, strict=True):
        span = slice(p.offset, p.offset + p.length)
        ids[p.row, span] = torch.tensor(s.token_ids, dtype=torch.long)
        attention[p.row, span] = 1
        positions[p.row, span] = torch.arange(p.length)
        mask[p.row, span] = torch.tensor(s.loss_mask, dtype=torch.float32)
        advantages[p.row, span] = s.advantage
        if s.rollout_logprobs is not None:
            rollout[p.row, span] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=None if packing else attention.to(device),
        position_ids=positions.to(device) if packing else None,
        loss_mask=mask.to(device),
        rollout_logprobs=rollout.to(device),
        advantages=advantages.to(device),
        placements=tuple(placements),
    )
