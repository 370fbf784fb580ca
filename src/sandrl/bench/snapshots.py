"""The rows of ``sandrl bench sandbox`` for live-sandbox operations: snapshot, fork, pause/resume.

- snapshot of a sandbox with 10 MiB written (the export of its writable layer, and the image);
- fork into 1 and into 16 children, until every child has run ``true``: the first fork of 16 alone
  (every child launched in full), then in the steady state of a run that forks a group every step,
  where the provider has the next fork's launches made ahead (:mod:`sandrl.sandbox.bwrap.premade`)
  and each fork finds them ready, as the warm-create row finds its pool full;
- a pause + resume round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox
from sandrl.sandbox.bwrap.snapshot import FORK_PREFIX
from sandrl.stats import summary_ms

TARGETS = {"snapshot_10mib_p50_ms": 50.0, "fork16_over_warm_create": 16.0, "pause_resume_p50_ms": 10.0}


async def _fork(provider: BwrapProvider, sandbox: BwrapSandbox, n: int) -> float:
    await provider.premade.wait_full()
    start = time.perf_counter()
    children = await sandbox.fork(n)
    try:
        await asyncio.gather(*(c.exec("true") for c in children))
        return time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.close() for c in children))


async def run(provider: BwrapProvider, spec: SandboxSpec, n: int, tick: Callable[[], None]) -> dict[str, Any]:
    """The rows, ``n`` repetitions of each (forks of 16: a quarter of that); every image made is removed."""
    snaps: list[float] = []
    forks1: list[float] = []
    forks16: list[float] = []
    pauses: list[float] = []
    made: list[str] = []
    before = set(provider.images.names())
    async with await provider.create(spec) as sandbox:
        await sandbox.exec("head -c 10485760 /dev/urandom > /tmp/blob")
        for _ in range(n):
            start = time.perf_counter()
            made.append(await sandbox.snapshot())
            snaps.append(time.perf_counter() - start)
            start = time.perf_counter()
            await sandbox.pause()
            await sandbox.resume()
            pauses.append(time.perf_counter() - start)
            tick()
        first16 = await _fork(provider, sandbox, 16)
        for _ in range(max(2, n // 4)):
            forks1.append(await _fork(provider, sandbox, 1))
            forks16.append(await _fork(provider, sandbox, 16))
    forks = [n for n in provider.images.names() if n.startswith(FORK_PREFIX) and n not in before]
    for name in [*made, *forks]:
        await provider.remove_image(name)  # with the layers only it held
    await provider.premade.close()  # the launches made ahead for the next fork: there is none
    return {
        "snapshot_10mib": summary_ms(snaps),
        "fork_1_until_exec": summary_ms(forks1),
        "fork_16_until_exec": summary_ms(forks16),
        "fork_16_first_until_exec": summary_ms([first16]),
        "pause_resume": summary_ms(pauses),
    }
