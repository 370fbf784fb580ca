"""A step's numbers split by cause: how stale the samples were, what ended their episodes, where their tasks came from.

A bad step has a cause a whole-batch mean hides: samples many versions behind (asynchronous
training), episodes a budget cut short, or an inference engine whose log-probs drifted from the
trainer's. :class:`ByCause` adds up, per cause, the trained samples' reward, length, entropy, the
mismatch between the engine's and the trainer's log-probs for the same tokens (k3 estimate of
KL(engine || trainer), as :func:`~sandrl.train.losses.kl_k3` computes it), the importance ratio, and
the share of tokens the clip range and the importance sampling cut, so a step's metrics say which
part of the batch moved:

- ``stale_<n>``: samples sampled ``n`` weight versions before the step's update (``stale_3+`` for
  three or more), by the oldest token of each (sandrl records each token's version);
- ``stop_<reason>``: samples whose episode ended by ``reason`` (``submitted``, ``max_turns``,
  ``max_tokens``, ``wall_time``, ...; ``stop_unknown`` for samples that do not say);
- ``set_<name>``: samples whose task came from the task set ``name`` (the directory holding the
  task's, ``Trajectory.task_set``), only when a batch holds more than one.

Keys are ``<cause>/<stat>`` (``stale_1/mismatch_kl``), every cause present in the batch, on every
rank the same (the batch is), so the sums reduce across ranks as one tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sandrl.train.batch import TrainSample
from sandrl.train.importance import correction
from sandrl.train.loss_config import LossConfig
from sandrl.train.losses import kl_k3
from sandrl.train.micro_batches import MicroBatch
from sandrl.train.per_sample import per_sample_sum
from sandrl.train.world import World

STALE_CAP = 3
"""Samples this many versions behind or more share one cause (``stale_3+``)."""

_STATS = ("samples", "tokens", "reward", "length", "entropy", "mismatch", "ratio", "clipped", "masked", "truncated")


def causes(sample: TrainSample, version: int, *, by_set: bool = False) -> tuple[str, ...]:
    """The causes ``sample`` counts under, trained at weight ``version`` (and its task set, ``by_set``)."""
    behind = max(version - sample.weight_version, 0)
    stale = f"stale_{behind}" if behind < STALE_CAP else f"stale_{STALE_CAP}+"
    stop = f"stop_{sample.stop_reason or 'unknown'}"
    return (stale, stop, f"set_{sample.task_set or 'unknown'}") if by_set else (stale, stop)


class ByCause:
    """The sums of one step, by cause (see the module)."""

    def __init__(self, samples: Sequence[TrainSample], version: int, device: torch.device) -> None:
        by_set = len({s.task_set for s in samples}) > 1
        per_sample = [causes(s, version, by_set=by_set) for s in samples]
        self.keys = sorted({c for pair in per_sample for c in pair})
        index = {k: i for i, k in enumerate(self.keys)}
        self._rows = [[index[c] for c in pair] for pair in per_sample]
        self._samples = samples
        self._device = device
        # Summed on the host: a micro-batch's per-sample columns come back in one copy, and a
        # sample's row goes to each of its causes without a device copy per sample and cause.
        self.sums = torch.zeros((len(self.keys), len(_STATS)), dtype=torch.float64)

    @torch.no_grad()
    def add(
        self,
        mb: MicroBatch,
        positions: Sequence[int],
        config: LossConfig,
        *,
        logprobs: torch.Tensor,
        old: torch.Tensor | None,
        rollout: torch.Tensor | None,
        entropy: torch.Tensor | None,
    ) -> None:
        """One micro-batch, whose ``placements`` index ``positions`` (each a sample's place in the step's batch)."""
        keep = mb.loss_mask.to(torch.bool)
        ids = mb.sample_ids
        count = len(mb.placements)
        current = logprobs.detach()
        proximal = current if old is None else old.detach()

        def total(values: torch.Tensor) -> torch.Tensor:
            return per_sample_sum(values.to(torch.float64), ids, keep, count)

        zeros = torch.zeros(count, dtype=torch.float64, device=keep.device)
        tokens = total(torch.ones_like(current))
        ratio = torch.exp(torch.where(keep, current - proximal, 0.0))
        adv = mb.advantages
        clipped = ((adv < 0) & (ratio < 1 - config.epsilon_low)) | ((adv > 0) & (ratio > 1 + config.epsilon_high))
        mismatch = engine_ratio = masked = truncated = zeros
        if rollout is not None:
            delta = torch.where(keep, proximal - rollout, 0.0).to(torch.float64)
            mismatch, engine_ratio = total(kl_k3(torch.zeros_like(delta), delta)), total(torch.exp(delta))
            sampling = config.importance_sampling
            if sampling is not None:
                fix = correction(proximal, rollout, keep, sampling, sample_ids=ids, samples=count)
                if sampling.mode == "mask":
                    masked = total((fix.weights == 0).to(torch.float64))
                else:
                    low, high = sampling.band
                    truncated = total(((fix.weights >= high) | ((fix.weights <= low) & (low > 0))).to(torch.float64))
        spread = total(entropy) if entropy is not None else zeros
        columns = torch.stack(
            [tokens, spread, mismatch, engine_ratio, total(clipped.to(torch.float64)), masked, truncated], dim=1
        ).cpu()
        samples = [self._samples[positions[p.sample]] for p in mb.placements]
        known = torch.tensor([[1.0, s.reward, float(s.num_tokens)] for s in samples], dtype=torch.float64)
        values = torch.cat([known[:, :1], columns[:, :1], known[:, 1:], columns[:, 1:]], dim=1)
        rows = [(cause, k) for k, p in enumerate(mb.placements) for cause in self._rows[positions[p.sample]]]
        if rows:
            causes_t, samples_t = torch.tensor(rows).unbind(1)
            self.sums.index_add_(0, causes_t, values[samples_t])

    def reduce(self, world: World) -> None:
        self.sums = world.sum_tensor(self.sums.to(self._device)).cpu()

    def metrics(self) -> dict[str, float]:
        """``<cause>/<stat>``: samples, reward and length means per sample; the rest per model token."""
        out: dict[str, float] = {}
        for key, row in zip(self.keys, self.sums.tolist(), strict=True):
            stats = dict(zip(_STATS, row, strict=True))
            samples, tokens = max(stats["samples"], 1.0), max(stats["tokens"], 1.0)
            out[f"{key}/samples"] = stats["samples"]
            out[f"{key}/reward_mean"] = stats["reward"] / samples
            out[f"{key}/length_mean"] = stats["length"] / samples
            out[f"{key}/entropy"] = stats["entropy"] / tokens
            out[f"{key}/mismatch_kl"] = stats["mismatch"] / tokens
            out[f"{key}/ratio_mean"] = stats["ratio"] / tokens if stats["ratio"] else 1.0
            out[f"{key}/clip_frac"] = stats["clipped"] / tokens
            out[f"{key}/is_masked_frac"] = stats["masked"] / tokens
            out[f"{key}/is_truncated_frac"] = stats["truncated"] / tokens
        return out
