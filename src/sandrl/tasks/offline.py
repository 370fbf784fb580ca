"""Tests that need the network in a sandbox that has none: an infrastructure error, not a reward 0.

Many published test scripts fetch their tools when they run (``curl -LsSf
https://astral.sh/uv/install.sh | sh``, ``pip install pytest``, ``apt-get install``). In a sandbox
without the network (the task says ``allow_internet = false``, or the host has none) they fail
before testing anything, and the episode would train as a 0 the agent did not earn.

:func:`offline_failure` tells that case from a real failure in two steps: the test output names
a failure to reach the network (:data:`SIGNATURES`: curl's, wget's, pip's, apt's, npm's and git's
words for a name that does not resolve or a network that is unreachable), and the sandbox cannot
resolve the host the output names (or ``pypi.org``) when asked afterwards, from a command of the
verifier's own. Both are needed: a test that prints such words in a sandbox with a working network
failed for its own reasons, and a task whose tests do not touch the network is not affected by the
sandbox having none. A policy that prints these words and also breaks the sandbox's resolver gets
its episode dropped (an infra error is never trained on), never a reward.
"""

from __future__ import annotations

import re
import shlex

from sandrl.sandbox.base import Sandbox

SIGNATURES = re.compile(
    r"could not resolve host|couldn't resolve host|temporary failure in name resolution"
    r"|temporary failure resolving|name or service not known|nodename nor servname provided"
    r"|unable to resolve host address|network is unreachable|no route to host"
    r"|getaddrinfo (?:eai_again|enotfound)|failed to establish a new connection"
    r"|could not resolve proxy|name resolution failed",
    re.IGNORECASE,
)
"""What curl, wget, pip (urllib3), apt, npm, git and glibc print when the network is not there."""
_HOST = re.compile(
    r"(?:resolve host:?|resolving|host address|getaddrinfo \w+)\s+['\"]?([A-Za-z0-9][A-Za-z0-9.-]*\.[A-Za-z]{2,})"
    r"|https?://([A-Za-z0-9][A-Za-z0-9.-]*\.[A-Za-z]{2,})",
    re.IGNORECASE,
)
FALLBACK_HOST = "pypi.org"
PROBE_TIMEOUT_S = 20.0


def failed_host(output: str) -> tuple[str, str] | None:
    """The first network failure the output names (the line, trimmed) and the host it was about."""
    for line in output.splitlines():
        if SIGNATURES.search(line):
            match = _HOST.search(line)
            host = (match.group(1) or match.group(2)) if match else None
            if host is None:
                # curl prints the URL on an earlier line than its error; so does pip.
                urls = _HOST.findall(output)
                host = next((a or b for a, b in urls), FALLBACK_HOST)
            return line.strip()[:300], host
    return None


def _probe(host: str) -> str:
    """Exit 0 when ``host`` resolves in the sandbox, 1 when it does not, 2 when nothing can tell."""
    quoted = shlex.quote(host)
    return (
        f"if command -v getent >/dev/null 2>&1; then getent hosts {quoted} >/dev/null 2>&1 || exit 1; "
        f"elif command -v python3 >/dev/null 2>&1; then "
        f"python3 -c 'import socket, sys; socket.getaddrinfo(sys.argv[1], 443)' {quoted} >/dev/null 2>&1 || exit 1; "
        "else exit 2; fi"
    )


async def offline_failure(sandbox: Sandbox, output: str, *, allow_internet: bool) -> str | None:
    """Why the failed tests are an infrastructure error (they needed the network and the sandbox has
    none), or None when they failed for their own reasons."""
    found = failed_host(output)
    if found is None:
        return None
    line, host = found
    probe = await sandbox.exec(_probe(host), timeout_s=PROBE_TIMEOUT_S, cwd="/")
    if probe.exit_code == 0:
        return None  # the network is there: the tests failed for another reason
    why = (
        "the task sets allow_internet = false (network_mode = 'no-network')"
        if not allow_internet
        else "this host gives the sandbox no network"
    )
    return (
        f"the tests needed the network and the sandbox has none ({why}): {line!r}; "
        f"{host} does not resolve in the sandbox. Install the tools the tests fetch in the task's image "
        "(its Dockerfile), or run where the sandbox has the network"
    )
