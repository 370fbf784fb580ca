"""Which sandbox a loopback connection came from: the tags of the connections a port forward relays.

A sandbox reaches a host service (the session gateway) only through a port forwarded into it
(:mod:`sandrl.sandbox.forwarding`). Each connection the forward relays leaves this process from a
loopback port bound for it, and that ``(host, port)`` is registered here against the forward's
tag (the sandbox's id) before the connection is made, and forgotten before its socket closes. So
a server of this process that sees a client address can tell a sandbox's request from any other
client's: :func:`tag_of_peer`.

A foundation module, under both the sandboxes (which register) and the inference servers (which
ask), so that neither imports the other. The registry is this process's: it answers only for
connections relayed by forwards made in this process (the runner's gateway and the local
bubblewrap provider share one). While a relayed connection is open, its port is bound by this
process, so no other client can come from the same ``(host, port)``.
"""

from __future__ import annotations

import ipaddress

__all__ = ["forget", "normalize_host", "register", "tag_of_peer"]

_TAGS: dict[tuple[str, int], str] = {}
"""Local ``(host, port)`` of each relayed connection's host side -> its forward's tag."""


def normalize_host(host: object) -> str | None:
    """``host`` as one spelling of its address (an IPv4-mapped IPv6 address as IPv4), None if it is none."""
    if not isinstance(host, str):
        return None
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def register(host: str, port: int, tag: str) -> tuple[str, int]:
    """Say that connections from ``(host, port)`` are ``tag``'s until :func:`forget`; the key to forget."""
    key = (normalize_host(host) or host, port)
    _TAGS[key] = tag
    return key


def forget(key: tuple[str, int] | None) -> None:
    """Forget a :func:`register`; None and keys forgotten already are ignored."""
    if key is not None:
        _TAGS.pop(key, None)


def tag_of_peer(host: str, port: int) -> str | None:
    """The tag (the sandbox's id) of the forward a connection from ``(host, port)`` was relayed
    through, while it is open; None for a client that did not come through a forward of this process.

    ``host, port`` is the client address a server saw (``request.client`` in Starlette,
    ``scope["client"]`` in ASGI). Safe to call from any thread of the process."""
    address = normalize_host(host)
    if address is None or isinstance(port, bool) or not isinstance(port, int):
        return None
    return _TAGS.get((address, port))
