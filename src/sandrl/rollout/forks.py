"""GRPO groups from one prepared sandbox (``fork_groups``): the task's setup runs once per group.

A GRPO group is ``group_size`` episodes of one task. When the task's setup is expensive (a
SWE-bench checkout, a multi-step task's ``setup.sh`` that builds something), running it once per
group instead of once per episode saves ``group_size - 1`` setups::

    prepare_group   parent    provider.create(the task's spec, on the task's image)
                    setup     prepare_environment(task, parent)
                    snapshot  parent.snapshot("fork-..."): the prepared files, as an image
                    close     the parent: the episodes need its files, not its processes
    each episode    run_episode(..., forked_from=...): its sandbox starts from the snapshot
                    (copy-on-write: its writes are its own, invisible to the others), no setup
    release_group   provider.remove_image(snapshot), once every episode has closed its sandbox

That is ``Sandbox.fork(group_size)`` (one snapshot, then copy-on-write children), with the
children made one at a time as the episodes get their concurrency slots, so ``concurrency`` still
bounds the live sandboxes and a retried episode starts again from the same snapshot.

What a filesystem snapshot does not hold is not carried over: a process the setup started (a
service) is not running in the episodes' sandboxes, and the image's ``ENTRYPOINT`` starts anew in
each, as in a container of a committed image. Each trajectory records where its sandbox came from
(:attr:`~sandrl.rollout.trajectory.Trajectory.forked_from`), with the group's setup time counted
once and shared. A provider whose sandboxes cannot fork is refused when the runner is made
(:func:`check_forks`), not episode by episode.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from sandrl.errors import ConfigError, SandboxUnavailableError
from sandrl.rollout.episode import EpisodeTimeouts, close_sandbox
from sandrl.rollout.failures import classify
from sandrl.rollout.trajectory import EpisodeError
from sandrl.sandbox.base import (
    FORK_IMAGE_PREFIX,
    Sandbox,
    SandboxProvider,
    SnapshotProvider,
    Snapshottable,
    snapshots_of,
)
from sandrl.tasks.task import Task
from sandrl.tasks.verify import prepare_environment

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PreparedGroup:
    """A group's setup, done once: the snapshot its episodes start from, and what it cost."""

    snapshot: str
    """The image of the parent's files after the setup; every episode's sandbox starts from it."""
    parent_id: str
    image: str
    """The task's image, which the parent started from."""
    create_s: float
    setup_s: float
    snapshot_s: float
    attempt: int = 1

    def provenance(self) -> dict[str, Any]:
        """What each of the group's trajectories records (:attr:`Trajectory.forked_from`)."""
        return {
            "parent": self.parent_id,
            "snapshot": self.snapshot,
            "image": self.image,
            "parent_create_s": round(self.create_s, 6),
            "setup_s": round(self.setup_s, 6),
            "snapshot_s": round(self.snapshot_s, 6),
            "attempt": self.attempt,
        }


def check_forks(provider: SandboxProvider) -> None:
    """Raise :class:`~sandrl.errors.ConfigError` unless ``provider``'s sandboxes can be forked."""
    if not snapshots_of(provider):
        raise ConfigError(
            f"fork_groups needs sandboxes that can be snapshotted and forked, and this provider's "
            f"({type(provider).__name__}) cannot: run on this host's sandboxes (the bubblewrap provider forks), "
            "or set fork_groups = false to set up every episode's sandbox on its own"
        )


async def _timed(work: Awaitable[T], timeout_s: float) -> tuple[T, float]:
    start = time.monotonic()
    async with asyncio.timeout(timeout_s):
        result = await work
    return result, time.monotonic() - start


async def prepare_group(
    task: Task, provider: SandboxProvider, image: str, timeouts: EpisodeTimeouts, *, attempt: int = 1
) -> PreparedGroup | EpisodeError:
    """Create the group's parent sandbox, run the task's setup in it, snapshot it and close it.

    A failure is returned as the :class:`EpisodeError` every episode of the group will carry (its
    phase: ``sandbox_create``, ``setup`` or ``snapshot``); only cancellation propagates, after the
    parent is closed and a snapshot made meanwhile removed.
    """
    name = f"{FORK_IMAGE_PREFIX}{uuid.uuid4().hex[:16]}"
    parent: Sandbox | None = None
    phase = "sandbox_create"
    snapshotted = False
    try:
        made, create_s = await _timed(provider.create(task.to_sandbox_spec(image=image)), timeouts.create_timeout_s)
        parent = made
        phase = "setup"
        _, setup_s = await _timed(prepare_environment(task, made), timeouts.setup_timeout_s)
        phase = "snapshot"
        if not isinstance(made, Snapshottable):
            raise SandboxUnavailableError(
                f"sandbox {made.id} cannot be snapshotted, though its provider said its sandboxes could"
            )
        snapshot, snapshot_s = await _timed(made.snapshot(name), timeouts.setup_timeout_s)
        snapshotted = True
        return PreparedGroup(snapshot, made.id, image, create_s, setup_s, snapshot_s, attempt)
    except asyncio.CancelledError:
        if phase == "snapshot" and not snapshotted:
            await asyncio.shield(_remove_quietly(provider, name, missing_ok=True))
        raise
    except Exception as exc:
        error = classify(exc, phase)
        log.debug("group setup of %s failed in %s: %s", task.id, phase, error.message)
        return error
    finally:
        if parent is not None:
            await close_sandbox(parent, timeouts.close_timeout_s)


async def release_group(provider: SandboxProvider, group: PreparedGroup) -> None:
    """Remove the group's snapshot (its episodes have closed their sandboxes); never raises."""
    await _remove_quietly(provider, group.snapshot)


async def _remove_quietly(provider: SandboxProvider, name: str, *, missing_ok: bool = False) -> None:
    if not isinstance(provider, SnapshotProvider):
        return
    try:
        await provider.remove_image(name)
    except Exception as exc:
        if not missing_ok:
            log.warning("removing the group snapshot %s failed (`sandrl images prune` removes it): %s", name, exc)
