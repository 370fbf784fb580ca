"""The synchronous driver: roll out a batch, take one step, push the weights, repeat.

Every group of a step is sampled by the weights the trainer has at that moment, so staleness
is always 0. The step is :meth:`Session.train` -> :meth:`~sandrl.train.trainer.Trainer.step`, the
same one :mod:`sandrl.train.async_` calls.
"""

from __future__ import annotations

from sandrl.train.driver_common import Session


async def run(session: Session) -> None:
    """Train until ``run.steps`` steps are done (or a ``--load-rollouts`` file is used up)."""
    while not session.finished:
        items = await session.collect(session.config.run.groups_per_step)
        if not items:
            break
        await session.train(items)
        await session.push_weights()
    session.save_checkpoint()
