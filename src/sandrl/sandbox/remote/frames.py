"""The call channel's wire: how calls and answers are framed on one upgraded connection.

Shared by the client (:mod:`.call_channel`) and the server (:mod:`sandrl.sandbox.service.channel`).

A client opens the channel with ``GET /v1/channel`` carrying ``Connection: Upgrade`` and
``Upgrade: sandrl-channel/1`` (and its usual ``Authorization``); the server answers
``101 Switching Protocols`` and from then on both sides send frames, in any order:

- a frame is a 4-byte little-endian length, then that many bytes: one ASCII head line ending
  in ``\\n``, then the body;
- a call's head is ``<id> <METHOD> <target>`` (``target`` as in an HTTP request line, e.g.
  ``/v1/sandboxes/abc/exec``), its body the HTTP route's JSON body;
- an answer's head is ``<id> <status>``, its body the HTTP route's answer body (JSON, errors
  as ``{"code", "error_code", "message"}``).

Ids are the client's (decimal, unique among its calls in flight); answers come back as calls
finish, not in the order they were sent, so a long exec holds up no other call.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from http import HTTPStatus

from sandrl.sandbox.remote.wire import API_PREFIX

CHANNEL_PATH = API_PREFIX + "/channel"
UPGRADE = b"sandrl-channel/1"
MAX_HEAD = 8192
"""Longest head line (a call's id, method and target)."""
_LENGTH = struct.Struct("<I")
MAX_FRAME = 0xFFFFFFFF
"""The length field's largest value."""


class ChannelProtocolError(Exception):
    """The other side sent something that is not a frame: the channel cannot go on."""


@dataclass(frozen=True, slots=True)
class Frame:
    head: bytes
    body: bytes | None
    """None when the body was over the reader's ``max_body``: its bytes were dropped as they came."""
    size: int
    """The body's length, as the frame declared it."""


def status_phrase(status: int) -> str:
    """The reason phrase of an HTTP status ("" for a status HTTP does not name)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def frame(head: bytes, body: bytes = b"") -> bytes:
    size = len(head) + 1 + len(body)
    if size > MAX_FRAME:
        raise ValueError(f"a frame holds at most {MAX_FRAME} bytes, not {size}")
    return _LENGTH.pack(size) + head + b"\n" + body


def call_frame(call_id: int, method: str, target: str, body: bytes) -> bytes:
    return frame(f"{call_id} {method} {target}".encode("ascii"), body)


def answer_frame(call_id: int, status: int, body: bytes) -> bytes:
    return frame(b"%d %d" % (call_id, status), body)


class TurnWriter:
    """Frames written during one turn of the event loop go out in one write, at its end: with many
    calls in flight one send (and one wake-up of the other side) carries several."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self.queued = 0
        """Bytes written this turn, not yet handed to the transport."""

    def write(self, data: bytes) -> None:
        if not self._out:
            self.loop.call_soon(self.flush)
        self._out.append(data)
        self.queued += len(data)

    def flush(self) -> None:
        out, self._out = self._out, []
        self.queued = 0
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))


class FrameReader:
    """Frames out of a byte stream, fed as it arrives; a body over ``max_body`` is never held."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._buf = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        out: list[Frame] = []
        pos, end_of_data = 0, len(buf)
        while pos < end_of_data:
            if self._skip:
                taken = min(self._skip, end_of_data - pos)
                self._skip -= taken
                pos += taken
                continue
            if end_of_data - pos < _LENGTH.size:
                break
            (size,) = _LENGTH.unpack_from(buf, pos)
            start = pos + _LENGTH.size
            head_room = min(size, MAX_HEAD + 1)
            newline = buf.find(b"\n", start, start + head_room)
            if newline < 0:
                if end_of_data - start >= head_room:
                    raise ChannelProtocolError(
                        f"a frame of {size} bytes has no head line within its first {head_room} bytes"
                    )
                break
            head = bytes(buf[start:newline])
            body_size = size - (newline - start) - 1
            if body_size > self.max_body:
                out.append(Frame(head, None, body_size))
                self._skip = body_size
                pos = newline + 1
                continue
            end = start + size
            if end > end_of_data:
                break
            out.append(Frame(head, bytes(buf[newline + 1 : end]), body_size))
            pos = end
        del buf[:pos]
        return out
