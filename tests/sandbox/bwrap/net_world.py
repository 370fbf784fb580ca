"""The world behind a test host (:func:`tests.netns.two_hosts`): run inside the world namespace.

TCP on port 80 of every address answers ``world``; UDP port 7 echoes; a DNS server on the
resolver address answers ``*.test`` with the public address. Every arrival is logged to the file
named by ``argv[1]``, one line each (``tcp ADDRESS``, ``udp ADDRESS``, ``dns NAME``): what reached
the world, whatever the sandbox side believed.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading

from tests.netns import WORLD_ADDRESSES

LOG = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - the process's whole life
LOCK = threading.Lock()


def log(line: str) -> None:
    with LOCK:
        LOG.write(line + "\n")


def tcp() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 80))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        log(f"tcp {conn.getsockname()[0]}")
        conn.sendall(b"world\n")
        conn.close()


def udp(address: str) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((address, 7))
    while True:
        data, peer = s.recvfrom(2048)
        log(f"udp {address}")
        s.sendto(data, peer)


def dns() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((WORLD_ADDRESSES["resolver"], 53))
    while True:
        query, peer = s.recvfrom(2048)
        labels, i = [], 12
        while i < len(query) and query[i]:
            labels.append(query[i + 1 : i + 1 + query[i]].decode(errors="replace"))
            i += 1 + query[i]
        qtype = struct.unpack(">H", query[i + 1 : i + 3])[0] if i + 3 <= len(query) else 0
        name = ".".join(labels)
        log(f"dns {name}")
        question = query[12 : i + 5]
        found = name.endswith(".test")
        answers = b""
        if found and qtype == 1:
            answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(WORLD_ADDRESSES["public"])
        flags = 0x8180 if found else 0x8183
        header = query[:2] + struct.pack(">HHHHH", flags, 1, 1 if answers else 0, 0, 0)
        s.sendto(header + question + answers, peer)


def main() -> None:
    threads = [threading.Thread(target=tcp, daemon=True), threading.Thread(target=dns, daemon=True)]
    threads += [threading.Thread(target=udp, args=(a,), daemon=True) for a in WORLD_ADDRESSES.values()]
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
