"""Where a registry on loopback may send a pull: its own origin, its delegates, public https; never
another port or address of this host, never with credentials, never in a loop.

The registry is the real one behind the fault proxy, which answers with the redirect or the
challenge a test asks for. Where a redirect must be refused, a tripwire listens at its target and
must see no connection at all. (A registry that is not on loopback: ``test_registry_netns.py``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.errors import RegistryError
from sandrl.images.credentials import DockerConfig
from sandrl.images.oci_layout import LayerSpec, regular_file
from sandrl.images.reference import Mirrors
from sandrl.images.registry import RegistryClient
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.pulled import pull_into_store

from ..support import REASON as SANDBOX_REASON
from .conftest import PushedImage, PushImage, needs_registry
from .fault_proxy import FaultProxy
from .tripwire import Tripwire

pytestmark = [needs_registry, pytest.mark.skipif(SANDBOX_REASON is not None, reason=SANDBOX_REASON or "")]


def _client(mirrors: Mirrors | None = None) -> RegistryClient:
    """No mirrors, credentials or TLS roots of the machine it runs on; quick retries."""
    return RegistryClient(
        mirrors=mirrors or Mirrors(), docker_config=DockerConfig(Path("/nonexistent")), retries=1, backoff_s=0.01
    )


@pytest.fixture
def tripwire() -> Iterator[Tripwire]:
    with Tripwire("127.0.0.1") as wire:
        yield wire


def _layer_digest(pushed: PushedImage) -> str:
    digest: str = json.loads(pushed.layout.read_blob(pushed.manifests[0].digest))["layers"][0]["digest"]
    return digest


def _config_digest(pushed: PushedImage) -> str:
    digest: str = json.loads(pushed.layout.read_blob(pushed.manifests[0].digest))["config"]["digest"]
    return digest


async def test_a_blob_redirect_to_another_port_of_this_host_is_refused(
    push_image: PushImage, fault_proxy: FaultProxy, tripwire: Tripwire, tmp_path: Path
) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "x")])])
    fault_proxy.redirect_next(f"/blobs/{_layer_digest(pushed)}", f"http://127.0.0.1:{tripwire.port}/x", times=9)
    async with _client() as client:
        with pytest.raises(RegistryError, match=r"redirected a blob to 'http://127.0.0.1:\d+/x': refused") as caught:
            await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
    assert "[delegates]" in str(caught.value)  # what to do if that port is the registry's own storage
    assert tripwire.connections == 0
    assert fault_proxy.count("GET", "/blobs/sha256") == 2  # the config, and the layer once: no retries


async def test_a_redirect_to_a_name_of_this_host_is_refused_before_connecting(
    push_image: PushImage, fault_proxy: FaultProxy, tripwire: Tripwire, tmp_path: Path
) -> None:
    """https is not enough: ``localhost`` is resolved, and its addresses are loopback."""
    pushed = push_image([LayerSpec([regular_file("f", "y")])])
    fault_proxy.redirect_next(f"/blobs/{_config_digest(pushed)}", f"https://localhost:{tripwire.port}/blob")
    async with _client() as client:
        with pytest.raises(RegistryError, match=r"localhost is 127\.0\.0\.1.*not a public address"):
            await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
    assert tripwire.connections == 0


async def test_a_registry_redirecting_to_itself_is_followed(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "z")])])
    digest = _layer_digest(pushed)
    fault_proxy.redirect_next(f"/blobs/{digest}$", "{url}{path}", times=2)  # twice, then it forwards
    store = ImageStore(tmp_path / "s")
    async with _client() as client:
        name = await pull_into_store(store, pushed.ref_via(fault_proxy.host), client=client)
    assert store.exists(name)
    assert [r.status for r in fault_proxy.requests if r.path.endswith(digest)] == [307, 307, 200]


async def test_redirects_are_bounded(push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path) -> None:
    pushed = push_image([LayerSpec([regular_file("f", "loop")])])
    fault_proxy.redirect_next(f"/blobs/{_layer_digest(pushed)}$", "{url}{path}", times=50)
    async with _client() as client:
        with pytest.raises(RegistryError, match="more than 5 redirects"):
            await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
    assert fault_proxy.pending_faults == 50 - 6


async def test_a_delegate_named_in_the_config_gets_the_redirect(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A registry whose blobs live on another local origin (MinIO beside a registry) works once the
    operator names that origin for it; the delegate gets no Authorization."""
    pushed = push_image([LayerSpec([regular_file("f", "delegated")])])
    digest = _layer_digest(pushed)
    with FaultProxy(pushed.registry.url) as storage:
        fault_proxy.redirect_next(f"/blobs/{digest}$", storage.url + "{path}")
        mirrors = Mirrors(delegates={fault_proxy.url: (storage.url,)})
        store = ImageStore(tmp_path / "s")
        async with _client(mirrors) as client:
            name = await pull_into_store(store, pushed.ref_via(fault_proxy.host), client=client)
        assert store.exists(name)
        served = [r for r in storage.requests if r.path.endswith(digest)]
        assert [r.status for r in served] == [200] and "authorization" not in served[0].headers


async def test_a_realm_on_another_address_of_this_host_is_refused(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A loopback registry's token service may be on another port of its own address, not elsewhere."""
    pushed = push_image([LayerSpec([regular_file("f", "realm")])])
    with Tripwire("127.0.0.2") as wire:
        challenge = f'Bearer realm="http://127.0.0.2:{wire.port}/token",service="x"'
        fault_proxy.fail_next("/manifests/", status=401, headers={"WWW-Authenticate": challenge})
        async with _client() as client:
            refused = r"names 'http://127\.0\.0\.2:\d+/token' as its token service: refused"
            with pytest.raises(RegistryError, match=refused):
                await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
        assert wire.connections == 0


async def test_a_config_blob_the_registry_lost_is_a_registry_error(
    push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """Every failure of a pull is a RegistryError that says what to do, the config blob's too."""
    pushed = push_image([LayerSpec([regular_file("f", "lost")])])
    fault_proxy.fail_next(f"/blobs/{_config_digest(pushed)}", status=404, times=20)
    async with _client() as client:
        with pytest.raises(RegistryError, match=r"cannot get the blob sha256:\w+ .*404 BLOB_UNKNOWN.*pull again"):
            await pull_into_store(ImageStore(tmp_path / "s"), pushed.ref_via(fault_proxy.host), client=client)
