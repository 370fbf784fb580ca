"""Micro-batches: which samples are forwarded together, and the tensors of one forward.

Two layouts, chosen by ``[train] packing``:

- **packed** (the default): samples laid end to end in rows, position ids restarting at 0 for every
  sample and no attention mask, which is the Hugging Face models' own packed-sequence path (their
  mask builder reads the restarts as sample boundaries and lets no token attend across one).
  A row is ``row_tokens`` wide (at least the micro-batch's longest sample). When the model attends
  within each sample without a mask (flash-attention's varlen kernel, or sandrl's
  :mod:`~sandrl.train.packed_attention`, which the trainer switches SDPA and eager models to), a
  row is the whole ``micro_batch_tokens``, since attention costs what each sample's own does.
  Otherwise (flex attention, a sliding window) attention runs over a row's whole width, masked,
  so rows stay narrow enough that attention costs less than the linear layers
  (:func:`row_tokens`).
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
    def sample_ids(self) -> torch.Tensor:
        """``[rows, width]`` long: each position's sample, as its place in :attr:`placements` (0, 1, ...), or
        -1 on padding; what sequence-level losses sum over (:mod:`sandrl.train.per_sample`)."""
        out = torch.full(self.input_ids.shape, -1, dtype=torch.long, device=self.input_ids.device)
        for k, p in enumerate(self.placements):
            out[p.row, p.offset : p.offset + p.length] = k
        return out

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


def row_tokens(max_tokens: int, *, hidden_size: int, varlen: bool) -> int:
    """How wide a packed row may be: the whole budget with a varlen attention; else ``3 x hidden_size``.

    Masked attention over a row of width ``W`` costs about ``4 W h`` FLOPs a token, the linear layers
    of a Llama/Qwen block about ``24 h^2``: at ``W = 3h`` attention is half of them, and the padding
    that packing removes is worth more than that.
    """
    return max_tokens if varlen else min(max_tokens, 3 * hidden_size)


def plan(lengths: Sequence[int], max_tokens: int, *, packing: bool, row_tokens: int = 0) -> list[list[int]]:
    """The samples of each micro-batch (indices into ``lengths``, row after row), within the token budget.

    Samples are taken longest first. Padded: rows of similar length share a micro-batch. Packed
    (see the module docstring): each micro-batch's rows are ``row_tokens`` wide, or as wide as its
    first (longest) sample if that is more, filled first fit; :func:`collate` lays out the same rows
    from this order. A sample longer than the budget is forwarded alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plans: list[list[int]] = []
    if not packing:
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
    rows: list[list[int]] = []
    room: list[int] = []
    width = 0
    for i in order:
        fits = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if fits is not None:
            rows[fits].append(i)
            room[fits] -= lengths[i]
            continue
        if rows and (len(rows) + 1) * width > max_tokens:
            plans.append([i for row in rows for i in row])
            rows, room = [], []
        if not rows:
            width = max(row_tokens, lengths[i])
        rows.append([i])
        room.append(width - lengths[i])
    if rows:
        plans.append([i for row in rows for i in row])
    return plans


def collate(
    samples: Sequence[TrainSample],
    index: Sequence[int],
    *,
    pad_id: int,
    packing: bool = False,
    row_tokens: int = 0,
    device: torch.device | str = "cpu",
) -> MicroBatch:
    """The samples ``samples[i] for i in index`` as one micro-batch on ``device``.

    Packed, in the order :func:`plan` gives: a row (``row_tokens`` wide, or as wide as the first
    sample) is filled until the next sample does not fit, then the next row starts; this lays out
    exactly the rows the plan filled first fit. Padded: one sample a row.
    """
    rows = [samples[i] for i in index]
    placements: list[Placement] = []
    if packing:
        width = max(row_tokens, rows[0].num_tokens)
        row, offset = 0, 0
        for i, s in zip(index, rows, strict=True):
            if offset and offset + s.num_tokens > width:
                row, offset = row + 1, 0
            placements.append(Placement(i, row, offset, s.num_tokens))
            offset += s.num_tokens
        shape = (row + 1, max(p.offset + p.length for p in placements))
    else:
        placements = [Placement(i, row, 0, s.num_tokens) for row, (i, s) in enumerate(zip(index, rows, strict=True))]
        shape = (len(rows), max(s.num_tokens for s in rows))
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    # Packed: the padding at a row's end counts as a sequence of its own (positions from 0), which
    # nothing attends to from a sample and no loss reads.
    positions = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    rollout = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    ends = [0] * shape[0]
    for p, s in zip(placements, rows, strict=True):
        span = slice(p.offset, p.offset + p.length)
        ids[p.row, span] = torch.tensor(s.token_ids, dtype=torch.long)
        attention[p.row, span] = 1
        positions[p.row, span] = torch.arange(p.length)
        mask[p.row, span] = torch.tensor(s.loss_mask, dtype=torch.float32)
        advantages[p.row, span] = s.advantage
        if s.rollout_logprobs is not None:
            rollout[p.row, span] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        ends[p.row] = max(ends[p.row], p.offset + p.length)
    if packing:
        for r, end in enumerate(ends):
            positions[r, end:] = torch.arange(shape[1] - end)
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=None if packing else attention.to(device),
        position_ids=positions.to(device) if packing else None,
        loss_mask=mask.to(device),
        rollout_logprobs=rollout.to(device),
        advantages=advantages.to(device),
        placements=tuple(placements),
    )
