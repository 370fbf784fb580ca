"""Engine processes: started through their guard, waited for, restarted when they die, stopped at the end.

Each engine runs under a :mod:`~sandrl.inference.fleet.guard` process (so it dies with the driver,
``kill -9`` included), its output appended to ``<output_dir>/engines/engine-N.log``. :class:`Launcher`
starts them all and waits for each to answer ``/health`` (an engine that exits first fails the
start with the end of its log, one that does not answer in ``startup_timeout_s`` too); then a
supervisor per engine waits for its exit: it tells the router (``on_lost``), waits 1, 2, 4...
(at most 30) seconds and starts it again on the same port, at most ``max_restarts`` times, after
which the engine is given up on (``on_gone``) and the run goes on with the others. The router
brings a restarted engine back into service itself, once it answers and has the current weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from sandrl.errors import ConfigError
from sandrl.inference.fleet import guard
from sandrl.inference.fleet.commands import EngineCommand
from sandrl.processes import stop_process, wait_exited

log = logging.getLogger(__name__)

GUARD = Path(guard.__file__)
STOP_GRACE_S = 10.0
"""How long an engine has to exit on SIGTERM before its group is killed."""
BACKOFF_S = (1.0, 30.0)
"""The first wait before a restart, and the most."""
TAIL_LINES = 15


def log_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16_384) -> list[str]:
    """The last ``lines`` non-empty lines of the log at ``path`` (read from its last ``max_bytes``)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip()[:400] for line in text.splitlines() if line.strip()][-lines:]


@dataclass
class EngineProcess:
    """One engine: its command, its log, its current process and how often it was restarted."""

    command: EngineCommand
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def index(self) -> int:
        return self.command.index

    def start(self) -> None:
        """Start the engine under its guard, its output appended to its log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = self.log_path.open("ab")
        what = "starting" if self.restarts == 0 else f"restarting ({self.restarts})"
        self._log.write(f"--- sandrl: {what} engine {self.index}: {' '.join(self.command.argv)}\n".encode())
        self._log.flush()
        argv = [sys.executable, str(GUARD), str(os.getpid()), str(STOP_GRACE_S), "--", *self.command.argv]
        # A session of its own: the terminal's Ctrl-C is the driver's to handle, not the guard's.
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.command.env},
            start_new_session=True,
        )
        self.started_at = time.monotonic()

    def exited(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    async def wait_ready(self, timeout_s: float, http: httpx.AsyncClient) -> None:
        """Return once the engine answers ``/health``; a ConfigError with its log's end if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.exited()
            if status is not None:
                raise self._failed(f"exited with status {status} before it answered {self.command.url}/health")
            try:
                answer = await http.get(self.command.url + "/health", timeout=2.0)
                if answer.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise self._failed(
                    f"did not answer {self.command.url}/health within {timeout_s:g} s "
                    "(raise [inference] startup_timeout_s if it loads for longer)"
                )
            await asyncio.sleep(0.1)

    def _failed(self, what: str) -> ConfigError:
        tail = log_tail(self.log_path)
        last = next((line for line in reversed(tail) if not line.startswith("--- sandrl:")), "(it printed nothing)")
        return ConfigError(
            f"inference engine {self.index} {what}: {last.strip()} -- fix the engine's command "
            f"([inference] launch, args, [model] name) by its log {self.log_path}, whose last lines are:\n"
            + "\n".join(f"  {line}" for line in tail)
        )

    def stop(self) -> None:
        """Stop the guard (which stops the engine's whole group); reaped."""
        try:
            if self.process is not None:
                stop_process(self.process, STOP_GRACE_S + 5.0)
        finally:  # an interrupted stop (Ctrl-C while waiting for the guard) still lets go of the log
            if self._log is not None:
                self._log.close()
                self._log = None


class Launcher:
    """The engine processes of a fleet and their supervisors; see the module docstring."""

    def __init__(
        self,
        commands: Sequence[EngineCommand],
        log_dir: Path,
        *,
        startup_timeout_s: float,
        max_restarts: int,
        on_lost: Callable[[int, str], None] = lambda _i, _why: None,
        on_gone: Callable[[int], None] = lambda _i: None,
    ) -> None:
        self.engines = [EngineProcess(c, log_dir / f"engine-{c.index}.log") for c in commands]
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.on_lost = on_lost
        self.on_gone = on_gone
        self._supervisors: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every engine and wait until each answers; on a failure, stop them all and raise it."""
        try:
            for engine in self.engines:
                engine.start()
            async with httpx.AsyncClient() as http:
                waits = [asyncio.ensure_future(e.wait_ready(self.startup_timeout_s, http)) for e in self.engines]
                try:
                    await asyncio.gather(*waits)
                finally:
                    for wait in waits:
                        wait.cancel()
        except BaseException:
            self.stop()
            raise
        self._supervisors = [asyncio.ensure_future(self._supervise(e)) for e in self.engines]

    async def _supervise(self, engine: EngineProcess) -> None:
        while True:
            process = engine.process
            assert process is not None
            while process.poll() is None:
                await wait_exited(process, 3600.0)
            if self._stopping:
                return
            status = process.returncode
            self.on_lost(engine.index, f"its process exited with status {status}")
            if engine.restarts >= self.max_restarts:
                log.warning(
                    "inference engine %d died %d times; not restarting it ([inference] max_restarts = %d): see %s",
                    engine.index,
                    engine.restarts + 1,
                    self.max_restarts,
                    engine.log_path,
                )
                self.on_gone(engine.index)
                return
            delay = min(BACKOFF_S[0] * 2**engine.restarts, BACKOFF_S[1])
            log.warning(
                "inference engine %d exited with status %s; restarting it in %g s (see %s)",
                engine.index,
                status,
                delay,
                engine.log_path,
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            engine.restarts += 1
            engine.start()

    def stop(self) -> None:
        """Stop every engine (their guards stop their groups) and the supervisors."""
        self._stopping = True
        for task in self._supervisors:
            task.cancel()
        for engine in self.engines:
            with contextlib.suppress(OSError):
                engine.stop()

    def restarts(self) -> list[int]:
        return [e.restarts for e in self.engines]
