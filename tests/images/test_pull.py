"""Pulling from a real registry on loopback into the bubblewrap store, and running what was pulled.

Nothing stands between sandrl and the registry but, where a test says so, the fault proxy (which
forwards to the real registry and breaks a response on purpose).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.errors import ImageError, LayerError, RegistryError
from sandrl.images.credentials import DockerConfig
from sandrl.images.host_rootfs import shell_layer
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import ImageConfig, Platform
from sandrl.images.oci_layout import (
    LayerSpec,
    directory,
    hardlink,
    opaque_whiteout,
    raw_entry,
    regular_file,
    symlink,
    whiteout,
)
from sandrl.images.pull import PullEvent
from sandrl.images.reference import Mirrors
from sandrl.images.registry import RegistryClient
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.layer_owners import STORE_UID_BASE
from sandrl.sandbox.bwrap.pulled import layer_id, pull_into_store

from ..support import REASON as SANDBOX_REASON
from .conftest import AUTH_PASSWORD, AUTH_USER, PushImage, needs_registry
from .fault_proxy import FaultProxy
from .token_server import TokenServer

pytestmark = [needs_registry, pytest.mark.skipif(SANDBOX_REASON is not None, reason=SANDBOX_REASON or "")]


def _client(*, retries: int = 5, backoff_s: float = 0.05) -> RegistryClient:
    """A client that sees no mirrors and no credentials of the machine it runs on."""
    return RegistryClient(
        mirrors=Mirrors(), docker_config=DockerConfig(Path("/nonexistent")), retries=retries, backoff_s=backoff_s
    )


def _changes() -> list[LayerSpec]:
    """Layer 2 adds files, a hard link and a symlink; layer 3 (zstd) deletes one file and
    replaces a directory (opaque), as `rm` and `rm -rf d && mkdir d` in a Dockerfile would."""
    return [
        LayerSpec(
            [
                directory("data"),
                regular_file("data/a", "alpha\n"),
                regular_file("data/keep", "kept\n", mode=0o4755),
                hardlink("data/keep-link", "data/keep"),
                symlink("data/to-a", "a"),
                directory("data/dir"),
                regular_file("data/dir/old", "old\n"),
            ]
        ),
        LayerSpec(
            [whiteout("data/a"), opaque_whiteout("data/dir"), regular_file("data/dir/new", "new\n", uid=1000)],
            compression="zstd",
        ),
    ]


async def test_pull_by_tag_and_run_it(provider: BwrapProvider, push_image: PushImage, rootfs: Path) -> None:
    config = ImageConfig(env={"PATH": "/usr/bin:/bin", "GREETING": "hi there"}, workdir="/data")
    pushed = push_image([shell_layer(rootfs), *_changes()], config)
    async with _client() as client:
        name = await pull_into_store(provider.images, pushed.ref, client=client)
    meta = provider.images.meta(name)
    record = meta["config"]
    assert isinstance(record, dict) and record["digest"] == pushed.digest and record["source"] == pushed.ref
    async with await provider.create(SandboxSpec(image=name, workdir="/data", ttl_s=60)) as sandbox:
        out = await sandbox.exec(
            "echo $GREETING; pwd; ls /data; cat /data/dir/new; test -e /data/dir/old || echo old-gone; "
            "test -e /data/a || echo a-gone; stat -c %i /data/keep /data/keep-link; stat -c %u:%a /data/dir/new "
            "/data/keep"
        )
    assert out.ok, out
    lines = out.stdout.splitlines()
    assert lines[:2] == ["hi there", "/data"]
    assert lines[2:6] == ["dir", "keep", "keep-link", "to-a"]  # a is whited out; to-a dangles
    assert lines[6:9] == ["new", "old-gone", "a-gone"]
    assert lines[9] == lines[10]  # the hard link is one inode
    assert lines[11:] == ["1000:644", "0:755"]  # owners as the tar said; setuid dropped
    # On the host the layers are the store's: its uid range, no setuid bit anywhere.
    for lid in meta["layers"]:  # type: ignore[union-attr]
        for path in (provider.images.root / "layers" / str(lid)).rglob("*"):
            st = os.lstat(path)
            assert st.st_uid >= STORE_UID_BASE and not (st.st_mode & stat.S_ISUID and not stat.S_ISDIR(st.st_mode))


async def test_pull_by_digest_and_the_second_pull_uses_the_store(
    provider: BwrapProvider, push_image: PushImage, rootfs: Path, fault_proxy: FaultProxy
) -> None:
    pushed = push_image([shell_layer(rootfs), *_changes()])
    ref = f"{fault_proxy.host}/{pushed.repository}@{pushed.digest}"
    async with _client() as client:
        name = await pull_into_store(provider.images, ref, client=client)
        again = await pull_into_store(provider.images, ref, client=client)
    assert name == again and fault_proxy.count("GET", "/manifests/") == 1  # cached: no second request
    async with await provider.create(SandboxSpec(image=name, ttl_s=60)) as sandbox:
        assert (await sandbox.exec("cat /data/keep")).stdout == "kept\n"


async def test_a_corrupt_blob_is_refused_and_nothing_is_kept(
    push_image: PushImage, registry: LocalRegistry, tmp_path: Path
) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "x" * 5000)])])
    layer = pushed.layout.read_blob(pushed.manifests[0].digest)
    digest = json.loads(layer)["layers"][0]["digest"]
    data = registry.storage / "docker/registry/v2/blobs/sha256" / digest[7:9] / digest[7:] / "data"
    blob = bytearray(data.read_bytes())
    blob[-20] ^= 0xFF  # same size, other bytes: what a bad mirror or a flipped bit serves
    data.write_bytes(bytes(blob))
    store = ImageStore(tmp_path / "store")
    async with _client(retries=0) as client:
        with pytest.raises(LayerError, match="refused"):
            await pull_into_store(store, pushed.ref, client=client)
    assert not (store.root / "layers" / layer_id(digest)).exists()
    assert [p.name for p in (store.root / "layers" / ".pull").iterdir() if not p.name.endswith(".lock")] == []


async def test_a_pinned_digest_that_is_not_the_tags_is_refused(push_image: PushImage, tmp_path: Path) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "one")])])
    other = "sha256:" + "0" * 64
    async with _client(retries=0) as client:
        with pytest.raises(RegistryError, match=r"MANIFEST_UNKNOWN|manifest unknown|404"):
            await pull_into_store(
                ImageStore(tmp_path / "s"), f"{pushed.registry.host}/{pushed.repository}@{other}", client=client
            )


async def test_auth_comes_from_docker_config(
    push_image: PushImage, auth_registry: LocalRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushed = push_image([LayerSpec([regular_file("secret", "s")])], registry=auth_registry)
    store = ImageStore(tmp_path / "store")
    async with _client(retries=0) as client:
        with pytest.raises(RegistryError, match="docker login"):
            await pull_into_store(store, pushed.ref, client=client)
    auth = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    name = await pull_into_store(store, pushed.ref)  # the default client reads $DOCKER_CONFIG
    assert store.exists(name)


async def test_rate_limits_and_server_errors_are_retried(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "retry me")])])
    fault_proxy.fail_next("/manifests/", status=429, times=2, retry_after="0")
    fault_proxy.fail_next("/blobs/", status=503, times=1)
    async with _client(backoff_s=0.01) as client:
        name = await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
    assert name
    statuses = [r.status for r in fault_proxy.requests]
    assert statuses.count(429) == 2 and statuses.count(503) == 1


async def test_an_interrupted_download_resumes_without_a_corrupt_image(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    big = os.urandom(3 << 20)
    pushed = push_image([LayerSpec([regular_file("big", big)], compression="none")])
    manifest = json.loads(pushed.layout.read_blob(pushed.manifests[0].digest))
    digest = manifest["layers"][0]["digest"]
    store = ImageStore(tmp_path / "store")
    ref = pushed.ref_via(fault_proxy.host)
    fault_proxy.cut_next(f"/blobs/{digest}", after_bytes=1 << 20)
    async with _client(retries=0) as client:  # the pull gives up at the cut...
        with pytest.raises(RegistryError, match="continues where it stopped"):
            await pull_into_store(store, ref, client=client)
    partial = store.root / "layers/.pull" / f"{digest.replace(':', '-')}.blob.partial"
    assert partial.exists() and 0 < partial.stat().st_size < len(big) + 2048
    async with _client() as client:  # ...and the next one continues it
        name = await pull_into_store(store, ref, client=client)
    ranged = [r for r in fault_proxy.requests if digest in r.path and "range" in {k.lower() for k in r.headers}]
    assert ranged, "the second pull asked only for the rest"
    tree = store.root / "layers" / layer_id(digest) / "big"
    assert tree.read_bytes() == big and store.exists(name)


async def test_concurrent_pulls_fetch_a_shared_layer_once(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    pushed = push_image([LayerSpec([regular_file("shared", os.urandom(1 << 20))])])
    digest = json.loads(pushed.layout.read_blob(pushed.manifests[0].digest))["layers"][0]["digest"]
    store = ImageStore(tmp_path / "store")
    ref = pushed.ref_via(fault_proxy.host)
    async with _client() as client:
        names = await asyncio.gather(*(pull_into_store(store, ref, client=client, refresh=True) for _ in range(3)))
    assert len(set(names)) == 1
    assert fault_proxy.count("GET", f"/blobs/{digest}") == 1


async def test_a_second_image_sharing_all_but_one_layer_downloads_only_that_layer(
    push_image: PushImage, tmp_path: Path
) -> None:
    contents = [os.urandom(4096) for _ in range(3)]

    def layers(top: str) -> list[LayerSpec]:
        below = [LayerSpec([regular_file(f"l{i}", data)]) for i, data in enumerate(contents)]
        return [*below, LayerSpec([regular_file("top", top)])]

    first = push_image(layers("1"))
    second = push_image(layers("2"))
    store = ImageStore(tmp_path / "store")
    events: list[PullEvent] = []
    async with _client() as client:
        await pull_into_store(store, first.ref, client=client)
        await pull_into_store(store, second.ref, client=client, on_event=events.append)
    assert [e.kind for e in events].count("layer-start") == 1
    assert [e.kind for e in events].count("layer-cached") == 3


@pytest.mark.parametrize("attack", ["dotdot", "symlink-dir", "symlink-parent", "hardlink-out"])
async def test_a_malicious_layer_leaves_the_host_untouched(push_image: PushImage, tmp_path: Path, attack: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = {
        "dotdot": [raw_entry(_file_info(f"../../../../../../../..{outside}/x"), b"pwned")],
        "symlink-dir": [symlink("x", str(outside)), raw_entry(_file_info("x/evil"), b"pwned")],
        "symlink-parent": [symlink("up", "../../../../../../../.."), raw_entry(_file_info(f"up{outside}/evil"), b"p")],
        "hardlink-out": [raw_entry(_link_info("steal", "/etc/passwd"))],
    }[attack]
    pushed = push_image([LayerSpec(entries)])
    store = ImageStore(tmp_path / "store")
    async with _client(retries=0) as client:
        with pytest.raises(ImageError):
            await pull_into_store(store, pushed.ref, client=client)
    assert list(outside.iterdir()) == []
    leftovers = [p for p in (store.root / "layers").iterdir() if p.name != ".pull"]
    assert leftovers == []


def _file_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 5
    return info


def _link_info(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    return info


async def test_an_index_gives_each_platform_its_manifest(push_image: PushImage, tmp_path: Path) -> None:
    layer = LayerSpec([regular_file("hello", "hi")])
    pushed = push_image(
        [layer],
        platforms=[
            ImageConfig(platform=Platform(architecture="amd64")),
            ImageConfig(platform=Platform(architecture="arm64", variant="v8")),
        ],
    )
    store = ImageStore(tmp_path / "store")
    async with _client() as client:
        host = await pull_into_store(store, pushed.ref, client=client)
        arm = await pull_into_store(store, pushed.ref, client=client, platform=Platform.parse("linux/arm64"))
        with pytest.raises(RegistryError, match=r"no image for linux/s390x \(it has: linux/amd64, linux/arm64/v8\)"):
            await pull_into_store(store, pushed.ref, client=client, platform=Platform.parse("linux/s390x"))
    assert host != arm
    platforms = {store.meta(n)["config"]["platform"] for n in (host, arm)}  # type: ignore[index]
    assert platforms == {"linux/amd64", "linux/arm64/v8"}


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, TokenServer]]:
    """A registry with Docker Hub's auth scheme: 401 + a token service, JWTs it verifies itself."""
    root = tmp_path_factory.mktemp("token-registry")
    tokens = TokenServer(root / "tokens", {AUTH_USER: AUTH_PASSWORD}).start()
    registry = LocalRegistry(root / "registry", users={AUTH_USER: AUTH_PASSWORD}, token=tokens.registry_config())
    with registry:
        yield registry, tokens
    tokens.stop()


async def test_the_bearer_token_flow_with_credentials_from_docker_config(
    push_image: PushImage,
    token_registry: tuple[LocalRegistry, TokenServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, tokens = token_registry
    pushed = push_image([LayerSpec([regular_file("tokened", "t")])], registry=registry)
    store = ImageStore(tmp_path / "store")
    async with _client(retries=0) as client:
        with pytest.raises(RegistryError, match=r"token service .* refused"):
            await pull_into_store(store, pushed.ref, client=client)  # no credentials: the token is refused
    auth = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    tokens.requests.clear()
    async with RegistryClient(mirrors=Mirrors()) as client:
        name = await pull_into_store(store, pushed.ref, client=client)
    assert store.exists(name)
    # One token for the pull's scope, asked with the user's credentials, reused for every blob.
    assert len(tokens.requests) == 1
    assert tokens.requests[0]["scope"] == f"repository:{pushed.repository}:pull"
    assert tokens.requests[0]["authorization"].startswith("Basic ")


async def test_an_image_whose_layer_was_removed_is_pulled_again(push_image: PushImage, tmp_path: Path) -> None:
    pushed = push_image([LayerSpec([regular_file("again", "a")])])
    store = ImageStore(tmp_path / "store")
    async with _client() as client:
        name = await pull_into_store(store, pushed.ref, client=client)
        layers = store.meta(name)["layers"]
        assert isinstance(layers, list)
        shutil.rmtree(store.root / "layers" / str(layers[0]))
        assert await pull_into_store(store, pushed.ref, client=client) == name
    assert (store.root / "layers" / str(layers[0]) / "again").read_text() == "a"
