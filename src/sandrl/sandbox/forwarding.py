"""A port of the host relayed into a sandbox: the one path from inside a sandbox to a host service.

A CLI agent (Claude Code, Codex) runs *inside* its episode's sandbox and talks HTTP to the runner's
session gateway, which listens on the host's loopback. A sandbox never shares the host's network
namespace, so it cannot reach that port, nor any other of the host's. A backend that offers
:class:`~sandrl.sandbox.base.PortForwarding` opens a listening socket on ``127.0.0.1:<port>`` *in
the sandbox's own network namespace* (the bubblewrap backend: :mod:`sandrl.sandbox.bwrap.port_forward`)
and hands it to a :class:`PortForward`, which accepts there and relays each connection, from this
process, to one host loopback ``target``. Nothing runs inside the sandbox for it and nothing joins
the host's network: the sandbox reaches that one target through that one port, and nothing else.

What the relay holds is bounded, as everything a sandbox sends is hostile:

- at most :attr:`ForwardLimits.max_connections` relayed connections at once; one more is reset as
  soon as it is accepted (its client sees the connection closed, the target never hears of it);
- bytes stream through: one read of at most :data:`CHUNK` bytes at a time per direction, written
  on only once the other side has taken the previous one (a side that stops reading stalls its
  direction; nothing piles up in this process), through sockets whose kernel buffers are fixed at
  :data:`SOCKET_BUFFER`;
- a connection with no byte in either direction for :attr:`ForwardLimits.idle_timeout_s` is closed,
  as is one whose target does not accept within :attr:`ForwardLimits.connect_timeout_s`;
- the forward is closed with its sandbox (listener and every relayed connection).

**Which sandbox a request came from.** Each relayed connection leaves this process from a local
port bound before it connects, registered (:mod:`sandrl.peer_tags`) against the forward's ``tag``
(the sandbox's id) until just before its socket closes. A service on the host that sees a client
address asks :func:`sandrl.peer_tags.tag_of_peer`: the tag of the sandbox whose forward the
connection came through, or None for any other client (a harness in this process, another
program). The session gateway can so accept a sandbox's requests only for that sandbox's own
session, whatever key they carry. The registry is this process's: it answers only for servers
running in the process that made the forwards (the runner's gateway and the local bubblewrap
provider are).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import struct
from dataclasses import dataclass

from sandrl import peer_tags
from sandrl.errors import ConfigError
from sandrl.peer_tags import normalize_host

__all__ = [
    "CHUNK",
    "LISTEN_BACKLOG",
    "SOCKET_BUFFER",
    "ForwardLimits",
    "PortForward",
    "check_forward",
    "fix_buffers",
]

CHUNK = 64 << 10
"""Bytes read from one side of a relayed connection before they are written to the other."""
LISTEN_BACKLOG = 128
"""Connections the kernel queues for the relay to accept: more than it will relay at once, so that
one too many is reset at once rather than left retrying its SYN for a second."""
SOCKET_BUFFER = 256 << 10
"""The kernel's send and receive buffers of the relay's sockets, fixed (not grown by the kernel's
autotuning, up to tens of MiB each here): what a relayed connection holds in the kernel stays
about 1 MiB however its sides read. A window this size still moves GB/s over loopback."""


@dataclass(frozen=True)
class ForwardLimits:
    """What one forward holds at most."""

    max_connections: int = 64
    """Relayed connections at once; one more is reset on accept. A CLI agent keeps a few."""
    idle_timeout_s: float = 900.0
    """A connection with no byte either way this long is closed: longer than a model's slowest
    non-streamed answer, so that only connections nobody uses are ended."""
    connect_timeout_s: float = 10.0
    """Longest wait for the target to accept a relayed connection."""

    def __post_init__(self) -> None:
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int):
            raise ConfigError(f"max_connections must be a whole number, got {self.max_connections!r}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be at least 1, got {self.max_connections}")
        for name in ("idle_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


def check_forward(port: object, target: object) -> tuple[str, int]:
    """A forward's arguments, checked: ``port`` a TCP port, ``target`` ``(host, port)`` with ``host`` a
    loopback address (a sandbox reaches a host service, never the host's network). The target, normalised."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"the port to open in the sandbox must be a TCP port (1-65535), got {port!r}")
    return _check_target(target)


def _check_target(target: object) -> tuple[str, int]:
    if not (isinstance(target, tuple) and len(target) == 2):
        raise ConfigError(f"a forward's target must be (host, port), got {target!r}")
    host, target_port = target
    if isinstance(target_port, bool) or not isinstance(target_port, int) or not 1 <= target_port <= 65535:
        raise ConfigError(f"a forward's target port must be a TCP port (1-65535), got {target_port!r}")
    address = normalize_host(host)
    if address is None or not ipaddress.ip_address(address).is_loopback:
        raise ConfigError(
            f"a forward's target must be a loopback address of the host (e.g. 127.0.0.1), got {host!r}: "
            "a sandbox is given one host service, never the host's network"
        )
    return address, target_port


class PortForward:
    """Relays connections accepted on ``listener`` (a bound, listening socket, in a sandbox's network
    namespace) to ``target`` on the host, as the forward of ``tag``. Made by a backend's
    ``forward_port``; :meth:`start` begins accepting, :meth:`close` (or :meth:`abort`) ends it all."""

    def __init__(self, listener: socket.socket, target: tuple[str, int], tag: str, limits: ForwardLimits) -> None:
        self.target = _check_target(target)
        self.tag = tag
        self.limits = limits
        self.port: int = listener.getsockname()[1]
        """The port listened on in the sandbox."""
        self.refused = 0
        """Connections reset on accept because :attr:`ForwardLimits.max_connections` were open."""
        self.relayed = 0
        """Connections relayed to the target so far."""
        self._listener = listener
        self._family = socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET
        self._relays: dict[asyncio.Task[None], tuple[str, int] | None] = {}
        self._server: asyncio.Server | None = None
        self._closed = False

    async def start(self) -> PortForward:
        """Accept on the listener from now on, until :meth:`close`."""
        try:
            self._server = await asyncio.start_server(
                self._accepted, sock=self._listener, limit=CHUNK, backlog=LISTEN_BACKLOG
            )
        except BaseException:
            self._listener.close()
            raise
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def listening(self) -> bool:
        """Whether the listener in the sandbox is open."""
        return self._listener.fileno() >= 0

    @property
    def connections(self) -> int:
        """Relayed connections open now."""
        return len(self._relays)

    def abort(self) -> None:
        """Stop listening and end every relayed connection, now (the sandbox is gone); idempotent and
        synchronous, for a sandbox's close callbacks."""
        if self._closed:
            return
        self._closed = True
        # The listener holds the sandbox's network namespace alive while it is open.
        if self._server is not None:
            self._server.close()
        self._listener.close()
        for task, peer in self._relays.items():
            # Forgotten before its socket can close: a port freed while still registered could be
            # taken by another client, who would pass for the sandbox.
            peer_tags.forget(peer)
            task.cancel()

    async def close(self) -> None:
        """:meth:`abort`, then wait until every relayed connection is closed."""
        self.abort()
        pending = [task for task in self._relays if not task.done()]
        if pending:
            await asyncio.wait(pending)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed or len(self._relays) >= self.limits.max_connections:
            self.refused += 1
            _reset(writer)
            return
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say TCP, and without it a
        # message relayed in two parts (an answer's head, then its body) waited ~40 ms for a delayed ACK.
        outbound = socket.socket(self._family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        task = asyncio.get_running_loop().create_task(
            self._relay(reader, writer, outbound), name=f"sandrl-forward-{self.tag}-relay"
        )
        self._relays[task] = None
        task.add_done_callback(functools.partial(self._relay_done, writer, outbound))

    def _relay_done(self, inbound: asyncio.StreamWriter, outbound: socket.socket, task: asyncio.Task[None]) -> None:
        # Here, not in the relay's own ``finally``: a relay cancelled before its first step never ran it.
        peer_tags.forget(self._relays.pop(task, None))
        inbound.transport.abort()
        outbound.close()

    async def _relay(
        self, in_reader: asyncio.StreamReader, in_writer: asyncio.StreamWriter, outbound: socket.socket
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        peer: tuple[str, int] | None = None
        out_writer: asyncio.StreamWriter | None = None
        try:
            outbound.setblocking(False)
            fix_buffers(outbound)  # before the connect: the window is agreed then
            outbound.bind(("::1" if self._family == socket.AF_INET6 else "127.0.0.1", 0))
            # Registered before the connect: the target may ask as soon as it accepts.
            host, port = outbound.getsockname()[:2]
            peer = peer_tags.register(host, port, self.tag)
            self._relays[task] = peer
            async with asyncio.timeout(self.limits.connect_timeout_s):
                await loop.sock_connect(outbound, self.target)
            self.relayed += 1
            out_reader, out_writer = await asyncio.open_connection(sock=outbound, limit=CHUNK)
            await self._pump_both((in_reader, out_writer), (out_reader, in_writer))
        except (OSError, TimeoutError):
            pass  # the target refused or went away, or the sandbox's end did: the connection ends
        finally:
            peer_tags.forget(peer)  # before its port is freed (see abort)
            if out_writer is not None:
                out_writer.transport.abort()

    async def _pump_both(
        self,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Both directions until both have ended, or neither moved a byte for the idle timeout."""
        loop = asyncio.get_running_loop()
        last = [loop.time()]
        pumps = {loop.create_task(_pump(*up, last)), loop.create_task(_pump(*down, last))}
        try:
            while pumps:
                idle_left = last[0] + self.limits.idle_timeout_s - loop.time()
                if idle_left <= 0:
                    return
                done, pumps = await asyncio.wait(pumps, timeout=idle_left, return_when=asyncio.FIRST_COMPLETED)
                for pump in done:
                    if pump.exception() is not None:
                        return  # a side reset: the other goes with it
        finally:
            for pump in pumps:
                pump.cancel()
            if pumps:
                await asyncio.wait(pumps)
            for pump in pumps:
                if not pump.cancelled():
                    pump.exception()  # taken: a side that failed as it was cancelled is no news


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, last: list[float]) -> None:
    """One direction, a chunk at a time; the other side's end of input is passed on (a half close)."""
    loop = asyncio.get_running_loop()
    while data := await reader.read(CHUNK):
        last[0] = loop.time()
        writer.write(data)
        await writer.drain()
        last[0] = loop.time()
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


def fix_buffers(sock: socket.socket) -> None:
    """Give ``sock`` the relay's fixed kernel buffers (:data:`SOCKET_BUFFER`); a listener passes them
    on to the connections it accepts."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset: the client learns at once, and no TIME_WAIT is left behind."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
