"""What a snapshot or a fork may write into the image store: holes stay holes, and a layer over its
bound (the sandbox's ``disk_mb``, the store's free space) is refused with nothing left behind.

A sandbox's writable layer is a tmpfs of ``disk_mb``, but a sparse file costs it nothing, and
directories, extended attributes and inodes cost the store more than they cost the tmpfs: each
test here makes one of those and looks at the bytes the store allocated (``st_blocks``).
The stores of the tests that would fill a disk if the code under test were wrong sit on a small
filesystem of their own (:mod:`.small_fs`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.errors import LayerTooLargeError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.layer_budget import StoreReserve

from ...support import REASON, needs_sandbox
from .small_fs import (
    KINDS,
    allocated_bytes,
    holds_apparent_size,
    provider_on_small_store,
    small_filesystem,
    store_state,
)

pytestmark = needs_sandbox

TIB = 1 << 40
MARK = "mark"


@pytest.fixture(scope="module", params=KINDS)
def small(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    with provider_on_small_store(tmp_path_factory.mktemp("small-store"), request.param) as provider:
        yield provider


def _top_layer(provider: BwrapProvider, image: str) -> Path:
    layers = provider.images.meta(image)["layers"]
    assert isinstance(layers, list)
    return provider.images.root / "layers" / str(layers[0])


async def _sparse(sandbox: BwrapSandbox, path: str, size: int, mark_at: int) -> None:
    """A file of apparent size ``size``, holes but for :data:`MARK` at ``mark_at``."""
    made = await sandbox.exec(
        f"truncate -s {size} {path} && printf {MARK} | dd of={path} bs=1 seek={mark_at} conv=notrunc status=none"
    )
    assert made.ok, made


async def _reads_sparse(sandbox: BwrapSandbox, path: str, size: int, mark_at: int) -> None:
    out = await sandbox.exec(f"stat -c '%s %b' {path}; dd if={path} bs=1 skip={mark_at} count=4 status=none")
    apparent, blocks, mark = out.stdout.split()
    assert (int(apparent), mark) == (size, MARK), out
    assert int(blocks) * 512 <= 64 << 10  # still holes where the copy's reader sees them


async def test_holes_stay_holes_in_a_snapshot_and_its_fork(small: BwrapProvider) -> None:
    size, mark_at = TIB, TIB // 2
    async with await small.create(SandboxSpec(ttl_s=120, disk_mb=32)) as sandbox:
        await _sparse(sandbox, "/workspace/x", size, mark_at)
        # Real data, and many hard links to it: one copy in the layer, not one per link.
        made = await sandbox.exec(
            "head -c 4194304 /dev/urandom > /workspace/data && "
            "for i in $(seq 1 64); do ln /workspace/data /workspace/l$i; done"
        )
        assert made.ok, made
        image = await sandbox.snapshot()
        children = await sandbox.fork(2)
    try:
        for name in (image, children[0].spec.image):
            layer = _top_layer(small, name)
            x = (layer / "workspace" / "x").stat()
            assert x.st_size == size and x.st_blocks * 512 <= 64 << 10
            assert (layer / "workspace" / "l64").stat().st_ino == (layer / "workspace" / "data").stat().st_ino
            assert allocated_bytes(layer) <= 32 << 20  # disk_mb
        for child in children:
            await _reads_sparse(child, "/workspace/x", size, mark_at)
        async with await small.create(SandboxSpec(image=image, ttl_s=60)) as copy:
            await _reads_sparse(copy, "/workspace/x", size, mark_at)
    finally:
        for child in children:
            await child.close()
        await small.remove_image(image)


async def test_a_100_tib_sparse_file_is_kept_as_holes_or_refused_clearly(small: BwrapProvider) -> None:
    """tmpfs holds files up to 8 EiB: the file is kept, holes and all; ext4 holds none over 16 TiB:
    the snapshot, the fork and their temporary directories are refused and removed."""
    size, mark_at = 100 * TIB, TIB
    kept = holds_apparent_size(small.images.root / "layers", size)
    async with await small.create(SandboxSpec(ttl_s=120, disk_mb=32)) as sandbox:
        await _sparse(sandbox, "/x", size, mark_at)
        before = store_state(small)
        if not kept:
            for attempt in (sandbox.snapshot, lambda: sandbox.fork(2)):
                with pytest.raises(LayerTooLargeError, match=r"/x has an apparent size of 100 TiB") as refused:
                    await attempt()
                assert "remove it or make it smaller" in str(refused.value)
                assert store_state(small) == before
            assert len(small.live) == 1
            assert (await sandbox.exec("true")).ok  # thawed
            return
        image = await sandbox.snapshot()
        (child,) = await sandbox.fork(1)
    try:
        assert allocated_bytes(_top_layer(small, image)) <= 32 << 20
        await _reads_sparse(child, "/x", size, mark_at)
    finally:
        await child.close()
        await small.remove_image(image)


@pytest.mark.parametrize(
    "trick",
    [
        # a directory costs a tmpfs nothing and the store a block
        "mkdir /workspace/d && cd /workspace/d && seq 1 600 | xargs mkdir",
        # an extended attribute costs a tmpfs nothing and the store a block (values differ: no sharing)
        "python3 -c \"import os\nos.mkdir('/workspace/x')\nfor i in range(400):\n"
        " p = f'/workspace/x/f{i}'; open(p, 'w').close(); os.setxattr(p, 'user.pad', str(i).encode() * 1000)\"",
    ],
    ids=["directories", "xattrs"],
)
async def test_a_layer_over_disk_mb_is_refused_and_leaves_nothing(provider: BwrapProvider, trick: str) -> None:
    async with await provider.create(SandboxSpec(ttl_s=120, disk_mb=1)) as sandbox:
        made = await sandbox.exec(trick)
        assert made.ok, made
        assert sandbox.disk_usage()[0] < 1 << 20  # within the sandbox's own bound
        before = store_state(provider)
        live = set(provider.live)
        with pytest.raises(LayerTooLargeError, match=r"disk_mb=1 \(1 MiB\)") as refused:
            await sandbox.snapshot()
        assert "create the sandbox with a larger disk_mb" in str(refused.value)
        with pytest.raises(LayerTooLargeError, match="disk_mb=1"):
            await sandbox.fork(2)
        assert store_state(provider) == before and provider.live == live
        assert (await sandbox.exec("true")).ok  # thawed


@pytest.mark.parametrize(
    "make",
    [
        "open(f'/workspace/{d}/{f}', 'w').close()",
        # one file, each link an entry of its own (the sandbox's tmpfs counts each as an inode too)
        "os.link('/workspace/one', f'/workspace/{d}/{f}')",
    ],
    ids=["files", "hard-links"],
)
async def test_a_layer_of_too_many_entries_is_refused(provider: BwrapProvider, make: str) -> None:
    async with await provider.create(SandboxSpec(ttl_s=120, disk_mb=64)) as sandbox:
        made = await sandbox.exec(
            "python3 -c \"import os\nopen('/workspace/one', 'w').close()\nfor d in range(70):\n"
            f" os.mkdir(f'/workspace/{{d}}')\n for f in range(1000): {make}\""
        )
        assert made.ok, made
        before = store_state(provider)
        with pytest.raises(LayerTooLargeError, match=r"more than 65536 files"):
            await sandbox.snapshot()
        assert store_state(provider) == before


async def test_a_tree_nested_too_deep_is_refused_clearly(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        made = await sandbox.exec(
            "python3 -c \"import os\nos.chdir('/workspace')\nfor _ in range(1500): os.mkdir('d'); os.chdir('d')\""
        )
        assert made.ok, made
        before = store_state(provider)
        with pytest.raises(LayerTooLargeError, match="nested deeper than"):
            await sandbox.snapshot()
        assert store_state(provider) == before


async def test_a_layer_the_store_has_no_room_for_is_refused_before_it_is_copied(small: BwrapProvider) -> None:
    store = small.images
    async with await small.create(SandboxSpec(ttl_s=120, disk_mb=512, memory_mb=1024)) as sandbox:
        made = await sandbox.exec("head -c 314572800 /dev/urandom > /workspace/big")  # 300 MiB: more than the store
        assert made.ok, made
        before = store_state(small)
        with pytest.raises(LayerTooLargeError, match=r"the image store .* has \d+ MiB free") as refused:
            await sandbox.snapshot()
        assert "SANDRL_STORE_MIN_FREE_MB" in str(refused.value)
        assert store_state(small) == before
        # Room for the layer, but not with the reserve kept.
        await sandbox.exec("rm /workspace/big && head -c 104857600 /dev/urandom > /workspace/big")
        default = store.reserve
        store.reserve = StoreReserve(min_free_mb=200)
        try:
            with pytest.raises(LayerTooLargeError, match="keeps 200 MiB free"):
                await sandbox.snapshot()
        finally:
            store.reserve = default
        assert store_state(small) == before
        image = await sandbox.snapshot()  # the default reserve leaves room for it
    await small.remove_image(image)


def test_an_imported_tree_keeps_its_holes(tmp_path: Path) -> None:
    """``sandrl images import`` (a tree copied into the store) keeps holes as a snapshot does."""
    with small_filesystem(tmp_path / "store", "tmpfs"):
        store = ImageStore(tmp_path / "store")
        source = tmp_path / "tree"
        source.mkdir()
        with open(source / "x", "wb") as f:
            f.truncate(TIB)
            f.seek(TIB // 2)
            f.write(MARK.encode())
        layer = store.root / "layers" / store.add_layer(source)
        st = (layer / "x").stat()
        assert st.st_size == TIB and st.st_blocks * 512 <= 64 << 10
        with open(layer / "x", "rb") as f:
            f.seek(TIB // 2)
            assert f.read(4) == MARK.encode()
