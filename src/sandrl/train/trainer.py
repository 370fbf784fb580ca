"""The trainer: one policy update per batch, supervised warm-start steps, checkpoints, weight export.

:meth:`Trainer.step` does not know whether its batch came from the synchronous or the
asynchronous driver: every sample carries the log-probs it was sampled with, and the loss
corrects for the difference (:mod:`sandrl.train.losses`). A step

1. recomputes, when it needs them, the proximal log-probs (with several minibatches) and the
   reference log-probs (with a KL term) in no-grad forwards,
2. for each minibatch, forwards micro-batches that fit ``micro_batch_tokens`` and accumulates their
   gradients (each token's weight in the loss is fixed over the whole minibatch beforehand, so the
   split into micro-batches does not change the result),
3. clips the gradient norm and takes one AdamW step, which bumps the weight version.

A batch with no model token to train (an all-zero loss mask, or only groups without signal)
changes nothing: no update, no optimizer state, no new version.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import TrainError
from sandrl.inference.model import save_weights
from sandrl.inference.tokenizer import Tokenizer
from sandrl.train import checkpoint
from sandrl.train.batch import Batch, MicroBatch, TrainSample, collate, plan_micro_batches
from sandrl.train.config import TrainConfig
from sandrl.train.device import torch_device
from sandrl.train.losses import policy_loss, sft_loss, token_weights

Metrics = dict[str, float]


@dataclass(frozen=True)
class ExportedWeights:
    """A policy written for the inference server's ``/update_weights_from_disk``."""

    path: Path
    version: int
    """The trainer's weight version; pass it to the server so its samples are tagged with it."""


@dataclass
class _Sums:
    loss: float = 0.0
    tokens: int = 0
    clipped_low: int = 0
    clipped_high: int = 0
    is_weight: float = 0.0
    is_truncated: int = 0
    kl: float = 0.0
    grad_norm: float = 0.0
    updates: int = 0


class Trainer:
    """Updates a Hugging Face causal LM (anything with ``model(input_ids, attention_mask).logits``
    and ``save_pretrained``) with the GRPO family of losses or supervised cross-entropy."""

    def __init__(
        self,
        model: Any,
        config: TrainConfig | None = None,
        *,
        tokenizer: Tokenizer | None = None,
        reference: Any = None,
    ) -> None:
        """``reference`` is the KL reference policy (``loss.beta > 0``); by default a frozen copy of ``model``."""
        self.config = config or TrainConfig()
        self.device = torch_device(self.config.device)
        self.model = model.to(self.device).train()
        self.tokenizer = tokenizer
        pad = tokenizer.pad_token_id if tokenizer is not None else getattr(model.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.reference: Any = None
        if self.config.loss.beta > 0:
            self.reference = (reference if reference is not None else copy.deepcopy(model)).to(self.device).eval()
            self.reference.requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise TrainError("the model has no trainable parameters (all have requires_grad=False)")
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.config.lr,
            betas=(self.config.adam_beta1, self.config.adam_beta2),
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
        )
        self.steps = 0
        """Batches consumed (``step`` and ``sft_step`` calls)."""
        self.version = 0
        """Optimizer updates so far: the version of the weights :meth:`export_weights` writes."""
        self.data_position = 0
        """Where the driver's data stream stands; set it before saving, read it after loading."""
        self.data_done: tuple[int, ...] = ()
        """Positions above ``data_position`` the driver already consumed; saved and restored with it."""

    # -- steps ---------------------------------------------------------------------------------

    def step(self, batch: Batch | Iterable[TrainSample]) -> Metrics:
        """One policy update on ``batch`` (samples with advantages, see ``samples_from_groups``); its metrics."""
        if not isinstance(batch, Batch):
            batch = Batch.of(batch)
        samples = batch.samples
        loss_cfg = self.config.loss
        if loss_cfg.tis_cap is not None and any(s.rollout_logprobs is None for s in samples):
            raise TrainError(
                "importance sampling (loss.tis_cap) needs each sample's rollout_logprobs; "
                "give them, or set tis_cap to None"
            )
        parts = _split(len(samples), self.config.minibatches) if samples else []
        need_old = len(parts) > 1
        old = self._no_grad_logprobs(self.model, samples) if need_old else None
        ref = self._no_grad_logprobs(self.reference, samples) if self.reference is not None else None
        sums = _Sums()
        for part in parts:
            part_samples = [samples[i] for i in part]
            mask = collate(part_samples, range(len(part)), pad_id=self.pad_id, device=self.device).loss_mask
            weights = token_weights(mask, loss_cfg)
            for plan in plan_micro_batches([s.num_tokens for s in part_samples], self.config.micro_batch_tokens):
                mb = collate(part_samples, plan, pad_id=self.pad_id, device=self.device)
                width = mb.input_ids.shape[1]
                rows = [part[i] for i in plan]
                logprobs = self._logprobs(self.model, mb)
                out = policy_loss(
                    logprobs,
                    mb.advantages,
                    mb.loss_mask,
                    loss_cfg,
                    old_logprobs=_rows(old, rows, width),
                    rollout_logprobs=mb.rollout_logprobs,
                    ref_logprobs=_rows(ref, rows, width),
                    weights=weights[list(plan), :width],
                )
                if out.tokens:
                    torch.autograd.backward(out.loss)
                sums.loss += float(out.loss.detach())
                sums.tokens += out.tokens
                sums.clipped_low += out.clipped_low
                sums.clipped_high += out.clipped_high
                sums.is_weight += out.is_weight_sum
                sums.is_truncated += out.is_truncated
                sums.kl += out.kl_sum
            self._update(sums, any(s.num_model_tokens for s in part_samples))
        self.steps += 1
        tokens = max(sums.tokens, 1)
        staleness = [self.version - sums.updates - s.weight_version for s in samples] or [0]
        return {
            **self._common_metrics(sums, samples),
            "loss": sums.loss / max(len(parts), 1),
            "groups": float(batch.groups),
            "zero_signal_groups": float(batch.zero_signal_groups),
            "zero_signal_samples": float(batch.zero_signal_samples),
            "reward_mean": batch.reward_mean,
            "advantage_abs_mean": sum(abs(s.advantage) for s in samples) / max(len(samples), 1),
            "clip_low_frac": sums.clipped_low / tokens,
            "clip_high_frac": sums.clipped_high / tokens,
            "is_weight_mean": sums.is_weight / tokens if sums.tokens else 1.0,
            "is_truncated_frac": sums.is_truncated / tokens,
            "kl_mean": sums.kl / tokens,
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": float(max(staleness)),
        }

    def sft_step(self, samples: Iterable[TrainSample]) -> Metrics:
        """One supervised update: masked cross-entropy on the model tokens (the mean over all of them)."""
        items = list(samples)
        total = sum(s.num_model_tokens for s in items)
        sums = _Sums()
        for plan in plan_micro_batches([s.num_tokens for s in items], self.config.micro_batch_tokens):
            mb = collate(items, plan, pad_id=self.pad_id, device=self.device)
            tokens = int(mb.loss_mask.sum())
            loss = sft_loss(self._logprobs(self.model, mb), mb.loss_mask, total_tokens=total)
            if tokens:
                torch.autograd.backward(loss)
            sums.loss += float(loss.detach())
            sums.tokens += tokens
        self._update(sums, total > 0)
        self.steps += 1
        return {**self._common_metrics(sums, items), "loss": sums.loss}

    def logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """The current policy's log-prob of every token (0 for the first), aligned with ``token_ids``."""
        table = self._no_grad_logprobs(self.model, samples)
        return [table[i, : s.num_tokens].tolist() for i, s in enumerate(samples)]

    def greedy_reproduces(self, samples: Sequence[TrainSample]) -> list[bool]:
        """Whether greedy decoding would write each sample's model tokens exactly.

        With teacher forcing, the argmax at every model-token position equals that token iff
        greedy decoding from the sample's prompt generates them: one forward pass, no sampling.
        """
        out = [False] * len(samples)
        with torch.no_grad():
            for plan in plan_micro_batches([s.num_tokens for s in samples], self.config.micro_batch_tokens):
                mb = collate(samples, plan, pad_id=self.pad_id, device=self.device)
                logits = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
                wrong = (logits.argmax(-1) != mb.input_ids[:, 1:]) & (mb.loss_mask[:, 1:] > 0)
                for row, i in enumerate(mb.index):
                    out[i] = not bool(wrong[row].any())
        return out

    def lr_at(self, update: int) -> float:
        """The learning rate of update number ``update`` (0-based): linear warmup, then constant or a cosine."""
        cfg = self.config
        if update < cfg.warmup_steps:
            return cfg.lr * (update + 1) / cfg.warmup_steps
        if not cfg.decay_steps:
            return cfg.lr
        progress = min(1.0, (update - cfg.warmup_steps) / cfg.decay_steps)
        floor = cfg.lr * cfg.min_lr_ratio
        return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    # -- weights and checkpoints ----------------------------------------------------------------

    def export_weights(self, directory: str | Path) -> ExportedWeights:
        """Write the policy to ``directory/weights-v<version>`` for ``/update_weights_from_disk``."""
        path = save_weights(self.model, Path(directory) / f"weights-v{self.version:08d}", self.tokenizer)
        return ExportedWeights(path=path, version=self.version)

    def save_checkpoint(self, root: str | Path) -> Path:
        """Save model, optimizer, counters, data position and RNGs under ``root``; keep the newest few."""
        state = checkpoint.TrainerState(
            self.steps, self.version, self.data_position, self.config.to_dict(), self.data_done
        )
        return checkpoint.save(
            root,
            state,
            model=self.model,
            optimizer=self.optimizer,
            tokenizer=self.tokenizer,
            reference=self.reference,
            keep=self.config.keep_checkpoints,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """Continue from a checkpoint: the next step gives exactly what it would have without the interruption."""
        state = checkpoint.load(
            path, model=self.model, optimizer=self.optimizer, reference=self.reference, device=self.device
        )
        self.steps, self.version, self.data_position = state.steps, state.version, state.data_position
        self.data_done = state.data_done

    # -- internals ------------------------------------------------------------------------------

    def _logprobs(self, model: Any, mb: MicroBatch) -> torch.Tensor:
        """``[rows, width]`` log-probs of each token given the ones before it; 0 in column 0."""
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
        targets = mb.input_ids[:, 1:].unsqueeze(-1)
        picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return torch.nn.functional.pad(picked, (1, 0))

    def _no_grad_logprobs(self, model: Any, samples: Sequence[TrainSample]) -> torch.Tensor:
        width = max((s.num_tokens for s in samples), default=1)
        table = torch.zeros((len(samples), width), device=self.device)
        with torch.no_grad():
            for plan in plan_micro_batches([s.num_tokens for s in samples], self.config.micro_batch_tokens):
                mb = collate(samples, plan, pad_id=self.pad_id, device=self.device)
                table[list(plan), : mb.input_ids.shape[1]] = self._logprobs(model, mb)
        return table

    def _update(self, sums: _Sums, has_tokens: bool) -> None:
        """Clip and apply the accumulated gradients; nothing at all when no token was trained."""
        if not has_tokens:
            self.optimizer.zero_grad(set_to_none=True)
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainError(
                f"the gradient norm is {norm} at step {self.steps}; the weights were left unchanged. "
                "Lower lr, check the rewards and log-probs for inf/NaN, or enable max_grad_norm"
            )
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.version)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        sums.updates += 1
        sums.grad_norm = norm

    def _common_metrics(self, sums: _Sums, samples: Sequence[TrainSample]) -> Metrics:
        return {
            "step": float(self.steps),
            "weight_version": float(self.version),
            "updates": float(sums.updates),
            "samples": float(len(samples)),
            "tokens": float(sums.tokens),
            "grad_norm": sums.grad_norm,
            "lr": self.lr_at(max(self.version - 1, 0)),
        }


def _split(n: int, parts: int) -> list[list[int]]:
    """``range(n)`` (n >= 1) cut into at most ``parts`` contiguous, near-equal, non-empty pieces."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(list(range(start, end)))
        start = end
    return out


def _rows(table: torch.Tensor | None, rows: list[int], width: int) -> torch.Tensor | None:
    return None if table is None else table[rows, :width]
