"""The host side of a network test: run inside a test host namespace (:func:`tests.netns.two_hosts`).

Starts listeners on this namespace's loopback and on all its addresses, a real BwrapProvider
(``argv[1]``: its state directory, ``argv[2]``: its egress allow-list, comma-separated), and
probes from a ``network=True`` and a ``network=False`` sandbox. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from tests.netns import HOST_ADDR, WORLD_ADDR, WORLD_ADDRESSES

INSIDE = r"""
import json, socket, sys
targets = json.loads(sys.argv[1])
out = {}
for name, host, port in targets:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.settimeout(3)
            out[name] = "reached" if s.recv(16) else "closed"
    except OSError as exc:
        out[name] = type(exc).__name__
for name, host in [("udp-public", sys.argv[2]), ("udp-private", sys.argv[3])]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    try:
        s.sendto(b"ping", (host, 7))
        out[name] = "echoed" if s.recv(16) == b"ping" else "other"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    out["dns"] = socket.gethostbyname("svc.test")
except OSError as exc:
    out["dns"] = type(exc).__name__
print(json.dumps(out))
"""


def listen(address: str, accepted: list[str]) -> int:
    server = socket.socket()
    server.bind((address, 0))
    server.listen(64)

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            accepted.append(f"{address}:{conn.getsockname()[0]}")
            conn.sendall(b"host\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(server.getsockname()[1])


async def main() -> None:
    accepted: list[str] = []
    loop_port = listen("127.0.0.1", accepted)
    any_port = listen("0.0.0.0", accepted)
    targets = [
        ("host-loopback", "127.0.0.1", loop_port),  # the host's, if the sandbox shared its namespace
        ("host-loopback-via-gateway", "10.0.2.2", loop_port),
        ("host-any-via-gateway", "10.0.2.2", any_port),
        ("host-address", HOST_ADDR, any_port),
        ("world-public", WORLD_ADDRESSES["public"], 80),
        ("world-veth", WORLD_ADDR, 80),
        ("metadata", WORLD_ADDRESSES["metadata"], 80),
        ("private", WORLD_ADDRESSES["private"], 80),
        ("resolver-not-dns", WORLD_ADDRESSES["resolver"], 80),
        ("by-name", "svc.test", 80),
    ]
    allow = [a for a in sys.argv[2].split(",") if a]
    provider = BwrapProvider(sys.argv[1], egress_allow=allow)
    result: dict[str, object] = {}
    try:
        for network in (True, False):
            async with await provider.create(SandboxSpec(network=network, ttl_s=120)) as sandbox:
                await sandbox.write_file("/tmp/probe.py", INSIDE.encode())
                await sandbox.write_file("/tmp/targets.json", json.dumps(targets).encode())
                public, private = WORLD_ADDRESSES["public"], WORLD_ADDRESSES["private"]
                run = await sandbox.exec(
                    f'python3 /tmp/probe.py "$(cat /tmp/targets.json)" {public} {private}', timeout_s=90
                )
                result["net" if network else "nonet"] = json.loads(run.stdout) if run.ok else {"error": run.stderr}
                resolv = await sandbox.exec("cat /etc/resolv.conf")
                result[("net" if network else "nonet") + "-resolv"] = resolv.stdout.strip()
    finally:
        await provider.close_all()
    result["host-accepted"] = accepted
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
