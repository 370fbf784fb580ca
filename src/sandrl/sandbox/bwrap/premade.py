"""Launches made ahead of demand, for sandboxes whose image is not known until they are asked for.

A warm pool (:mod:`sandrl.sandbox.bwrap.warm_pool`) holds whole sandboxes of one spec; a fork's children
cannot come from one, because their image (the parent's snapshot) did not exist a moment before.
What does not depend on the image can be done ahead, though: a pre-made launch
(:meth:`~sandrl.sandbox.bwrap.launch.Launcher.premake`) has its uid slot, record, cgroups, helper
process, namespaces and pid 1 (the helper doing bubblewrap's part itself), and waits. Taking one
leaves a create the image's mounts and pid 1's pivot into them: ~3 ms of CPU less per sandbox than
a full launch, whose thread alone costs ~3.5 ms.

The pool is sized by use: a fork of ``n`` children asks for ``n`` (at most :data:`MAX_PREMADE`)
to be kept from then on (:meth:`PremadeLaunches.want`), so a provider that never forks keeps none,
and a GRPO run that forks a group every step finds the next group's launches ready. The first fork
of a size pays for its creates in full. One thread refills the pool, in the background, one launch
at a time, and not while a fork's children are starting (until each has run its first command, at
most :data:`REFILL_HOLD_S`): a refill's launch (~3 ms of CPU in Python, the helper and the kernel)
would only compete with them, and on 2 cores it made a fork of 16 ~25% slower.

An idle pre-made launch is one sleeping process (~100 KiB), its namespaces and its cgroups;
:meth:`PremadeLaunches.close` (the provider's ``close_all``) removes them, and a helper whose
provider dies sees its socket close and exits, so the next provider's reaper finds a dead record as
for any sandbox. It also waits for what is still being undone: the launch a refill was making when
it was stopped (undone when it is made, in the refill's thread) and the launches a take threw away.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
from collections import deque

from sandrl.sandbox.bwrap.launch import Launch, Launcher, PremadeKind
from sandrl.sandbox.bwrap.sandbox import HOST_CLEANUP

__all__ = ["MAX_PREMADE", "PremadeLaunches", "undo_launch", "undo_when_done"]

MAX_PREMADE = 16
"""The most pre-made launches of one kind a provider keeps (a fork's children beyond are made in full)."""
_MAX_KINDS = 4
"""The most kinds (:class:`~sandrl.sandbox.bwrap.launch.PremadeKind`) a provider keeps launches for."""
REFILL_HOLD_S = 1.0
"""The longest a refill waits for what it was told to wait for (:meth:`PremadeLaunches.want`)."""
_MAX_FAILURES = 5
"""Consecutive failures to pre-make after which the pool stops trying (until the next ``want``)."""

PREMADE_WORK = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandrl-premade")
"""One thread: refills run beside the creates that need the host now, never ahead of them in HOST_WORK."""


class PremadeLaunches:
    """Pre-made launches of one provider, by kind (:class:`~sandrl.sandbox.bwrap.launch.PremadeKind`)."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.target: dict[PremadeKind, int] = {}
        self.idle: dict[PremadeKind, deque[Launch]] = {}
        self.taken = 0
        """Creates served from the pool so far."""
        self.failures = 0
        self.last_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._wanted: asyncio.Event | None = None
        self._closed = False
        self._holds: list[tuple[asyncio.Future[None], float]] = []
        """What the refill waits for before its next launch, each with its deadline (loop time)."""
        self._undoing: set[concurrent.futures.Future[None]] = set()
        """Undoing launches no longer in :attr:`idle` (:meth:`close` waits for them)."""

    def want(self, kind: PremadeKind, n: int, until: asyncio.Future[None] | None = None) -> None:
        """Keep ``n`` launches of this kind ready from now on (at most :data:`MAX_PREMADE`, and never
        fewer than asked before); no refill starts before ``until`` is done (or :data:`REFILL_HOLD_S`
        has passed)."""
        if self._closed:
            return
        if until is not None and not until.done():
            self._holds.append((until, until.get_loop().time() + REFILL_HOLD_S))
        n = min(n, MAX_PREMADE)
        if n > self.target.get(kind, 0) and (kind in self.target or len(self.target) < _MAX_KINDS):
            # (forks of many shapes: only the first ones' are kept)
            self.target[kind] = n
            self.idle.setdefault(kind, deque())
            self.failures = 0
        self._kick()

    def take(self, kind: PremadeKind, cpus: set[int]) -> Launch | None:
        """A ready launch of ``kind`` started on ``cpus``, or None; the pool refills behind it."""
        idle = self.idle.get(kind)
        if not idle:
            return None
        found = None
        while idle and found is None:
            launch = idle.popleft()
            if launch.proc is None or launch.proc.poll() is not None or launch.cpus != cpus:
                # Its helper died (the host refused a namespace, or someone killed it), or it was
                # started on other CPUs than this caller's (a benchmark's emulated smaller host).
                if launch.proc is not None and launch.proc.poll() is not None:
                    self.failures += 1
                self._undo(launch)
                continue
            found = launch
        if found is not None:
            self.taken += 1
        self._kick()
        return found

    async def wait_full(self, timeout_s: float = 10.0) -> None:
        """Wait until every kind holds its target (or the pool gave up, or ``timeout_s`` passed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline and not self._closed and self.failures < _MAX_FAILURES:
            if self._missing() is None:
                return
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        """Stop refilling and remove every idle launch; the pool can be used again afterwards."""
        self._closed = True
        try:
            task, self._task = self._task, None
            if task is not None and task.get_loop() is asyncio.get_running_loop():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # A refill task of a loop that has ended ended with it; its launch is undone where it is made.
            for kind in self.idle.values():
                while kind:
                    self._undo(kind.popleft())
            # The launch a stopped refill was making is undone only once made: wait for it too, or a
            # caller that then looks (a run's check for leftovers) finds its record and cgroups.
            await asyncio.gather(*(asyncio.wrap_future(f) for f in list(self._undoing)))
        finally:
            # Even when this close is itself cancelled (a second Ctrl-C while it waits): the pool
            # left closed would never refill again, and the undos go on where they run.
            self.target.clear()
            self._holds.clear()
            self._closed = False

    def close_sync(self) -> None:
        """At interpreter exit, without an event loop."""
        self._closed = True
        for kind in self.idle.values():
            while kind:
                with contextlib.suppress(Exception):
                    kind.popleft().undo()

    # -- refilling

    def _kick(self) -> None:
        if self._closed or not self.target:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wanted = asyncio.Event()
            self._task = loop.create_task(self._refill(), name="sandrl-premade-refill")
        assert self._wanted is not None
        self._wanted.set()

    def _missing(self) -> PremadeKind | None:
        """A kind short of its target, if any."""
        for kind, n in self.target.items():
            if len(self.idle[kind]) < n:
                return kind
        return None

    async def _held(self) -> None:
        """Wait for the holds (:meth:`want`'s ``until``), each until its deadline."""
        loop = asyncio.get_running_loop()
        while self._holds:
            until, deadline = self._holds[0]
            left = deadline - loop.time()
            if not until.done() and left > 0 and until.get_loop() is loop:
                await asyncio.wait([until], timeout=left)
            self._holds.pop(0)

    async def _refill(self) -> None:
        assert self._wanted is not None
        while not self._closed:
            await self._held()
            kind = self._missing() if self.failures < _MAX_FAILURES else None
            if kind is None:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            started = PREMADE_WORK.submit(self.launcher.premake, kind, os.sched_getaffinity(0))
            try:
                launch = await asyncio.shield(asyncio.wrap_future(started))
            except asyncio.CancelledError:
                # Undone where it finishes (the worker thread): this loop may be closing.
                self._waits_for(undo_when_done(started))
                raise
            except Exception as exc:
                self.failures += 1
                self.last_error = exc
                await asyncio.sleep(min(5.0, 0.05 * 2**self.failures))
                continue
            if self._closed:
                self._undo(launch)
                return
            self.failures = 0
            self.idle[kind].append(launch)

    def _undo(self, launch: Launch) -> None:
        """Undo a launch taken out of :attr:`idle`, on ``HOST_CLEANUP``; :meth:`close` waits for it."""
        self._waits_for(undo_launch(launch))

    def _waits_for(self, undone: concurrent.futures.Future[None]) -> None:
        self._undoing.add(undone)
        undone.add_done_callback(self._undoing.discard)


def undo_when_done(started: concurrent.futures.Future[Launch]) -> concurrent.futures.Future[None]:
    """Undo the launch ``started`` makes once it is made (whoever wanted it is gone), on ``HOST_CLEANUP``:
    in ``started``'s thread, or in this one if it is made already, so no event loop has to outlive it
    (one that ends would cancel an undo that is a task of it). The future returned is done once it is
    undone, and cannot be cancelled: a waiter cancelled (``asyncio.wrap_future`` passes the waiter's
    cancellation on) used to cancel it, and whoever kept it to wait for (``close_all``) forgot it."""
    undone = _undo_future()
    started.add_done_callback(functools.partial(_undo_made, undone=undone))
    return undone


def _undo_future() -> concurrent.futures.Future[None]:
    undone: concurrent.futures.Future[None] = concurrent.futures.Future()
    undone.set_running_or_notify_cancel()  # running: cancel() refuses
    return undone


def _undo_made(started: concurrent.futures.Future[Launch], *, undone: concurrent.futures.Future[None]) -> None:
    if started.cancelled() or started.exception() is not None:
        undone.set_result(None)  # it failed, and undid what it had made before raising
        return
    undo_launch(started.result(), undone)


def undo_launch(
    launch: Launch, given: concurrent.futures.Future[None] | None = None
) -> concurrent.futures.Future[None]:
    """Undo ``launch`` on ``HOST_CLEANUP``; returns a future like :func:`undo_when_done`'s (``given``, where given)."""
    undone = _undo_future() if given is None else given

    def undo() -> None:
        try:
            launch.undo()
        except BaseException as exc:
            undone.set_exception(exc)
            raise
        undone.set_result(None)

    try:
        HOST_CLEANUP.submit(undo)
    except RuntimeError:  # the interpreter is exiting: no new threads
        undo()
    return undone
