"""A registry that is not on loopback (what a task's ``FROM`` names) may not send a pull to this
host's loopback or a private network, by a redirect or by its token realm, and the user's
credentials go only to its own token service; Docker Hub's shape (a token service on another host,
blobs on a CDN, both public https) still works.

Each test runs :mod:`tests.images.netns_pull` inside a network namespace made here, whose only
interfaces are its loopback and a veth pair, both ends inside it, one holding the registry's
private address and a global one: no packet can leave it. The pull also has a mount namespace of
its own (its /etc/hosts names ``cdn.test`` and ``evil.test``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns_pull import (
    ADDRESSES,
    ELSEWHERE_PORT,
    OTHER_PRIVATE,
    PUBLIC,
    REGISTRY,
    REGISTRY_ADDR,
    TOKEN,
    TRIPWIRE_PORT,
)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nsenter", "unshare", "openssl") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed (iproute2, util-linux, openssl)" if missing else None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")

REPO_ROOT = Path(__file__).resolve().parents[2]
OWN_HOST_REALM = f"https://{REGISTRY_ADDR}:{ELSEWHERE_PORT}/token"
"""The token service on the registry's own address, another port."""


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    name = f"sandrl-img-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        inside = ["ip", "-n", name]
        # Both ends of the veth in the namespace (some kernels have no dummy devices): its addresses
        # are local, and a packet for any other leaves by one end to be dropped at the other.
        for args in (
            ["link", "set", "lo", "up"],
            ["link", "add", "world0", "type", "veth", "peer", "name", "world1"],
            *(["addr", "add", f"{address}/32", "dev", "world0"] for address in ADDRESSES),
            ["link", "set", "world0", "up"],
            ["link", "set", "world1", "up"],
        ):
            subprocess.run([*inside, *args], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _pull(namespace: str, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    command = ["nsenter", f"--net=/run/netns/{namespace}", "--", "unshare", "--mount", "--propagation", "private"]
    command += ["--", sys.executable, "-m", "tests.images.netns_pull", json.dumps(spec), str(tmp_path)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "realm",
    [
        f"http://127.0.0.1:{TRIPWIRE_PORT}/token",
        f"https://localhost:{TRIPWIRE_PORT}/token",
        f"https://evil.test:{TRIPWIRE_PORT}/token",  # a name whose address is loopback
        f"https://{OTHER_PRIVATE}:{TRIPWIRE_PORT}/token",  # https, but a private address
    ],
)
def test_a_realm_pointing_at_this_host_or_a_private_address_is_refused(
    namespace: str, tmp_path: Path, realm: str
) -> None:
    result = _pull(namespace, tmp_path, realm=realm, credentials=True)
    assert result["tripwires"] == {"127.0.0.1": 0, OTHER_PRIVATE: 0}
    assert result["error"] is not None and result["error"]["type"] == "RegistryError", result["error"]
    assert f"names {realm!r} as its token service: refused" in result["error"]["message"]
    assert result["elsewhere"] == []


@pytest.mark.parametrize(
    "target", [f"http://127.0.0.1:{TRIPWIRE_PORT}/x", f"https://evil.test:{TRIPWIRE_PORT}/x?d={{digest}}"]
)
def test_a_blob_redirect_to_this_host_is_refused(namespace: str, tmp_path: Path, target: str) -> None:
    result = _pull(namespace, tmp_path, redirect=target)
    assert result["tripwires"] == {"127.0.0.1": 0, OTHER_PRIVATE: 0}
    assert result["error"] is not None and result["error"]["type"] == "RegistryError", result["error"]
    assert f"https://{REGISTRY} redirected a blob to " in result["error"]["message"]
    assert "refused" in result["error"]["message"]


def test_credentials_are_not_sent_to_a_token_service_on_another_host(namespace: str, tmp_path: Path) -> None:
    """The realm is public https on another host: asked anonymously (a public image still pulls)."""
    result = _pull(namespace, tmp_path, realm=f"https://cdn.test:{ELSEWHERE_PORT}/token", credentials=True)
    assert result["error"] is None, result["error"]
    tokens = [r for r in result["elsewhere"] if r["path"] == "/token"]
    assert tokens and all(r["authorization"] == "" for r in tokens)
    # Pinned: the connection went to the address that was checked, TLS was checked against the name.
    assert {(r["reached"], r["host"]) for r in tokens} == {(PUBLIC, f"cdn.test:{ELSEWHERE_PORT}")}
    assert {r["authorization"] for r in result["registry"]} >= {f"Bearer {TOKEN}"}


def test_a_private_image_behind_a_foreign_token_service_says_what_to_do(namespace: str, tmp_path: Path) -> None:
    realm = f"https://cdn.test:{ELSEWHERE_PORT}/token"
    result = _pull(namespace, tmp_path, realm=realm, credentials=True, private=True)
    assert result["error"] is not None and result["error"]["type"] == "RegistryError", result["error"]
    message = result["error"]["message"]
    assert f"sandrl sent no credentials to the token service {realm}" in message
    assert f'[delegates] "https://{REGISTRY}" = ["https://cdn.test:{ELSEWHERE_PORT}"]' in message
    assert all(r["authorization"] == "" for r in result["elsewhere"])


def test_the_registrys_own_token_service_gets_its_credentials(namespace: str, tmp_path: Path) -> None:
    """The control: the same pull with the token service on the registry's own host, another port."""
    result = _pull(namespace, tmp_path, realm=OWN_HOST_REALM, credentials=True)
    assert result["error"] is None, result["error"]
    tokens = [r for r in result["elsewhere"] if r["path"] == "/token"]
    assert tokens and all(r["authorization"].startswith("Basic ") for r in tokens)


def test_docker_hubs_shape_works_and_the_cdn_gets_no_credentials(namespace: str, tmp_path: Path) -> None:
    """Token service on the registry's host, blobs redirected to public https by name (a CDN)."""
    result = _pull(
        namespace,
        tmp_path,
        realm=OWN_HOST_REALM,
        redirect=f"https://cdn.test:{ELSEWHERE_PORT}/blobs/{{digest}}",
        credentials=True,
    )
    assert result["error"] is None, result["error"]
    blobs = [r for r in result["elsewhere"] if r["path"].startswith("/blobs/")]
    assert len(blobs) == 2  # the config and the layer
    cdn = {(PUBLIC, f"cdn.test:{ELSEWHERE_PORT}", "")}
    assert {(r["reached"], r["host"], r["authorization"]) for r in blobs} == cdn
