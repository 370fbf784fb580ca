"""Choosing the next token for a batch of requests, each with its own sampling parameters.

One call handles the whole batch with tensor operations; only the uniform draw is per
row, from the request's own generator, so a seeded request samples the same tokens
whatever else shares its batch, but where another batch's rounding moves its logits by a
hair and the draw falls within that hair of a token's boundary (the CDF runs in token-id
order so that a boundary moves no more than the rounding: see :func:`_sample`).

The log-prob returned for a token is that of the raw model distribution
(``log_softmax(logits)``: temperature 1, no top-p), the quantity the trainer recomputes;
a request's ``logit_bias`` is added to its logits first (so its log-probs are those of the
biased distribution it samples from), and a request with ``scaled_logprobs`` gets them at
its temperature, ``log_softmax(logits / T)`` (SGLang's default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class RowSampler:
    """The sampling state of one request in the batch."""

    temperature: float
    top_p: float
    generator: torch.Generator
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    scaled_logprobs: bool = False
    """Report log-probs at ``temperature`` (log_softmax(logits / T)) rather than at 1."""


@dataclass(frozen=True)
class Sampled:
    """The tokens chosen for one batch, row by row."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]


def sample_next(logits: torch.Tensor, rows: Sequence[RowSampler]) -> Sampled:
    """Pick one token per row of ``logits`` (shape [batch, vocab]) under that row's parameters."""
    logits = logits.float()
    biased = [i for i, row in enumerate(rows) if row.logit_bias]
    if biased:
        logits = logits.clone()
        for i in biased:
            ids = torch.tensor([t for t, _ in rows[i].logit_bias if t < logits.shape[-1]], dtype=torch.long)
            values = torch.tensor([b for t, b in rows[i].logit_bias if t < logits.shape[-1]], dtype=torch.float32)
            logits[i].index_add_(0, ids, values)
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.argmax(dim=-1)
    sampled_rows = [i for i, row in enumerate(rows) if row.temperature > 0]
    if sampled_rows:
        index = torch.tensor(sampled_rows, dtype=torch.long)
        temperature = torch.tensor([rows[i].temperature for i in sampled_rows], dtype=torch.float32)
        top_p = torch.tensor([rows[i].top_p for i in sampled_rows], dtype=torch.float32)
        uniform = torch.stack([torch.rand((), generator=rows[i].generator) for i in sampled_rows])
        chosen[index] = _sample(logits[index] / temperature[:, None], top_p, uniform)
    scaled = [i for i, row in enumerate(rows) if row.scaled_logprobs and row.temperature > 0]
    if scaled:
        index = torch.tensor(scaled, dtype=torch.long)
        temperature = torch.tensor([rows[i].temperature for i in scaled], dtype=torch.float32)
        logprobs = logprobs.clone()
        logprobs[index] = torch.log_softmax(logits[index] / temperature[:, None], dim=-1)
    token_logprobs = logprobs.gather(1, chosen[:, None]).squeeze(1)
    top: list[list[tuple[int, float]] | None] = [None] * len(rows)
    for i, row in enumerate(rows):
        if row.top_logprobs > 0:
            values, ids = torch.topk(logprobs[i], row.top_logprobs)
            top[i] = list(zip(ids.tolist(), values.tolist(), strict=True))
    return Sampled(chosen.tolist(), token_logprobs.tolist(), top)


def _sample(scaled_logits: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling from softmax(scaled_logits), restricted to each row's top-p nucleus.

    The CDF runs over the vocabulary in token-id order, not in order of probability: a logit that
    moves by a rounding error (another batch, another kernel) then moves a boundary by as much,
    and changes the draw only if the uniform falls within it; in probability order two near-equal
    tokens would swap places and move the boundary by a whole token's mass."""
    probs = torch.softmax(scaled_logits, dim=-1)
    if bool((top_p < 1.0).any()):
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        # A token is outside the nucleus when the tokens before it already reach top_p;
        # the most likely token always stays in.
        outside = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p[:, None]
        probs = probs.masked_fill(torch.zeros_like(outside).scatter(1, sorted_ids, outside), 0.0)
    cdf = probs.cumsum(dim=-1)
    # right=True picks the first token whose CDF exceeds the draw, never a zero-probability one.
    position = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
    return position.clamp(max=cdf.shape[-1] - 1).squeeze(1)
