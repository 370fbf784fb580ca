"""Pause/resume, snapshots and forks of live sandboxes, on real sandboxes."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator

import pytest

from sandrl.errors import SandboxError
from sandrl.sandbox.base import Pausable, SandboxSpec, Snapshottable
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.images import Image

from ...support import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(autouse=True)
async def _forks_give_back_their_launches_made_ahead(provider: BwrapProvider) -> AsyncIterator[None]:
    """These tests fork on the session's shared provider, and a fork keeps launches made ahead for the
    next one (up to 16, :mod:`sandrl.sandbox.bwrap.premade`): left there, they held helpers, cgroups
    and records for the rest of the session, and later tests' creates took them and refilled the pool
    in the background (``test_lifecycle``'s leak tests then counted the refill's records as leaks)."""
    yield
    await provider.premade.close()


async def test_pause_stops_the_cpu_and_the_ttl_and_resume_goes_on(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=6)) as sandbox:
        assert isinstance(sandbox, Pausable)
        await sandbox.exec(
            "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/m; mv /tmp/m /tmp/n; done' >/dev/null 2>&1 &"
        )
        await asyncio.sleep(0.3)
        await sandbox.pause()
        assert sandbox.paused
        with pytest.raises(SandboxError, match="paused"):
            await sandbox.exec("true")
        cpu = sandbox.stats().cpu_s
        await asyncio.sleep(7)  # past the TTL it had: a paused sandbox's clock does not run
        assert sandbox.stats().cpu_s - cpu < 0.05  # frozen: no CPU at all
        assert not sandbox.closed
        await sandbox.resume()
        before = int((await sandbox.exec("cat /tmp/n")).stdout)
        await asyncio.sleep(0.3)
        after = int((await sandbox.exec("cat /tmp/n")).stdout)
        assert after > before > 0  # the loop went on where it was
        assert 4 < sandbox.expires_at - time.time() < 6.5  # what was left of the TTL at the pause
    # Closing works from paused too, at once.
    sandbox = await provider.create(SandboxSpec(ttl_s=60))
    await sandbox.pause()
    started = time.monotonic()
    await sandbox.close()
    assert time.monotonic() - started < 1.5


async def test_a_snapshot_keeps_the_files_of_its_moment(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=60, env={"FROM_SPEC": "1"})) as sandbox:
        assert isinstance(sandbox, Snapshottable)
        await sandbox.exec("mkdir -p /work && echo before > /work/a && rm -rf /tmp/* && echo t > /tmp/t")
        image = await sandbox.snapshot()
        await sandbox.exec("echo after > /work/a && echo later > /work/b")
    async with await provider.create(SandboxSpec(image=image, ttl_s=60)) as copy:
        out = await copy.exec("cat /work/a; test -e /work/b || echo no-b; cat /tmp/t; cat /etc/hostname >/dev/null")
    assert out.stdout.splitlines() == ["before", "no-b", "t"]
    assert provider.images.meta(image)["config"]["snapshot_of"] == sandbox.id  # type: ignore[index]


async def test_a_fork_of_16_sees_the_parent_and_not_each_other(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=60, memory_mb=256)) as parent:
        await parent.exec("echo setup > /workspace/state")
        children = await parent.fork(16)
        try:
            assert len({c.id for c in children}) == 16 and all(c.spec.memory_mb == 256 for c in children)
            await asyncio.gather(*(c.exec(f"echo {i} > /workspace/mine") for i, c in enumerate(children)))
            outs = await asyncio.gather(*(c.exec("cat /workspace/state /workspace/mine") for c in children))
            assert [o.stdout.split() for o in outs] == [["setup", str(i)] for i in range(16)]
            assert (await parent.exec("test -e /workspace/mine || echo parent-clean")).stdout == "parent-clean\n"
            await parent.exec("echo changed > /workspace/state")
            assert (await children[0].exec("cat /workspace/state")).stdout == "setup\n"
        finally:
            await asyncio.gather(*(c.close() for c in children))


async def test_a_forks_children_share_one_lookup_of_their_image(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup of a snapshot stacked on ``host`` scans the host's system directories: ~0.2 ms of
    the event loop, which a fork of 16 paid 16 times for one image at one moment."""
    looked_up: list[str] = []
    get = provider.images.get

    def counting_get(name: str, **kwargs: int) -> Image:
        looked_up.append(name)
        return get(name, **kwargs)

    monkeypatch.setattr(provider.images, "get", counting_get)
    async with await provider.create(SandboxSpec(ttl_s=60)) as parent:
        await parent.exec("echo setup > /workspace/state")
        looked_up.clear()
        children = await parent.fork(4)
        try:
            outs = await asyncio.gather(*(c.exec("cat /workspace/state") for c in children))
            assert [o.stdout for o in outs] == ["setup\n"] * 4
        finally:
            await asyncio.gather(*(c.close() for c in children))
    image = children[0].spec.image
    assert looked_up.count(image) <= 2  # the store's own when it registers the image, and the fork's


async def test_fork_refuses_nonsense(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        for n in (0, -1, 1000, True):
            with pytest.raises(Exception, match="between 1 and"):
                await sandbox.fork(n)  # type: ignore[arg-type]


async def test_removing_a_snapshot_frees_its_layer_once_nothing_runs_on_it(provider: BwrapProvider) -> None:
    assert provider.snapshots  # said before any sandbox exists (SnapshotProvider)
    layers = provider.images.root / "layers"
    before = set(layers.iterdir())
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        await sandbox.exec("echo kept > /workspace/f")
        image = await sandbox.snapshot("fork-removal-test")
    (own,) = set(layers.iterdir()) - before
    child = await provider.create(SandboxSpec(image=image, ttl_s=60))
    await provider.remove_image(image)  # a live sandbox has the layer mounted: it stays
    assert not provider.images.exists(image) and own.is_dir()
    assert (await child.exec("cat /workspace/f")).stdout == "kept\n"
    await child.close()
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        again = await sandbox.snapshot("fork-removal-test")
    await provider.remove_image(again)
    assert set(layers.iterdir()) == before | {own}  # the first one's layer waits for `sandrl images prune`
    with pytest.raises(Exception, match="not an image a snapshot made"):
        await provider.remove_image("host")


async def test_a_snapshot_copies_links_as_links_never_their_targets(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        await sandbox.exec(
            "ln -s /etc/shadow /workspace/shadow && ln -s /root /workspace/rootdir && "
            "echo x > /workspace/a && ln /workspace/a /workspace/hard && mkfifo /workspace/fifo"
        )
        image = await sandbox.snapshot("fork-links-test")
    try:
        layer = provider.images.root / "layers" / str(provider.images.meta(image)["layers"][0])  # type: ignore[index]
        work = layer / "workspace"
        assert os.readlink(work / "shadow") == "/etc/shadow" and os.readlink(work / "rootdir") == "/root"
        assert (work / "a").stat().st_ino == (work / "hard").stat().st_ino and (work / "a").read_text() == "x\n"
        assert stat.S_ISFIFO((work / "fifo").lstat().st_mode)
    finally:
        await provider.remove_image(image)
