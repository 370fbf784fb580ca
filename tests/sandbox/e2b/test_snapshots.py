"""Snapshots and forks through the official e2b SDK (sync and async) against a real sandrl server."""

from __future__ import annotations

from e2b import AsyncSandbox, Sandbox

from .conftest import E2BServer


def test_a_snapshot_is_a_template_and_can_be_deleted(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    made: list[Sandbox] = []
    try:
        sb.files.write("/workspace/state.txt", "prepared")
        info = sb.create_snapshot()
        sb.files.write("/workspace/state.txt", "changed later")
        assert info.snapshot_id in info.names
        copy = Sandbox.create(info.snapshot_id, timeout=60)
        made.append(copy)
        assert copy.files.read("/workspace/state.txt") == "prepared"
        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Sandbox.delete_snapshot(info.snapshot_id) is False  # gone: the SDK's 404
    finally:
        for s in [sb, *made]:
            s.kill()


def test_fork_makes_independent_children(e2b_server: E2BServer) -> None:
    parent = Sandbox.create(timeout=60, metadata={"suite": "fork"})
    children: list[Sandbox] = []
    try:
        parent.commands.run("echo setup > /workspace/s")
        forked = parent.fork(count=3, timeout=30)
        children = [c for c in forked if isinstance(c, Sandbox)]
        assert len(children) == 3, forked
        for i, child in enumerate(children):
            child.commands.run(f"echo {i} > /workspace/mine")
        assert [c.commands.run("cat /workspace/s /workspace/mine").stdout for c in children] == [
            f"setup\n{i}\n" for i in range(3)
        ]
        assert parent.commands.run("test -e /workspace/mine || echo clean").stdout == "clean\n"
        assert all(c.get_info().metadata == {"suite": "fork"} for c in children)
    finally:
        for s in [parent, *children]:
            s.kill()


async def test_async_fork(e2b_server: E2BServer) -> None:
    parent = await AsyncSandbox.create(timeout=60)
    try:
        await parent.files.write("/workspace/x", "1")
        (child,) = await parent.fork(count=1)
        assert isinstance(child, AsyncSandbox)
        try:
            assert await child.files.read("/workspace/x") == "1"
        finally:
            await child.kill()
    finally:
        await parent.kill()
