"""An image's ``ENTRYPOINT``, started in a new sandbox as Docker starts a task container.

Harbor and Terminal-Bench run a task's container with its command replaced by ``sleep
infinity``: the image's ``ENTRYPOINT`` (if any) runs with those arguments, so an entrypoint
script does its setup (``/etc/hosts`` entries, a started service...) and then ``exec "$@"``; the
image's ``CMD`` never runs. :func:`start_entrypoint` does the same, in the background of the
sandbox, and waits — bounded — until the entrypoint has handed over to ``sleep infinity`` (its
setup is done) or has exited, so that the agent's first command meets a prepared machine. Its
output goes to ``/var/log/sandrl-entrypoint.log`` in the sandbox.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Sequence

from sandrl.sandbox.base import Sandbox

__all__ = ["ENTRYPOINT_LOG", "HANDOVER_ARGS", "start_entrypoint"]

ENTRYPOINT_LOG = "/var/log/sandrl-entrypoint.log"
HANDOVER_ARGS = ("sleep", "infinity")
"""What the entrypoint is given as arguments (Harbor's and Terminal-Bench's container command)."""
WAIT_S = 10.0
"""How long to wait for the hand-over: an entrypoint that runs a service in the foreground never
hands over, and that must not hold up every episode for long."""


def _script(argv: Sequence[str], wait_s: float) -> str:
    command = shlex.join([*argv, *HANDOVER_ARGS])
    polls = max(1, int(wait_s / 0.1))
    # SIGHUP ignored so that the end of this exec's session does not stop the service; the
    # loop ends when the entrypoint is `sleep infinity` (it exec'd "$@") or has exited.
    return (
        f"mkdir -p /var/log 2>/dev/null; ( trap '' HUP; exec {command} ) >{ENTRYPOINT_LOG} 2>&1 </dev/null &\n"
        "pid=$!; i=0\n"
        f"while [ $i -lt {polls} ]; do\n"
        "  kill -0 $pid 2>/dev/null || exit 0\n"
        "  [ \"$(tr '\\000' ' ' </proc/$pid/cmdline 2>/dev/null)\" = 'sleep infinity ' ] && exit 0\n"
        "  sleep 0.1; i=$((i+1))\n"
        "done\n"
    )


async def start_entrypoint(sandbox: Sandbox, argv: Sequence[str], *, wait_s: float = WAIT_S) -> None:
    """Start ``argv`` (an image's ``ENTRYPOINT``) with :data:`HANDOVER_ARGS` in ``sandbox``; see the module."""
    if not argv:
        return
    result = await sandbox.exec(_script(argv, wait_s), timeout_s=wait_s + 30.0, cwd="/")
    if result.exit_code != 0:
        warnings.warn(
            f"sandbox {sandbox.id}: the image's ENTRYPOINT {shlex.join(argv)} could not be started "
            f"(exit {result.exit_code}: {(result.stderr or result.stdout).strip()[-200:]})",
            stacklevel=2,
        )
