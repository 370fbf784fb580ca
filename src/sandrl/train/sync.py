"""The synchronous driver: roll out a batch, take one step, push the weights, repeat.

Every group of a step is sampled by the weights the trainer has at that moment, so staleness
is always 0. The step is :meth:`Session.train` -> :meth:`~sandrl.train.trainer.Trainer.step`, the
same one :mod:`sandrl.train.async_` calls. With ``[inference] colocate`` the engines hand their
memory to the trainer around the step (:mod:`sandrl.inference.colocation`): released before it,
the weights resumed before the push, the KV cache after it.
"""

from __future__ import annotations

from sandrl.inference import colocation
from sandrl.train.session import Session


async def run(session: Session) -> None:
    """Train until ``run.steps`` steps are done (or a ``--load-rollouts`` file is used up)."""
    shared = None
    if session.config.inference.colocate and session.policy is not None and session.trainer is not None:
        shared = colocation.sharing(session.policy)
    resume_s = 0.0
    while not session.finished:
        items = await session.collect(session.config.run.groups_per_step)
        if not items:
            break
        if shared is None:
            await session.train(items)
            await session.push_weights()
            continue
        release_s = await colocation.release(shared)
        await session.train(items, **{"colocate/release_s": release_s, "colocate/resume_s": resume_s})
        resume_s = await colocation.resume(shared, ["weights"])
        await session.push_weights()
        resume_s += await colocation.resume(shared, ["kv_cache"])
    session.save_checkpoint()
