"""The trainer: one policy update per batch, supervised warm-start steps, checkpoints, weight export.

:meth:`Trainer.step` does not know whether its batch came from the synchronous or the
asynchronous driver: every sample carries the log-probs it was sampled with, and the loss
corrects for the difference (:mod:`sandrl.train.losses`). A step

1. recomputes, when it needs them, the proximal log-probs (with several minibatches) and the
   reference log-probs (with a KL term) in no-grad forwards,
2. for each minibatch, forwards micro-batches that fit ``micro_batch_tokens`` (packed or padded,
   :mod:`sandrl.train.micro_batches`) and accumulates their gradients (each token's weight in the
   loss is fixed over the whole minibatch beforehand, so the split into micro-batches, and into
   ranks, does not change the result),
3. clips the gradient norm and takes one AdamW step, which bumps the weight version.

Log-probs come from the final hidden states a chunk at a time (:mod:`sandrl.train.logprobs`):
no micro-batch's full logits are ever built. The same class runs alone or as one rank of many
(:mod:`sandrl.train.ranks` starts them): with a ``torch.distributed`` process group, the policy is
sharded with FSDP2 (:mod:`sandrl.train.sharding`), each rank forwards its share of every
minibatch's micro-batches, and metrics are summed over the ranks.

A batch with no model token to train (an all-zero loss mask, or only groups without signal)
changes nothing: no update, no optimizer state, no new version.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import TrainError
from sandrl.host_memory import release_freed_memory
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.weight_push import BlockingBroadcast, BroadcastSpec, broadcast_for
from sandrl.train import checkpoint, micro_batches, packed_attention
from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.device import torch_device
from sandrl.train.diagnostics import ByCause
from sandrl.train.logprobs import PolicyForward, TokenLogprobs
from sandrl.train.losses import policy_loss, sft_loss, token_weights
from sandrl.train.micro_batches import MicroBatch
from sandrl.train.world import World

Metrics = dict[str, float]


@dataclass(frozen=True)
class ExportedWeights:
    """A policy written for the inference server's ``/update_weights_from_disk``."""

    path: Path
    version: int
    """The trainer's weight version; pass it to the server so its samples are tagged with it."""


@dataclass
class _Sums:
    """What a step adds up over its micro-batches (and, with several ranks, over the ranks)."""

    loss: float = 0.0
    tokens: int = 0
    clipped_low: int = 0
    clipped_high: int = 0
    is_weight: float = 0.0
    is_truncated: int = 0
    kl: float = 0.0
    is_masked: int = 0
    is_masked_sequences: int = 0
    mismatch_kl: float = 0.0
    mismatch_tokens: int = 0
    samples_in_loss: int = 0
    entropy: float = 0.0
    slots: int = 0
    """Positions forwarded, padding included."""
    sample_tokens: int = 0
    """Positions that held a sample's token."""

    def reduce(self, world: World, device: torch.device) -> None:
        names = [f.name for f in fields(self)]
        for name, value in zip(names, world.sum([getattr(self, n) for n in names], device), strict=True):
            setattr(self, name, type(getattr(self, name))(value))


class Trainer:
    """Updates a Hugging Face causal LM (Llama/Qwen-style: a decoder and an output head, and
    ``save_pretrained``) with the GRPO family of losses or supervised cross-entropy."""

    def __init__(
        self,
        model: Any,
        config: TrainConfig | None = None,
        *,
        tokenizer: Tokenizer | None = None,
        reference: Any = None,
    ) -> None:
        """``reference`` is the KL reference policy (``loss.beta > 0``); by default a frozen copy of ``model``
        (with LoRA: the same model with its adapters switched off, no copy)."""
        from sandrl.train import lora, sharding

        self.config = cfg = config or TrainConfig()
        self.device = torch_device(cfg.device)
        self.world = World.current()
        self._broadcast: BlockingBroadcast | None = None
        self.tokenizer = tokenizer
        pad = tokenizer.pad_token_id if tokenizer is not None else getattr(model.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.sharded = self.world.distributed
        if cfg.lora is not None:
            model = lora.apply_lora(model, cfg.lora)
        self.model = model.to(self.device).train()
        """The model as built (a ``peft`` model with LoRA): what is exported and checkpointed."""
        self.policy = PolicyForward(self.model)
        hf_config = self.policy.lm.config
        # Packed rows attend per sample (flash-attention's varlen kernel, else sandrl's): as wide as the budget.
        varlen = cfg.packing and packed_attention.use_packed_attention(self.policy.base)
        self.row_tokens = micro_batches.row_tokens(
            cfg.micro_batch_tokens, hidden_size=int(getattr(hf_config, "hidden_size", 0) or 0), varlen=varlen
        )
        """How wide a packed row is (:func:`~sandrl.train.micro_batches.row_tokens`)."""
        if cfg.activation_checkpointing:
            sharding.enable_activation_checkpointing(self.policy)
        self.reference: PolicyForward | None = None
        if cfg.loss.beta > 0 and cfg.lora is None:
            frozen = reference if reference is not None else copy.deepcopy(model)
            self.reference = PolicyForward(frozen.to(self.device).eval())
            if varlen:
                packed_attention.use_packed_attention(self.reference.base)
            self.reference.requires_grad_(False)
            if self.sharded:
                sharding.shard(self.reference, cfg, self.device)
        if self.sharded:
            sharding.shard(self.policy, cfg, self.device)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise TrainError("the model has no trainable parameters (all have requires_grad=False)")
        self.optimizer = torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
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
        has_rollout = all(s.rollout_logprobs is not None for s in samples)
        if loss_cfg.importance_sampling is not None and not has_rollout:
            raise TrainError(
                "importance sampling (loss.tis_cap, [train.loss.is]) needs each sample's rollout_logprobs; "
                "give them, or set tis_cap = false"
            )
        parts = _split(len(samples), self.config.minibatches) if samples else []
        by_cause = ByCause(samples, self.version, self.device)
        old = self._no_grad_logprobs(samples, reference=False) if len(parts) > 1 else None
        ref = self._no_grad_logprobs(samples, reference=True) if loss_cfg.beta > 0 else None
        sums = _Sums()
        updates, grad_norm = 0, 0.0
        for part in parts:
            part_samples = [samples[i] for i in part]
            width = max(s.num_tokens for s in part_samples)
            mask = torch.zeros((len(part), width), dtype=torch.float32, device=self.device)
            for row, s in enumerate(part_samples):
                mask[row, : s.num_tokens] = torch.tensor(s.loss_mask, dtype=torch.float32)
            weights = token_weights(mask, loss_cfg)
            part_old = old[part] if old is not None else None
            part_ref = ref[part] if ref is not None else None

            def train_on(
                mb: MicroBatch, out: TokenLogprobs, sums: _Sums = sums, part: list[int] = part, **tables: Any
            ) -> torch.Tensor:
                old_mb = mb.take(tables["old"]) if tables["old"] is not None else None
                rollout = mb.rollout_logprobs if has_rollout else None
                result = policy_loss(
                    out.logprobs,
                    mb.advantages,
                    mb.loss_mask,
                    loss_cfg,
                    old_logprobs=old_mb,
                    rollout_logprobs=rollout,
                    ref_logprobs=mb.take(tables["ref"]) if tables["ref"] is not None else None,
                    weights=mb.take(tables["weights"]),
                    sample_ids=mb.sample_ids,
                    entropy=out.entropy,
                )
                by_cause.add(
                    mb, part, loss_cfg, logprobs=out.logprobs, old=old_mb, rollout=rollout, entropy=out.entropy
                )
                sums.loss += float(result.loss.detach())
                sums.tokens += result.tokens
                sums.clipped_low += result.clipped_low
                sums.clipped_high += result.clipped_high
                sums.is_weight += result.is_weight_sum
                sums.is_truncated += result.is_truncated
                sums.kl += result.kl_sum
                sums.is_masked += result.is_masked_tokens
                sums.is_masked_sequences += result.is_masked_sequences
                sums.mismatch_kl += result.mismatch_kl_sum
                sums.mismatch_tokens += result.mismatch_tokens
                sums.samples_in_loss += len(mb.placements)
                return result.loss

            self._accumulate(
                part_samples,
                sums,
                train_on,
                entropy_grad=loss_cfg.entropy_coef > 0,
                old=part_old,
                ref=part_ref,
                weights=weights,
            )
            norm = self._update(any(s.num_model_tokens for s in part_samples))
            if norm is not None:
                updates, grad_norm = updates + 1, norm
        sums.reduce(self.world, self.device)
        by_cause.reduce(self.world)
        self.steps += 1
        release_freed_memory()  # the micro-batches' activations, freed by now, would otherwise stay resident
        tokens = max(sums.tokens, 1)
        staleness = [self.version - updates - s.weight_version for s in samples] or [0]
        return {
            **self._common_metrics(sums, samples, updates, grad_norm),
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
            "is_masked_frac": sums.is_masked / tokens,
            "is_masked_seq_frac": sums.is_masked_sequences / max(sums.samples_in_loss, 1),
            "mismatch_kl": sums.mismatch_kl / max(sums.mismatch_tokens, 1),
            "kl_mean": sums.kl / tokens,
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": float(max(staleness)),
            **by_cause.metrics(),
        }

    def sft_step(self, samples: Iterable[TrainSample]) -> Metrics:
        """One supervised update: masked cross-entropy on the model tokens (the mean over all of them)."""
        items = list(samples)
        total = sum(s.num_model_tokens for s in items)
        sums = _Sums()

        def train_on(mb: MicroBatch, out: TokenLogprobs, **_: Any) -> torch.Tensor:
            loss = sft_loss(out.logprobs, mb.loss_mask, total_tokens=total)
            sums.loss += float(loss.detach())
            sums.tokens += int(mb.loss_mask.sum())
            return loss

        if items:
            self._accumulate(items, sums, train_on)
        norm = self._update(total > 0)
        sums.reduce(self.world, self.device)
        self.steps += 1
        release_freed_memory()
        return {
            **self._common_metrics(sums, items, int(norm is not None), norm or 0.0),
            "loss": sums.loss,
        }

    def logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """The current policy's log-prob of every token (0 for the first), aligned with ``token_ids``."""
        table = self._no_grad_logprobs(samples, reference=False)
        return [table[i, : s.num_tokens].tolist() for i, s in enumerate(samples)]

    def greedy_reproduces(self, samples: Sequence[TrainSample]) -> list[bool]:
        """Whether greedy decoding would write each sample's model tokens exactly.

        With teacher forcing, the argmax at every model-token position equals that token iff
        greedy decoding from the sample's prompt generates them: one forward pass, no sampling.
        """
        if self.sharded:
            raise TrainError("greedy_reproduces runs on an unsharded trainer (one process)")
        out = [False] * len(samples)
        budget = self.config.micro_batch_tokens
        with torch.no_grad():
            for plan in micro_batches.plan([s.num_tokens for s in samples], budget, packing=False):
                mb = micro_batches.collate(samples, plan, pad_id=self.pad_id, device=self.device)
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
        """Write the policy to ``directory/weights-v<version>`` for ``/update_weights_from_disk``.

        With several ranks every rank must call it (the shards are gathered); rank 0 writes.
        """
        path = Path(directory) / f"weights-v{self.version:08d}"
        checkpoint.export_policy(self.policy, self.model, path, self.tokenizer, self.config, self.world)
        return ExportedWeights(path=path, version=self.version)

    def broadcast_weights(self, spec: BroadcastSpec) -> str | None:
        """Send the policy to the engines of ``spec`` over a weight-update group, as version :attr:`version`:
        rank 0 joins the group (once; kept between pushes) and sends bucket by bucket, every rank gathers
        (with several ranks every rank must call it). None when the engines serve the new version; else
        why not, and the caller takes the disk (a LoRA adapter always goes that way: it is small)."""
        if self.config.lora is not None:
            return "a LoRA adapter is loaded from the disk"
        weights = checkpoint.full_weights(self.policy, self.model, self.config, self.world)
        if self.world.rank != 0:
            for _ in weights:  # the gathers are collectives: keep in step with rank 0
                pass
            return None
        self._broadcast = broadcast_for(self._broadcast, spec)
        return self._broadcast.push(weights, self.version)

    def save_checkpoint(self, root: str | Path) -> Path:
        """Save model, optimizer, counters, data position and RNGs under ``root``; keep the newest few.

        With several ranks every rank must call it: each writes its shards (``torch.distributed.checkpoint``).
        """
        state = checkpoint.TrainerState(
            self.steps, self.version, self.data_position, self.config.to_dict(), self.data_done
        )
        return checkpoint.save(
            root,
            state,
            policy=self.policy,
            model=self.model,
            optimizer=self.optimizer,
            tokenizer=self.tokenizer,
            config=self.config,
            world=self.world,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """Continue from a checkpoint: the next step gives exactly what it would have without the interruption.

        A checkpoint written by any number of ranks loads on any other number.
        """
        state = checkpoint.load(path, policy=self.policy, optimizer=self.optimizer, config=self.config)
        self.steps, self.version, self.data_position = state.steps, state.version, state.data_position
        self.data_done = state.data_done

    def close(self) -> None:
        """Leave the engines' weight-update group, if one was formed (the trainer lives in this process)."""
        if self._broadcast is not None:
            self._broadcast.close()
            self._broadcast = None

    # -- internals ------------------------------------------------------------------------------

    def _forward(
        self, mb: MicroBatch | None, *, reference: bool = False, entropy: bool = False, entropy_grad: bool = False
    ) -> TokenLogprobs:
        """The token log-probs of ``mb``; None forwards a 2-token stand-in (a rank with no micro-batch left)."""
        ids = mb.input_ids if mb is not None else torch.full((1, 2), self.pad_id, device=self.device)
        kwargs: dict[str, Any] = {
            "attention_mask": mb.attention_mask if mb is not None else None,
            "position_ids": mb.position_ids if mb is not None else None,
            "chunk_tokens": self.config.logprob_chunk_tokens,
            "entropy": entropy,
            "entropy_grad": entropy_grad,
        }
        out: TokenLogprobs
        if not reference:
            out = self.policy(ids, **kwargs)
        elif self.reference is not None:
            out = self.reference(ids, **kwargs)
        else:
            from sandrl.train import lora

            # Sharded, the adapters still run, scaled by 0: FSDP2 breaks (bf16 gradients meet float32
            # ones in the next backward) when a forward leaves a unit's gathered parameters unused.
            off = lora.adapters_zeroed if self.sharded else lora.adapters_disabled
            with off(self.model):
                out = self.policy(ids, **kwargs)
        return out

    def _plans(self, samples: Sequence[TrainSample]) -> list[list[int]]:
        lengths = [s.num_tokens for s in samples]
        return micro_batches.plan(
            lengths, self.config.micro_batch_tokens, packing=self.config.packing, row_tokens=self.row_tokens
        )

    def _my_micro_batches(self, samples: Sequence[TrainSample]) -> list[MicroBatch | None]:
        """This rank's micro-batches of ``samples``, padded with None to the count every rank runs."""
        plans = self._plans(samples)
        mine, count = self.world.share(len(plans))
        out: list[MicroBatch | None] = [
            micro_batches.collate(
                samples,
                plans[k],
                pad_id=self.pad_id,
                packing=self.config.packing,
                row_tokens=self.row_tokens,
                device=self.device,
            )
            for k in mine
        ]
        return out + [None] * (count - len(out))

    def _accumulate(
        self,
        samples: Sequence[TrainSample],
        sums: _Sums,
        loss_of: Callable[..., torch.Tensor],
        *,
        entropy_grad: bool = False,
        **tables: Any,
    ) -> None:
        """Forward and backward this rank's micro-batches of ``samples``; gradients accumulate.

        ``entropy_grad``: the entropy keeps its gradient (an entropy bonus in the loss)."""
        for mb in self._my_micro_batches(samples):
            out = self._forward(mb, entropy=mb is not None, entropy_grad=entropy_grad and mb is not None)
            if mb is None:
                # FSDP2's reduce-scatter runs in every rank's backward: join it with a zero gradient.
                torch.autograd.backward(out.logprobs.sum() * 0.0)
                continue
            loss = loss_of(mb, out, **tables)
            sums.slots += mb.slots
            sums.sample_tokens += mb.tokens
            if out.entropy is not None:
                sums.entropy += float((out.entropy.detach() * mb.loss_mask).sum())
            if self.sharded or bool(mb.loss_mask.any()):
                torch.autograd.backward(loss)

    def _no_grad_logprobs(self, samples: Sequence[TrainSample], *, reference: bool) -> torch.Tensor:
        """``[samples, longest]`` log-probs of every token under the policy (or the reference), on every rank."""
        width = max((s.num_tokens for s in samples), default=1)
        table = torch.zeros((len(samples), width), device=self.device)
        with torch.no_grad():
            for mb in self._my_micro_batches(samples):
                out = self._forward(mb, reference=reference)
                if mb is not None:
                    mb.put(out.logprobs, table)
        table[:, 0] = 0.0  # a packed sample's first column holds the previous sample's guess
        return self.world.sum_tensor(table)

    def _update(self, has_tokens: bool) -> float | None:
        """Clip and apply the accumulated gradients: the gradient's norm; None (no update) when no token trained."""
        if not has_tokens:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
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
        return norm

    def _common_metrics(self, sums: _Sums, samples: Sequence[TrainSample], updates: int, grad_norm: float) -> Metrics:
        return {
            "step": float(self.steps),
            "weight_version": float(self.version),
            "updates": float(updates),
            "samples": float(len(samples)),
            "tokens": float(sums.tokens),
            "grad_norm": grad_norm,
            "lr": self.lr_at(max(self.version - 1, 0)),
            "entropy_mean": sums.entropy / max(sums.tokens, 1),
            "padding_frac": 1.0 - sums.sample_tokens / sums.slots if sums.slots else 0.0,
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
