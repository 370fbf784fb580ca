"""The wire protocol between the provider and the agent inside a sandbox.

One stream socket per sandbox. Every frame is ``u32 payload length, u8 type, u32 request
id, payload`` (little-endian). The C side is ``native/sandrl-helper.c``; the two must
match. Requests are multiplexed by id, so many commands and file transfers can be in
flight in one sandbox at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from sandrl.errors import SandboxRequestTooLargeError

PROTOCOL_VERSION = 3
HEADER = struct.Struct("<IBI")
MAX_FRAME = 16 << 20
"""Largest payload of one frame, either way (the agent's ``MAX_FRAME``). The agent treats a larger
one as a broken provider and exits, which ends the sandbox: so :func:`encode` refuses to make one."""
CHUNK = 256 << 10
"""Bytes per data frame the provider sends (file writes, stdin)."""


class Op(IntEnum):
    EXEC = 1
    STDIN = 2
    SIGNAL = 3
    WOPEN = 4
    WDATA = 5
    WCLOSE = 6
    READ = 7
    TTL = 8
    PING = 9
    PAUSE = 10
    HELLO = 101
    STARTED = 102
    STDOUT = 103
    STDERR = 104
    EXIT = 105
    OK = 106
    FAIL = 107
    DATA = 108
    END = 109
    PONG = 110


class ProtocolError(Exception):
    """The agent sent something that is not a valid frame."""


@dataclass(frozen=True)
class Frame:
    op: Op
    rid: int
    payload: bytes


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_s: float


def encode(op: Op, rid: int, payload: bytes = b"", *, what: str = "", hint: str = "") -> bytes:
    """One frame; for the error of an oversized one, ``what`` names the request and ``hint`` how to shrink it."""
    if len(payload) > MAX_FRAME:
        raise SandboxRequestTooLargeError(
            f"{what or f'a {op.name} request'} makes a request of {len(payload)} bytes, over the sandbox "
            f"agent's limit of {MAX_FRAME} bytes ({MAX_FRAME >> 20} MiB) per request; nothing was sent and the "
            f"sandbox is unharmed{hint}"
        )
    return HEADER.pack(len(payload), int(op), rid) + payload


def _strings(values: list[bytes]) -> bytes:
    return struct.pack("<I", len(values)) + b"".join(struct.pack("<I", len(v)) + v for v in values)


def encode_exec(
    rid: int,
    *,
    command: str | tuple[str, ...],
    cwd: str,
    env: dict[str, str],
    timeout_s: float | None,
    output_cap: int,
    stdin: bool,
) -> bytes:
    """An EXEC request: ``command`` a shell line (run by ``/bin/sh -c``) or an argv (run directly: flag 2,
    then the number of its arguments), checked by :func:`sandrl.sandbox.command.check_command`."""
    timeout_ms = 0 if timeout_s is None else max(1, min(int(timeout_s * 1000), 0xFFFFFFFF))
    args = [command.encode()] if isinstance(command, str) else [a.encode() for a in command]
    strings = [cwd.encode(), *args] + [f"{k}={v}".encode() for k, v in env.items()]
    flags = (1 if stdin else 0) | (0 if isinstance(command, str) else 2)
    head = struct.pack("<IIB", timeout_ms, min(output_cap, 0xFFFFFFFF), flags)
    if not isinstance(command, str):
        head += struct.pack("<I", len(args))
    payload = head + _strings(strings)
    what = (
        f"the command ({sum(map(len, args))} bytes) with its environment ({sum(map(len, strings[1 + len(args) :]))} "
        f"bytes) and working directory ({len(strings[0])} bytes)"
    )
    hint = "; pass large inputs through stdin or write them to a file with write_file (both are sent in chunks)"
    return encode(Op.EXEC, rid, payload, what=what, hint=hint)


def decode_exit(payload: bytes) -> ExitInfo:
    code, timed_out, truncated, duration_us = struct.unpack("<iBBQ", payload[:14])
    return ExitInfo(code, bool(timed_out), bool(truncated), duration_us / 1e6)


def decode_fail(payload: bytes) -> tuple[int, str]:
    (errno_,) = struct.unpack("<I", payload[:4])
    return errno_, payload[4:].decode(errors="replace")


class AgentConnection:
    """The provider's end of one sandbox's socket: sends requests, routes replies by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._routes: dict[int, Callable[[Frame | None], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self.close_reason: str = ""
        self.hello: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._on_close: list[Callable[[], None]] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self._read_loop(), name="sandrl-agent-reader")

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the connection dies (closed, or the agent's end gone): a callback, not
        a task waiting on :attr:`closed`, so an idle sandbox costs its provider one task (the reader)."""
        if self.closed.is_set():
            asyncio.get_running_loop().call_soon(callback)
        else:
            self._on_close.append(callback)

    def new_id(self) -> int:
        return next(self._ids)

    def route(self, rid: int, handler: Callable[[Frame | None], None]) -> None:
        """Send every frame for ``rid`` to ``handler``; ``None`` means the connection died."""
        self._routes[rid] = handler

    def unroute(self, rid: int) -> None:
        self._routes.pop(rid, None)

    def send_nowait(self, data: bytes) -> None:
        """Queue one small control frame without waiting (from a callback); dropped once the connection
        is gone. A frame is written whole, so it never lands inside another being sent."""
        if not self.closed.is_set():
            with contextlib.suppress(Exception):
                self._writer.write(data)

    async def send(self, data: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionError(self.close_reason or "the sandbox is closed")
        async with self._write_lock:
            self._writer.write(data)
            await self._writer.drain()

    async def _read_loop(self) -> None:
        reason = "the sandbox's supervisor exited"
        try:
            while True:
                header = await self._reader.readexactly(HEADER.size)
                length, op, rid = HEADER.unpack(header)
                if length > MAX_FRAME:
                    raise ProtocolError(f"frame of {length} bytes")
                payload = await self._reader.readexactly(length) if length else b""
                try:
                    frame = Frame(Op(op), rid, payload)
                except ValueError as exc:
                    raise ProtocolError(f"unknown frame type {op}") from exc
                if frame.op is Op.HELLO:
                    if not self.hello.done():
                        self.hello.set_result(struct.unpack("<I", payload[:4])[0])
                    continue
                handler = self._routes.get(rid)
                if handler is not None:
                    handler(frame)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolError as exc:
            reason = f"the sandbox's supervisor broke the protocol ({exc})"
        finally:
            self._die(reason)

    def _die(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        if not self.hello.done():
            self.hello.set_exception(ConnectionError(reason))
            self.hello.exception()  # mark retrieved: the creator may already have given up
        routes, self._routes = self._routes, {}
        for handler in routes.values():
            handler(None)
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    async def close(self) -> None:
        self._die("the sandbox was closed")
        with contextlib.suppress(Exception):
            self._writer.close()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def encode_read(rid: int, path: str, offset: int, length: int) -> bytes:
    return encode(Op.READ, rid, struct.pack("<QQ", offset, length) + path.encode(), what="the path to read")


def encode_wopen(rid: int, path: str, mode: int) -> bytes:
    return encode(Op.WOPEN, rid, struct.pack("<I", mode & 0o7777) + path.encode(), what="the path to write")


def encode_u32(op: Op, rid: int, value: int) -> bytes:
    return encode(op, rid, struct.pack("<I", value & 0xFFFFFFFF))
