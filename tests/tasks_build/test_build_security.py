"""A hostile Dockerfile cannot give a host user root: what a build leaves in the store.

The store sits in a world-traversable state directory (as ``/var/lib/sandrl``), so only the
store's own protections stand between a host user and the layer the build wrote.
"""

from __future__ import annotations

import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, images
from sandrl.sandbox.bwrap.dockerfile.builder import ImageBuilder

from ..sandbox.bwrap.hostuser import as_nobody, layer_entries, outside_range, setid_files, world_traversable_dir
from .conftest import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

HOSTILE = """\
FROM host
RUN cp /usr/bin/python3 /usr/local/bin/x && chmod 4755 /usr/local/bin/x \\
    && cp /usr/bin/python3 /usr/local/bin/y && chmod 2755 /usr/local/bin/y \\
    && mkdir /srv/open && chmod 777 /srv/open
"""


@pytest.fixture
def open_provider() -> Iterator[BwrapProvider]:
    """A provider whose state directory any host user may enter."""
    parent = world_traversable_dir(Path("/tmp"), f"sandrl-test-{uuid.uuid4().hex[:12]}")
    provider = BwrapProvider(parent / "state")
    try:
        yield provider
    finally:
        provider._close_all_sync()
        shutil.rmtree(parent, ignore_errors=True)


async def test_setuid_build_gives_host_users_nothing(open_provider: BwrapProvider, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(HOSTILE)
    built = await ImageBuilder(open_provider).build(tmp_path / "Dockerfile")
    store = open_provider.images.root
    planted = [p for p in (store / "layers").glob("*/usr/local/bin/x")]
    assert len(planted) == 1
    x = planted[0]
    open_dir = x.parents[4] / "srv" / "open"
    ran = as_nobody(str(x), "-c", "import os; print(os.geteuid())")
    assert ran.returncode != 0 and ran.stdout.strip() != "0", f"a host user ran the planted file: {ran}"
    assert as_nobody("test", "-e", str(x)).returncode != 0
    assert as_nobody("touch", str(open_dir / "planted")).returncode != 0
    assert not (open_dir / "planted").exists()
    entries = layer_entries(store)
    assert setid_files(entries) == []
    assert outside_range(entries, images.STORE_UID_BASE) == []
    for d in (store, store / "images", store / "layers", store / "host"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d

    # Inside, the image looks as the Dockerfile made it, minus the setuid and setgid bits.
    spec = SandboxSpec(image=built.image, ttl_s=60)
    async with await open_provider.create(spec) as sandbox:
        result = await sandbox.exec("stat -c '%u %g %a' /usr/local/bin/x /usr/local/bin/y /srv/open")
    assert result.exit_code == 0, result
    assert result.stdout.splitlines() == ["0 0 755", "0 0 755", "0 0 777"]
