"""SIGINT and SIGTERM stop a long command cleanly: what it made is closed, what it did is kept.

:func:`run` is :func:`asyncio.run` where either signal cancels the command's coroutine. The
coroutine unwinds as on any cancellation (episodes close their sandboxes, a training run lets
its step in flight end and saves a checkpoint, servers stop), and then :class:`Interrupted` is
raised, for the command to say what was saved and exit ``128 + signal`` (130 for Ctrl-C, 143 for
SIGTERM). Without this, SIGTERM killed the process where it stood: its sandboxes' cgroups and
state records stayed until the next provider started, and nothing said what was saved.

A stop that takes more than :data:`NOTICE_AFTER_S` says what it is doing; a second signal stops
at once (the signal's default action), leaving whatever is still open for the next start to reap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOTICE_AFTER_S = 2.0


class Interrupted(Exception):
    """The command was stopped by ``signum`` after cleaning up."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {self.name}")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number."""
        return 128 + self.signum


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where SIGINT and SIGTERM cancel ``main`` and then raise :class:`Interrupted`."""
    return asyncio.run(_guarded(main))


async def _guarded(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def notice() -> None:
        sys.stderr.write(
            f"stopping ({signal.Signals(received[0]).name}): closing sandboxes and saving what is done; "
            "send it again to stop at once\n"
        )
        sys.stderr.flush()

    def on_signal(signum: int) -> None:
        if received:  # the second: at once, as if no handler were installed
            for s in SIGNALS:
                loop.remove_signal_handler(s)
                signal.signal(s, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        loop.call_later(NOTICE_AFTER_S, notice)
        task.cancel()

    for s in SIGNALS:
        loop.add_signal_handler(s, on_signal, s)
    try:
        result = await main
        if received:  # it came after the work's last wait: take its cancellation here, the work is done
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        return result
    except asyncio.CancelledError:
        if not received:
            raise
        # Our own cancellation, now fully unwound: the task must not stay marked as cancelling.
        task.uncancel()
        raise Interrupted(received[0]) from None
    finally:
        for s in SIGNALS:
            loop.remove_signal_handler(s)
