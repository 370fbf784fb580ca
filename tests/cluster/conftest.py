"""Fixtures of the cluster tests: sandbox hosts as real ``sandrl serve sandboxes`` processes, a local Ray cluster.

Two hosts on loopback with different capacities (``a``: 3, ``b``: 1), each its own process and
state directory, so a test can kill one (SIGKILL: connections reset, sandboxes gone) and start it
again on the same port. The Ray cluster is a head and a second node on this machine
(``ray.cluster_utils.Cluster``: child processes of the test, stopped at the end), shared by the
whole session because Ray takes seconds to start.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.cluster.hosts import HostConfig
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.server import BackgroundServer, create_app

from ..support import REASON

SANDRL = Path(sys.executable).with_name("sandrl")
ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SandboxHost:
    """One ``sandrl serve sandboxes`` process on a loopback port; kill and start it again at will."""

    def __init__(self, name: str, root: Path, token_file: Path, capacity: float) -> None:
        self.name = name
        self.state_dir = root / f"state-{name}"
        self.log = root / f"host-{name}.log"
        self.token_file = token_file
        self.capacity = capacity
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> HostConfig:
        return HostConfig(self.url, name=self.name, capacity=self.capacity, token_file=str(self.token_file))

    def start(self, timeout_s: float = 60.0) -> SandboxHost:
        args = [str(SANDRL), "serve", "sandboxes", "--port", str(self.port), "--state-dir", str(self.state_dir)]
        args += ["--token-file", str(self.token_file)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox host {self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"sandbox host {self.name} did not answer within {timeout_s:g} s")

    def live(self) -> int:
        try:
            return int(httpx.get(self.url + "/healthz", timeout=2).json()["live"])
        except (httpx.HTTPError, KeyError, ValueError):
            return -1

    def kill(self) -> None:
        """Die at once, as a crashed host does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM: drain, close every sandbox, exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster-token") / "token"
    path.write_text(secrets.token_hex(24))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="package")
def hosts(tmp_path_factory: pytest.TempPathFactory, token_file: Path) -> Iterator[dict[str, SandboxHost]]:
    """Host ``a`` (capacity 3) and host ``b`` (capacity 1), running: started once for the cluster tests (each
    start is a process's imports and a drain at its end), each test leaving them as it found them (no
    sandbox open); :func:`both_up` starts again one a test killed."""
    if REASON is not None:
        pytest.skip(REASON)
    root = tmp_path_factory.mktemp("cluster-hosts")
    started = {n: SandboxHost(n, root, token_file, c) for n, c in (("a", 3.0), ("b", 1.0))}
    try:
        for host in started.values():
            host.start()
        yield started
    finally:
        for host in started.values():
            if host.proc is not None and host.proc.poll() is not None:
                host.start()  # a killed host: starting it again reaps what it left, then it drains
            host.stop()


@pytest.fixture
def both_up(hosts: dict[str, SandboxHost]) -> dict[str, SandboxHost]:
    """The hosts, each started again if an earlier test killed it."""
    for host in hosts.values():
        if host.proc is None or host.proc.poll() is not None:
            host.start()
    return hosts


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A head (2 CPUs) and a second node (2 CPUs) on this machine; the test process is the driver."""
    if REASON is not None:
        pytest.skip(REASON)
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    before = os.environ.get("PYTHONPATH")
    # The workers unpickle the tests' agents (tests.cluster.agents): they import from the checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), before) if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    node = {"num_cpus": 2, "object_store_memory": 80 * MB}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, namespace="sandrl", logging_level="WARNING", configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="session")
def inference_token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The inference server's token, which the runs name in [model] token_file (read on every node)."""
    path = tmp_path_factory.mktemp("inference-token") / "token"
    path.write_text(secrets.token_hex(24))
    path.chmod(0o600)
    return path


@pytest.fixture
def served(inference_token_file: Path) -> Iterator[tuple[Engine, str]]:
    """A fresh tiny engine (version 0, the trainer's initial weights) behind SGLang's routes, and its URL;
    started with a token, as a server that takes the trainer's weights must be."""
    engine = Engine.load("tiny", EngineConfig(num_threads=1))
    app = create_app(engine, token=inference_token_file.read_text().strip())
    try:
        with BackgroundServer(app, name="inference server") as server:
            yield engine, server.url
    finally:
        engine.close()


@pytest.fixture
def inference_url(served: tuple[Engine, str]) -> str:
    return served[1]
