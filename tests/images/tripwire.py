"""A TCP port that counts who connects to it and answers nothing: where a refused redirect or
token realm points, so a test can say that not even a connection was made, let alone a request."""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType


class Tripwire:
    """Listens on ``host`` (a free port unless ``port`` is given); :attr:`connections` counts accepts."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(16)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name=f"tripwire {host}:{self.port}")

    @property
    def connections(self) -> int:
        with self._lock:
            return self._count

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.05)
            if ready:
                conn, _ = self._sock.accept()
                with self._lock:
                    self._count += 1
                conn.close()

    def __enter__(self) -> Tripwire:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
