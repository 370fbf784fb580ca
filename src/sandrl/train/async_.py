"""The asynchronous driver: rollouts run ahead of the trainer, at most ``max_staleness`` versions behind.

The rollout side keeps ``groups_per_step x (1 + max_staleness)`` groups in flight or buffered
(:class:`~sandrl.train.buffer.GroupBuffer`); the trainer takes the oldest ``groups_per_step``
fresh ones, and a group sampled more than ``max_staleness`` versions ago is dropped or
regenerated (``async.on_stale``). Weights are pushed every ``update_interval`` steps. The step is
:meth:`Session.train` -> :meth:`~sandrl.train.trainer.Trainer.step`, the same one :mod:`sandrl.train.sync`
calls; the only difference is that the next groups are being sampled while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib

from sandrl.errors import ConfigError
from sandrl.train.buffer import GroupBuffer
from sandrl.train.session import Session


async def run(session: Session) -> None:
    """Train until ``run.steps`` steps are done."""
    cfg = session.config
    if cfg.inference.colocate:
        raise ConfigError(
            "[inference] colocate = true stops generation while the trainer trains, which the async driver never "
            "does: run `sandrl train` without --async, or set colocate = false"
        )
    buffer = GroupBuffer(cfg.run.groups_per_step * (1 + cfg.async_.max_staleness), cfg.async_.max_staleness)
    producer = asyncio.create_task(buffer.fill(session))
    try:
        while not session.finished:
            items, stats = await buffer.take(cfg.run.groups_per_step, session)
            if not items:
                break
            await session.train(items, **stats)  # the buffer keeps filling while the trainer steps
            if session.batches % cfg.async_.update_interval == 0:
                await session.push_weights()
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
    session.save_checkpoint()
