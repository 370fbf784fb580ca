"""A bubblewrap sandbox's port forwards: a listener made in the sandbox's network namespace, from the host.

Every sandbox has a network namespace of its own (the helper makes it and enters it, so the
namespace of the sandbox's host process, ``/proc/<host_pid>/ns/net``, is the sandbox's, in a full
launch as in one made ahead, with ``network=True`` or not). A socket stays in the namespace it was
made in, whatever thread later uses it. So this process, as root, makes the listener from a
thread of its own that enters the sandbox's namespace (``setns``), binds ``127.0.0.1:<port>``
there, listens, and ends; the socket is then served on the provider's event loop by a
:class:`~sandrl.sandbox.forwarding.PortForward`, which relays each connection to the host target
from the host's namespace. Nothing runs in the sandbox for it, no process of the sandbox holds a
host socket, and the provider's own threads never leave the host's namespace (the thread that
entered the sandbox's exits: it is never one of a pool's).

The listener is closed with the sandbox (a close callback), else it would keep the sandbox's
network namespace alive after it ended. A port the sandbox already uses is refused
(:class:`~sandrl.errors.SandboxError`, ``EADDRINUSE``): open the forward before starting what
listens in the sandbox.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

from sandrl.errors import SandboxClosedError, SandboxError
from sandrl.sandbox.forwarding import LISTEN_BACKLOG, ForwardLimits, PortForward, check_forward, fix_buffers

__all__ = ["forward_into", "listen_in_netns"]

_CLONE_NEWNET = 0x40000000


class _Forwardable(Protocol):
    """What a forward needs of a sandbox (:class:`~sandrl.sandbox.bwrap.sandbox.BwrapSandbox`)."""

    id: str

    @property
    def host_pid(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def add_close_callback(self, callback: Callable[[Any], None]) -> None: ...


async def forward_into(
    sandbox: _Forwardable, port: int, target: tuple[str, int], limits: ForwardLimits | None = None
) -> PortForward:
    """A :class:`~sandrl.sandbox.forwarding.PortForward` of ``sandbox``'s own ``127.0.0.1:port`` to
    the host's ``target`` (a loopback address), tagged with the sandbox's id, closed with it."""
    target = check_forward(port, target)
    limits = limits or ForwardLimits()
    netns = f"/proc/{sandbox.host_pid}/ns/net"
    try:
        listener = await listen_in_netns(netns, port, backlog=LISTEN_BACKLOG)
    except FileNotFoundError:
        raise SandboxClosedError(f"sandbox {sandbox.id} is closed: no forward can be opened into it") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SandboxError(
                f"port {port} is in use in sandbox {sandbox.id}: forward another port, or open the forward "
                "before what listens there starts"
            ) from None
        raise SandboxError(f"cannot listen on port {port} in sandbox {sandbox.id}: {exc}") from exc
    forward = PortForward(listener, target, sandbox.id, limits)
    await forward.start()
    sandbox.add_close_callback(lambda _sandbox: forward.abort())
    if sandbox.closed:  # it closed while the listener was made: the callback may have run already
        forward.abort()
        raise SandboxClosedError(f"sandbox {sandbox.id} closed while a port was being forwarded into it")
    return forward


async def listen_in_netns(netns: str, port: int, *, backlog: int) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1:port`` in the network namespace at ``netns`` (a
    ``/proc/<pid>/ns/net``), made by a thread that enters it and exits."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[socket.socket] = loop.create_future()

    def settle(result: socket.socket | BaseException) -> None:
        if made.cancelled():
            if isinstance(result, socket.socket):
                result.close()
        elif isinstance(result, BaseException):
            made.set_exception(result)
        else:
            made.set_result(result)

    def run() -> None:
        result: socket.socket | BaseException
        try:
            result = _listen(netns, port, backlog)
        except BaseException as exc:  # handed to the caller, raised there
            result = exc
        try:
            loop.call_soon_threadsafe(settle, result)
        except RuntimeError:  # the loop closed meanwhile: nobody will take the socket
            if isinstance(result, socket.socket):
                result.close()

    threading.Thread(target=run, name="sandrl-netns-listen", daemon=True).start()
    return await made


def _listen(netns: str, port: int, backlog: int) -> socket.socket:
    """Blocking, in a thread that exits after: it leaves the host's network namespace for good."""
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # os.setns is Python 3.12's; a network namespace is per thread, so this one thread moves.
        if _libc().setns(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns({netns}): {os.strerror(code)}")
    finally:
        os.close(fd)
    # IPPROTO_TCP: the connections it accepts say TCP too, so asyncio sets TCP_NODELAY on them (:mod:`..forwarding`).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        fix_buffers(sock)
        # A forward closed before may have left connections in TIME_WAIT on the port; a socket of the
        # sandbox's listening there still refuses the bind (EADDRINUSE), with this option or not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
