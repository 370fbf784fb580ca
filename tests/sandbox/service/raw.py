"""HTTP/1.1 over a bare socket, for what a well-behaved client (httpx) will not do: lie about
lengths, send bodies the server should not read, stop reading, send half a request."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int
    """Body bytes the server took before it answered (or stopped reading)."""
    closed: bool = field(default=False)

    def json(self) -> Any:
        return json.loads(self.body)


def connect(url: str, *, rcvbuf: int | None = None) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
    return sock


def head(method: str, target: str, url: str, headers: Mapping[str, str]) -> bytes:
    host = urlsplit(url).netloc
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in ({"Host": host} | dict(headers)).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(
    url: str,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: Iterable[bytes] = (),
    *,
    chunked: bool = False,
    timeout_s: float = 8.0,
) -> Answer:
    """Send the head, then the body chunk by chunk until the server answers or stops reading.

    The body is ``chunked`` (Transfer-Encoding) or sent as given (the caller sets Content-Length).
    """
    sock = connect(url)
    sock.settimeout(timeout_s)
    sent = 0
    try:
        all_headers = dict(headers) | ({"Transfer-Encoding": "chunked"} if chunked else {})
        sock.sendall(head(method, target, url, all_headers))
        for chunk in body:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered early
            frame = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
            try:
                sock.sendall(frame)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break  # the server stopped reading
            sent += len(chunk)
        else:
            if chunked:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    sock.sendall(b"0\r\n\r\n")
        return _read_answer(sock, sent, timeout_s)
    finally:
        sock.close()


def _read_answer(sock: socket.socket, sent: int, timeout_s: float) -> Answer:
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            more = sock.recv(65536)
        except ConnectionResetError:
            more = b""
        if not more:
            raise ConnectionError(f"the server closed without an answer (after {sent} body bytes): {data[:200]!r}")
        data += more
    top, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    chunked = headers.get("transfer-encoding") == "chunked"
    length = int(headers.get("content-length", "0"))
    while (b"0\r\n\r\n" not in rest) if chunked else (len(rest) < length):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        more = sock.recv(65536)
        if not more:
            break
        rest += more
    return Answer(int(status_line.split()[1]), headers, _unchunked(rest) if chunked else rest[:length], sent)


def _unchunked(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2 :]
    return out


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (whatever it sends first)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False
