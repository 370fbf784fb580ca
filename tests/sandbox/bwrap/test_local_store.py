"""``sandrl sandbox ls|gc`` on a host shared by several runs, and leak checks that count only their own.

Each test crowds a state directory of its own with sandboxes of three owners: this process, another
process that is alive, and processes that were killed (a sandbox of theirs that died with them, and
a paused one that lives on, frozen, without its owner).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

_OWNER = """
import asyncio, sys
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
async def main():
    p = BwrapProvider({state!r})
    made = []
    for pause in {pauses!r}:
        sb = await p.create(SandboxSpec(ttl_s=120))
        if pause:
            await sb.pause()
        made += [sb.id, str(sb.uid)]
    print(*made, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test lets go
    await p.close_all()
asyncio.run(main())
"""


@dataclass
class Owner:
    """A process of its own that made sandboxes in the state directory: (id, uid) of each."""

    proc: subprocess.Popen[str]
    made: list[tuple[str, int]]

    @property
    def sid(self) -> str:
        return self.made[0][0]

    @property
    def uid(self) -> int:
        return self.made[0][1]


def _start_owner(state: Path, *pauses: bool) -> subprocess.Popen[str]:
    """A process that makes one sandbox per item of ``pauses`` (paused where it is true)."""
    script = textwrap.dedent(_OWNER).format(state=str(state), pauses=list(pauses or [False]))
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/"
    )


def _ready(proc: subprocess.Popen[str]) -> Owner:
    assert proc.stdout is not None
    words = proc.stdout.readline().split()
    assert words and len(words) % 2 == 0, f"the owner process did not make its sandboxes (exit {proc.poll()})"
    return Owner(proc, [(words[i], int(words[i + 1])) for i in range(0, len(words), 2)])


def _kill(owner: Owner) -> None:
    os.kill(owner.proc.pid, signal.SIGKILL)
    owner.proc.wait()


def _release(owner: Owner) -> None:
    if owner.proc.poll() is None:
        assert owner.proc.stdin is not None
        owner.proc.stdin.close()
        try:
            owner.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            owner.proc.kill()
            owner.proc.wait()
    for stream in (owner.proc.stdin, owner.proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()


@dataclass
class Crowd:
    state: Path
    provider: BwrapProvider
    mine: BwrapSandbox
    other: Owner
    """A live process's sandbox."""
    killed: Owner
    """A killed process's two sandboxes: one that died with it, one paused that lives on, frozen."""

    @property
    def dead(self) -> tuple[str, int]:
        return self.killed.made[0]

    @property
    def orphaned(self) -> tuple[str, int]:
        return self.killed.made[1]

    def all_ids(self) -> set[str]:
        return {self.mine.id, self.other.sid, self.dead[0], self.orphaned[0]}


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's state directory (its sandbox helper is built once); each test leaves it empty."""
    return tmp_path_factory.mktemp("shared-host")


@pytest.fixture
async def crowd(state: Path) -> AsyncIterator[Crowd]:
    # This process's provider comes first: a provider that starts reaps what dead ones left.
    provider = BwrapProvider(state)
    assert provider.state.records() == []
    started = [_start_owner(state), _start_owner(state, False, True)]
    mine = await provider.create(SandboxSpec(ttl_s=120))
    other, killed = (_ready(p) for p in started)
    _kill(killed)
    crowd = Crowd(state, provider, mine, other, killed)
    # The dead one's pid 1 sees its provider's socket close and exits; the paused one is frozen.
    deadline = time.monotonic() + 10
    while provider.state.sandbox_processes({crowd.dead[1]}) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert provider.state.sandbox_processes({crowd.orphaned[1]}), "the paused sandbox should live on, frozen"
    try:
        yield crowd
    finally:
        for owner in (other, killed):
            _release(owner)
        await provider.close_all()
        BwrapProvider(state)  # reaps what a test left (the orphaned sandbox, say)


def _cli(args: list[str], input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, input=input, env={"COLUMNS": "250"})
    return result.exit_code, result.output


def _listed(state: Path) -> dict[str, dict[str, object]]:
    code, output = _cli(["sandbox", "ls", "--state-dir", str(state), "--json"])
    assert code == 0, output
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return {str(row["id"]): row for row in rows}


async def test_ls_shows_every_runs_sandboxes_and_gc_removes_only_the_dead(crowd: Crowd) -> None:
    rows = _listed(crowd.state)
    assert set(rows) == crowd.all_ids()
    mine, other, dead, orphaned = (rows[s] for s in (crowd.mine.id, crowd.other.sid, crowd.dead[0], crowd.orphaned[0]))
    assert (mine["state"], mine["owner_pid"], mine["owner_alive"]) == ("live", os.getpid(), True)
    assert (other["state"], other["owner_pid"], other["owner_alive"]) == ("live", crowd.other.proc.pid, True)
    assert str(other["owner_command"]).startswith(f"{sys.executable} -c  import asyncio")  # whose: its command
    assert (dead["state"], dead["owner_pid"], dead["owner_alive"]) == ("dead", crowd.killed.proc.pid, False)
    assert (orphaned["state"], orphaned["owner_alive"], orphaned["paused"]) == ("orphaned", False, True)
    assert all(row["cgroups"] for row in rows.values())  # each one's cgroups are found, the dead one's too
    assert all(row["image"] == "host" for row in rows.values())

    code, table = _cli(["sandbox", "ls", "--state-dir", str(crowd.state)])
    assert code == 0, table
    lines = {line.split()[0]: line for line in table.splitlines() if line.startswith("sb-")}
    assert f"pid {crowd.other.proc.pid} (" in lines[crowd.other.sid] and " live " in lines[crowd.other.sid]
    assert " dead " in lines[crowd.dead[0]] and f"pid {crowd.killed.proc.pid} (gone)" in lines[crowd.dead[0]]
    assert "4 sandboxes: 2 live, 1 orphaned, 1 dead" in table and "sandrl sandbox gc" in table

    # gc, on the same crowd (one is costly to make): it asks, and removes only what is dead.
    state = str(crowd.state)
    for answer in ("n\n", ""):  # declined, or no answer at all (not a terminal): nothing goes
        code, output = _cli(["sandbox", "gc", "--state-dir", state], input=answer)
        assert code == 1 and "remove these 1?" in output, output
        assert crowd.dead[0] in output and crowd.other.sid not in output and crowd.orphaned[0] not in output
        assert set(_listed(crowd.state)) == crowd.all_ids()

    code, output = _cli(["sandbox", "gc", "--state-dir", state, "--yes"])
    assert code == 0, output
    assert "removed 1 dead sandbox" in output
    assert set(_listed(crowd.state)) == crowd.all_ids() - {crowd.dead[0]}
    assert not (crowd.state / "sandboxes" / crowd.dead[0]).exists()
    assert crowd.dead[0] not in crowd.provider.cgroups.stale_groups()
    assert (await crowd.mine.exec("echo still")).stdout == "still\n"  # this process's: untouched

    # Told to, gc also kills sandboxes whose owner is gone, and never those of a live owner.
    code, output = _cli(["sandbox", "gc", "--state-dir", state, "--orphans", "--yes"])
    assert code == 0 and "killed 1 orphaned" in output, output
    assert set(_listed(crowd.state)) == {crowd.mine.id, crowd.other.sid}
    deadline = time.monotonic() + 5
    while crowd.provider.state.sandbox_processes({crowd.orphaned[1]}) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert crowd.provider.state.sandbox_processes({crowd.orphaned[1]}) == []
    assert crowd.provider.state.sandbox_processes({crowd.other.uid})  # the live owner's sandbox runs on
    assert (await crowd.mine.exec("echo still")).stdout == "still\n"
    code, output = _cli(["sandbox", "gc", "--state-dir", state, "--orphans"])
    assert code == 0 and "nothing to remove" in output and "2 live" in output, output


def test_the_commands_of_the_store_say_where_it_is() -> None:
    for command in (["sandbox"], ["sandbox", "ls"], ["sandbox", "gc"], ["images"], ["serve", "sandboxes"]):
        code, output = _cli([*command, "--help"])
        assert code == 0 and "$SANDRL_STATE_DIR" in output, (command, output)


@pytest.fixture
def another_run(state: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Owner]]:
    """The CLI's default state directory, where another process's sandbox is live."""
    monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state)
    owner = _ready(_start_owner(state))
    try:
        yield state, owner
    finally:
        _release(owner)


def test_the_sandbox_demos_leak_check_counts_only_its_own(another_run: tuple[Path, Owner]) -> None:
    state, other = another_run
    code, output = _cli(["demo", "sandbox"])
    assert code == 0, output
    assert "left behind: nothing" in output, output
    assert other.sid not in output
    assert (state / "sandboxes" / other.sid).is_dir()  # and it did not touch the other run's sandbox
