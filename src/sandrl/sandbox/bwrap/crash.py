"""Why a sandbox of the bubblewrap backend ended on its own: the sandbox's doing, or not.

Read from what the sandbox left behind (its supervisor's exit status, its memory cgroup's
counters) before its cgroup goes; :class:`~.sandbox.BwrapSandbox` puts the verdict in the
:class:`~sandrl.errors.SandboxCrashedError` it raises, so an episode can tell a failure of what
ran inside from one of the host.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

OOM_EXIT = 71
"""The agent's exit status when it cannot allocate memory."""
KILLED_EXITS = (128 + signal.SIGKILL, -signal.SIGKILL)
"""The monitor's status when the agent was SIGKILLed (128 + signal), or the monitor's own when it was
(bubblewrap, or the helper for a launch made ahead: both exit with the agent's status)."""


@dataclass(frozen=True)
class CrashEvidence:
    """What a sandbox that ended on its own left behind, read before its cgroup goes."""

    exit_status: int | None
    """The monitor's exit status: the agent's own, 128 + N when a signal N killed the agent, -N when one
    killed the monitor itself; None while it still runs (the agent stopped answering)."""
    oom_kills: int
    """Processes the sandbox's memory cgroup OOM-killed during its life."""
    memory_peak_bytes: int
    memory_limit_bytes: int


def crash_cause(evidence: CrashEvidence) -> tuple[bool, str]:
    """Whether the sandbox's own processes brought it down, and the evidence in words.

    Only memory counts as theirs: the agent could not allocate (its exit status 71: the cgroup was
    full, or a limit was put on pid 1 from inside), or it was SIGKILLed while the memory cgroup's OOM
    killer was at work. The pids limit cannot end the agent (a fork that fails is an error reply),
    and anything else (the agent's socket closed, a kill from the host, a hung agent) is not
    something the sandbox's processes can be shown to have done.
    """
    status = evidence.exit_status
    memory = (
        f"its memory cgroup OOM-killed {evidence.oom_kills} process(es) and peaked at "
        f"{evidence.memory_peak_bytes >> 20} MiB of its {evidence.memory_limit_bytes >> 20} MiB limit"
    )
    if status == OOM_EXIT:
        return True, f"its agent (pid 1) could not allocate memory (exit status {OOM_EXIT}); {memory}"
    if status in KILLED_EXITS and evidence.oom_kills > 0:
        return True, f"its agent (pid 1) was killed by SIGKILL (status {status}) while {memory}"
    if status is None:
        return False, f"its agent (pid 1) stopped answering; {memory}"
    return False, f"its agent (pid 1) ended with status {status}; {memory}"
