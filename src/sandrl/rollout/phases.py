"""An episode's phases as they run: which one it is in (a failure is classified by it) and how long each took."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class PhaseClock:
    """The phase an episode is in, and the seconds spent per timing key (summed over repeats: a
    multi-step task's agent and verifier phases run once per step)."""

    phase: str = "sandbox_create"
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, timing: str, seconds: float) -> None:
        self.timings[timing] = self.timings.get(timing, 0.0) + seconds

    async def run(self, phase: str, timing: str, timeout_s: float, work: Awaitable[T]) -> T:
        """Await ``work`` as ``phase`` within ``timeout_s`` (TimeoutError past it), its time added to ``timing``."""
        self.phase = phase
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                return await work
        finally:
            self.add(timing, time.monotonic() - started)
