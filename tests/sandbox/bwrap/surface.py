"""Pid 1's view of its sandbox, as lines to compare between launches: what bubblewrap makes of a
full launch (``launcher="bubblewrap"``), recorded in ``bwrap_surface.txt``, is what the helper must
make of every launch (a full one and one made ahead)."""

from __future__ import annotations

import re
from pathlib import Path

from sandrl.sandbox.bwrap import BwrapSandbox

RECORDED = Path(__file__).with_name("bwrap_surface.txt")
"""bubblewrap's surface as recorded on this kind of host (Debian 12 userland, kernel 6.x), made with
``python -m tests.sandbox.bwrap.surface``; ``test_launchers`` checks it against bubblewrap live."""

SCRIPT = r"""grep -E '^(Cap|NoNewPrivs|Seccomp|NSsid|NSpgid)' /proc/1/status; echo ---
awk '{print $5, $6, $(NF-2), $(NF-1)}' /proc/self/mountinfo | sort; echo ---
ls -la /dev /dev/pts | awk '{print $1, $3, $4, $NF}'; echo ---
tr '\0' ' ' < /proc/1/cmdline; echo; hostname; id; ls /proc | grep -cE '^[0-9]+$'; cat /proc/cmdline | wc -c"""


async def facets(sandbox: BwrapSandbox) -> list[str]:
    """Pid 1's capability sets, no_new_privs, seccomp and session; the sorted mount table (points,
    options, types, sources); /dev and /dev/pts; pid 1's command line, the hostname, ids, the
    processes seen, the masked /proc/cmdline. The sandbox's own id, host uids (its tmpfs's owner)
    and the numbers of pid 1's fds are replaced by placeholders: the rest must be the same for
    every launch."""
    seen = await sandbox.exec(SCRIPT)
    assert seen.exit_code == 0, seen.stderr
    lines = re.sub(r"\b([ug]id)=\d+", r"\1=N", seen.stdout.replace(sandbox.id, "SID")).splitlines()
    # The fds pid 1 is given are numbered as they came (the provider's socket as the provider's own).
    return [re.sub(r"(/proc/self/fd/|--fd |--lock-fd |--inner-userns )\d+", r"\1N", line) for line in lines]


def recorded() -> list[str]:
    return RECORDED.read_text().splitlines()


async def _record() -> None:
    import tempfile

    from sandrl.sandbox.base import SandboxSpec
    from sandrl.sandbox.bwrap import BwrapProvider

    provider = BwrapProvider(tempfile.mkdtemp(prefix="sandrl-surface-"), launcher="bubblewrap")
    try:
        async with await provider.create(SandboxSpec(ttl_s=60, memory_mb=300, pids=200)) as sandbox:
            RECORDED.write_text("\n".join(await facets(sandbox)) + "\n")
    finally:
        await provider.close_all()


if __name__ == "__main__":
    import asyncio

    asyncio.run(_record())
