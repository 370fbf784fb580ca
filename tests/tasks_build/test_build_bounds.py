"""What a task's Dockerfile may make the host write: a build step's layer keeps holes as holes and
stays within the build sandbox's disk, or the build fails at that step with nothing left behind.

The stores sit on a small filesystem of their own (:mod:`tests.sandbox.bwrap.small_fs`): a builder that
copied ``RUN truncate -s 100T /x`` as zeros fills that, not the host's disk.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandrl.errors import ImageBuildError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import BuildOptions, ImageBuilder

from ..sandbox.bwrap.small_fs import KINDS, allocated_bytes, holds_apparent_size, provider_on_small_store, store_state
from .conftest import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TIB = 1 << 40
SPARSE = f"""\
FROM host
RUN truncate -s {100 * TIB} /x && printf mark | dd of=/x bs=1 seek={TIB} conv=notrunc status=none
"""


@pytest.fixture(scope="module", params=KINDS)
def small(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    with provider_on_small_store(tmp_path_factory.mktemp("small-build-store"), request.param) as provider:
        yield provider


async def test_a_build_step_keeps_holes_or_is_refused_clearly(small: BwrapProvider, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(SPARSE)
    options = BuildOptions(network=False, disk_mb=64)
    before = store_state(small)
    if not holds_apparent_size(small.images.root / "layers", 100 * TIB):  # ext4: 16 TiB at most
        with pytest.raises(ImageBuildError, match=r"step 2/2 .*/x has an apparent size of 100 TiB"):
            await ImageBuilder(small).build(tmp_path / "Dockerfile", options=options)
        assert store_state(small) == before
        return
    result = await ImageBuilder(small).build(tmp_path / "Dockerfile", options=options)
    layers = small.images.meta(result.image)["layers"]
    assert isinstance(layers, list)
    layer = small.images.root / "layers" / str(layers[0])
    assert (layer / "x").stat().st_size == 100 * TIB
    assert allocated_bytes(layer) <= 64 << 20  # the build's disk_mb
    async with await small.create(SandboxSpec(image=result.image, ttl_s=60)) as sandbox:
        out = await sandbox.exec(f"stat -c %s /x; dd if=/x bs=1 skip={TIB} count=4 status=none")
    assert out.stdout.split() == [str(100 * TIB), "mark"]


async def test_a_build_step_over_its_disk_fails_at_that_step_and_leaves_nothing(
    provider: BwrapProvider, tmp_path: Path
) -> None:
    # 600 directories: nothing on the build sandbox's tmpfs, 2.4 MiB on the store's filesystem.
    (tmp_path / "Dockerfile").write_text("FROM host\nRUN mkdir /d && cd /d && seq 1 600 | xargs mkdir\n")
    before = store_state(provider)
    with pytest.raises(ImageBuildError, match=r"step 2/2 .*`RUN mkdir /d.*disk_mb=1 \(1 MiB\)") as refused:
        await ImageBuilder(provider).build(tmp_path / "Dockerfile", options=BuildOptions(network=False, disk_mb=1))
    assert "BuildOptions.disk_mb" in str(refused.value)
    assert store_state(provider) == before


def _gzip_bomb(path: Path, size: int) -> None:
    """A .tar.gz of one file of ``size`` zeros: ~1/1000 of that on disk."""
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = size
        tar.addfile(info, _Zeros(size))


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


@pytest.mark.parametrize("instruction", ["COPY big /big", "ADD bomb.tar.gz /unpacked/"], ids=["sparse", "gzip-bomb"])
async def test_copy_and_add_refuse_more_than_the_builds_disk_before_reading_it(
    provider: BwrapProvider, tmp_path: Path, instruction: str
) -> None:
    """The build context is the task's: its files are read into the host's memory to be copied in,
    so more than the build sandbox's disk is refused before they are read, not after."""
    with open(tmp_path / "big", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of holes: nothing on disk, 1 GiB once read
    _gzip_bomb(tmp_path / "bomb.tar.gz", 256 << 20)
    (tmp_path / "Dockerfile").write_text(f"FROM host\n{instruction}\n")
    before = store_state(provider)
    with pytest.raises(ImageBuildError, match=r"more than the build's disk \(64 MiB"):
        await ImageBuilder(provider).build(tmp_path / "Dockerfile", options=BuildOptions(network=False, disk_mb=64))
    assert store_state(provider) == before
