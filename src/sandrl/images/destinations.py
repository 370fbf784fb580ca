"""Where a registry's answers may send the client: blob redirects and Bearer token realms.

A registry named by a task's Dockerfile is hostile input, and two of its answers name a URL the
client then requests: a ``3xx`` ``Location`` (Docker Hub sends blobs to a CDN) and the ``realm`` of a
``WWW-Authenticate: Bearer`` challenge (its token service). Followed blindly, they make this host
send requests wherever the registry likes: ``http://127.0.0.1:<port>/<path>``, cloud metadata, a
private network. So a target named by endpoint ``E`` (a mirror's URL or a registry's own) is
requested only when it is

1. **E's own**: a redirect to E's origin (scheme, host and port: a loopback test registry
   redirects to itself over http), or a realm on E's host (a token service beside a registry on
   another port), over https or over E's own scheme;
2. **one of E's delegates**: an origin the registries config names for E (``[delegates]``: a
   mirror whose storage is on a private network); the operator vouches for it;
3. else **public https**: ``https://`` whose host resolves only to global unicast addresses (not
   loopback, link-local, private, CGNAT ``100.64/10``, unique-local, multicast, reserved or
   unspecified; IPv4 inside IPv6 judged as IPv4), and the connection goes to an address that was
   checked (the URL is rewritten to it; TLS is still checked against the name, sent as SNI), so a
   name cannot resolve to a public address for the check and to loopback for the connection.

Credentials follow the same line, narrower (:func:`may_get_credentials`): a token request carries
the user's credentials for E only to E's own host, E's delegates, or a token service a registry is
known to keep on another host (``auth.docker.io`` for Docker Hub, which is what Docker's
``config.json`` entry for ``docker.io`` is for). Any other realm is asked anonymously: enough for
public images, and nothing secret leaves. A redirect's target never gets E's ``Authorization``
and a ``401`` from it is never answered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import httpx

from sandrl.errors import RegistryError
from sandrl.images.reference import REGISTRIES_CONFIG

__all__ = [
    "MAX_REDIRECTS",
    "TOKEN_SERVICES",
    "Destination",
    "admit",
    "is_public_address",
    "may_get_credentials",
    "origin_of",
]

MAX_REDIRECTS = 5
"""Docker Hub needs one (registry → CDN); more is a loop or a registry playing games."""

TOKEN_SERVICES: dict[str, tuple[str, ...]] = {
    "docker.io": ("auth.docker.io",),
    "registry.gitlab.com": ("gitlab.com",),
}
"""Registry → hosts of its own token service where it is not the registry's host: the credentials
``docker login`` stored for the registry are meant for them."""

_RESOLVE_TIMEOUT_S = 15.0
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]
Kind = Literal["redirect", "realm"]


@dataclass(frozen=True)
class Destination:
    """A URL a registry named, admitted: request it with :meth:`request`."""

    url: str
    """As the registry named it (further ``Location`` headers are relative to it)."""
    own: bool
    """E's own or a delegate: requested as E is, over E's connections."""
    addresses: tuple[str, ...] = field(default=())
    """For a public target: the checked addresses, one of which is connected to (empty otherwise)."""

    def requests(
        self,
        method: str,
        headers: dict[str, str],
        *,
        params: dict[str, str] | None = None,
        data: dict[str, str] | None = None,
    ) -> list[httpx.Request]:
        """The request, once per address to try (one for an own target)."""
        url = httpx.URL(self.url).copy_merge_params(params or {})
        if not self.addresses:
            return [httpx.Request(method, url, headers=headers, data=data)]
        host = url.raw_host.decode("ascii")  # a name as DNS and TLS spell it (IDNA)
        pinned = {**headers, "Host": url.netloc.decode("ascii")}
        extensions = {} if _is_address(host) else {"sni_hostname": host}
        return [
            httpx.Request(method, url.copy_with(host=address), headers=pinned, data=data, extensions=extensions)
            for address in self.addresses
        ]


def origin_of(url: str) -> Origin:
    """``(scheme, host, port)`` of ``url``, host in lower case and the port explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme, 0)


def is_public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A global unicast address: reaching it is reaching the internet, not this host or its networks."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public_address(embedded)
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to (mapped, NAT64, 6to4): a translator would reach it."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def admit(
    endpoint: str, target: str, *, kind: Kind, delegates: tuple[str, ...] = (), what: str = ""
) -> Destination:
    """``target`` (absolute) as named by ``endpoint``'s answer, if the rules above let it be
    requested; else a :class:`~sandrl.errors.RegistryError` that says why and what to do."""
    if kind == "redirect":
        refused = f"{endpoint} redirected {what or 'a request'} to {target[:300]!r}: refused"
    else:
        refused = f"{endpoint} names {target[:300]!r} as its token service: refused"
    try:
        parts = urlsplit(target)
        hostname = parts.hostname
        httpx.URL(target)
    except (ValueError, httpx.InvalidURL) as exc:
        raise RegistryError(f"{refused} ({exc})") from exc
    if parts.scheme.lower() not in _DEFAULT_PORTS or not hostname:
        raise RegistryError(f"{refused} (not an http or https URL)")
    base, there = origin_of(endpoint), origin_of(target)
    if there == base or (kind == "realm" and there[1] == base[1] and there[0] in ("https", base[0])):
        return Destination(target, own=True)
    if there in {origin_of(d) for d in delegates}:
        return Destination(target, own=True)
    hint = (
        f"a registry's {kind} is followed only to {'its own origin' if kind == 'redirect' else 'its own host'} "
        "or to https on a public address; if this is your registry and it hands out "
        f"{'blobs' if kind == 'redirect' else 'tokens'} from {there[0]}://{parts.netloc}, name that origin "
        f'for it in {REGISTRIES_CONFIG}: [delegates] "{endpoint}" = ["{there[0]}://{parts.netloc}"]'
    )
    if there[0] != "https":
        raise RegistryError(f"{refused}: plain http to another origin; {hint}")
    addresses = await _resolve(there[1], there[2], refused)
    private = [a for a in addresses if not is_public_address(ipaddress.ip_address(a))]
    if private:
        raise RegistryError(f"{refused}: {there[1]} is {', '.join(private[:4])}, not a public address; {hint}")
    return Destination(target, own=False, addresses=tuple(addresses))


async def _resolve(host: str, port: int, refused: str) -> list[str]:
    """Every address ``host`` has (an address is its own), in the resolver's order of preference."""
    if _is_address(host):
        return [host]
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), _RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        raise RegistryError(f"{refused}: cannot resolve {host} ({exc or 'timed out'}); check the network") from exc
    found: list[str] = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]
        if address not in found:
            found.append(address)
    if not found:
        raise RegistryError(f"{refused}: {host} has no address")
    return found


def may_get_credentials(endpoint: str, realm: str, *, registry: str | None, delegates: tuple[str, ...] = ()) -> bool:
    """Whether a token request to ``realm`` may carry the credentials stored for ``endpoint``.

    ``registry`` is the registry's name when ``endpoint`` is the registry itself (not a mirror):
    its known token services (:data:`TOKEN_SERVICES`) then count as its own."""
    base, there = origin_of(endpoint), origin_of(realm)
    if there[1] == base[1] and there[0] in ("https", base[0]):
        return True
    if there in {origin_of(d) for d in delegates}:
        return True
    return there[0] == "https" and registry is not None and there[1] in TOKEN_SERVICES.get(registry, ())
