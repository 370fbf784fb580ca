"""The rules of :mod:`sandrl.images.destinations`, one by one: no network needed (addresses are
literals; ``localhost`` resolves from /etc/hosts). The same rules against real servers:
``test_redirects.py`` (loopback) and ``test_registry_netns.py`` (a registry that is not)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, RegistryError
from sandrl.images.destinations import Destination, admit, is_public_address, may_get_credentials, origin_of
from sandrl.images.reference import Mirrors

PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
NOT_PUBLIC = [
    "127.0.0.1",
    "127.8.8.8",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",  # CGNAT
    "169.254.169.254",  # cloud metadata
    "0.0.0.0",
    "0.1.2.3",
    "224.0.0.1",
    "233.252.0.1",  # multicast that Python calls global
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "192.0.2.1",
    "198.18.0.1",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "ff0e::1",  # global-scope multicast
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::",  # 6to4 of 192.168.1.1
    "2001:db8::1",
]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_addresses_of_this_host_and_its_networks_are_not_public(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


async def test_a_redirect_stays_on_its_registrys_origin() -> None:
    base = "http://127.0.0.1:5000"
    assert (await admit(base, "http://127.0.0.1:5000/v2/x/blobs/y?sig=1", kind="redirect")).own
    assert (await admit(base, "HTTP://127.0.0.1:5000/z", kind="redirect")).own
    for elsewhere in ("http://127.0.0.1:5001/x", "https://127.0.0.1:5000/x", "http://127.0.0.2:5000/x"):
        with pytest.raises(RegistryError, match="refused"):
            await admit(base, elsewhere, kind="redirect")


async def test_a_realm_may_be_on_another_port_of_the_registrys_host() -> None:
    base = "http://127.0.0.1:5000"
    assert (await admit(base, "http://127.0.0.1:5001/token", kind="realm")).own
    assert (await admit(base, "https://127.0.0.1:5443/token", kind="realm")).own
    with pytest.raises(RegistryError, match="as its token service: refused: plain http"):
        await admit("https://registry.example", "http://registry.example:8080/token", kind="realm")
    with pytest.raises(RegistryError, match=r"127\.0\.0\.2 is 127\.0\.0\.2, not a public address"):
        await admit(base, "https://127.0.0.2:5001/token", kind="realm")


@pytest.mark.parametrize("kind", ["redirect", "realm"])
async def test_elsewhere_only_public_https_at_a_checked_address(kind: str) -> None:
    base = "https://registry.example"
    public = await admit(base, "https://8.8.8.8/blob", kind=kind)  # type: ignore[arg-type]
    assert not public.own and public.addresses == ("8.8.8.8",)
    for target in (
        "http://8.8.8.8/blob",  # plain http: anyone on the path may answer
        "https://10.0.0.1/blob",
        "https://169.254.169.254/latest/meta-data/",
        "https://[::1]:8080/x",
        "https://[::ffff:127.0.0.1]/x",
        "https://localhost:1/x",  # a name is resolved, and its addresses checked
        "https://0x7f000001/x",  # 127.0.0.1 spelled as some resolvers read it
        "ftp://8.8.8.8/x",
        "file:///etc/passwd",
        "https:///nohost",
        "http://[::1",
    ):
        with pytest.raises(RegistryError, match="refused"):
            await admit(base, target, kind=kind)  # type: ignore[arg-type]


async def test_delegates_are_trusted_as_their_registry() -> None:
    base = "http://10.0.0.5:5000"
    delegates = ("http://10.0.0.6:9000", "https://minio.internal")
    assert (await admit(base, "http://10.0.0.6:9000/bucket/blob", kind="redirect", delegates=delegates)).own
    assert (await admit(base, "https://minio.internal:443/b", kind="redirect", delegates=delegates)).own
    with pytest.raises(RegistryError, match="refused"):
        await admit(base, "http://10.0.0.6:9001/bucket/blob", kind="redirect", delegates=delegates)


def test_credentials_go_to_the_registrys_own_token_service_only() -> None:
    hub = "https://registry-1.docker.io"
    assert may_get_credentials(hub, "https://auth.docker.io/token", registry="docker.io")
    assert not may_get_credentials(hub, "https://auth.docker.io/token", registry=None)  # a mirror's challenge
    assert not may_get_credentials(hub, "http://auth.docker.io/token", registry="docker.io")
    assert not may_get_credentials(hub, "https://auth.docker.io.evil.example/token", registry="docker.io")
    assert may_get_credentials("https://ghcr.io", "https://ghcr.io/token", registry="ghcr.io")
    assert may_get_credentials("http://127.0.0.1:5000", "http://127.0.0.1:5001/token", registry="127.0.0.1:5000")
    assert not may_get_credentials("https://ghcr.io", "https://token.example/t", registry="ghcr.io")
    assert not may_get_credentials("https://ghcr.io", "https://ghcr.io.example/t", registry="ghcr.io")
    assert may_get_credentials(
        "https://registry.example.com",
        "https://gitlab.example.com/jwt/auth",
        registry="registry.example.com",
        delegates=("https://gitlab.example.com",),
    )


def test_a_pinned_request_goes_to_the_checked_address_and_checks_tls_against_the_name() -> None:
    destination = Destination("https://cdn.example:8443/a/b?sig=1", own=False, addresses=("8.8.8.8", "2606:4700::1"))
    first, second = destination.requests("GET", {"Range": "bytes=5-"}, params={"scope": "s"})
    assert str(first.url) == "https://8.8.8.8:8443/a/b?sig=1&scope=s"
    assert str(second.url) == "https://[2606:4700::1]:8443/a/b?sig=1&scope=s"
    for request in (first, second):
        assert request.headers["Host"] == "cdn.example:8443" and request.headers["Range"] == "bytes=5-"
        assert request.extensions["sni_hostname"] == "cdn.example"
    (idna,) = Destination("https://bücher.example/x", own=False, addresses=("8.8.8.8",)).requests("GET", {})
    assert idna.extensions["sni_hostname"] == "xn--bcher-kva.example" == idna.headers["Host"]
    (own,) = Destination("https://ghcr.io/v2/x", own=True).requests("GET", {})
    assert own.url.host == "ghcr.io" and "sni_hostname" not in own.extensions


def test_origins_are_compared_with_their_default_ports() -> None:
    assert origin_of("https://Registry.Example/v2/") == ("https", "registry.example", 443)
    assert origin_of("http://[::1]:5000/x") == ("http", "::1", 5000)


def test_delegates_come_from_the_registries_config(tmp_path: Path) -> None:
    config = tmp_path / "registries.toml"
    config.write_text(
        '[mirrors]\n"docker.io" = ["http://10.0.0.5:5000/"]\n'
        '[delegates]\n"http://10.0.0.5:5000/" = ["http://10.0.0.6:9000"]\n"https://r.example" = "https://auth.r.example"\n'
    )
    mirrors = Mirrors.from_file(config)
    assert mirrors.delegates_of("http://10.0.0.5:5000") == ("http://10.0.0.6:9000",)
    assert mirrors.delegates_of("https://r.example") == ("https://auth.r.example",)
    assert mirrors.delegates_of("https://other.example") == ()
    config.write_text('[delegates]\n"https://r.example" = [1]\n')
    with pytest.raises(ConfigError, match=r"delegates\.https://r\.example must be"):
        Mirrors.from_file(config)
    config.write_text('[delegates]\n"https://r.example" = ["gopher://x"]\n')
    with pytest.raises(ConfigError, match="must be an http:// or https:// URL"):
        Mirrors.from_file(config)
