"""A pull from a registry that is not on loopback, run by ``test_registry_netns.py`` inside a network
namespace it made (and a mount namespace of this process's own): nothing here can reach a packet
out of that namespace, whatever the code under test does.

``python -m tests.images.netns_pull SPEC_JSON WORKDIR`` starts, in the namespace:

- a registry (a small fake, over TLS) at :data:`REGISTRY` (a private address on the namespace's
  veth interface) serving a one-layer image; with ``realm`` in the spec it asks for a Bearer token
  from there, with ``redirect`` it sends blobs there (``{digest}`` is the blob's digest);
- "elsewhere", a token service and CDN over TLS on port :data:`ELSEWHERE_PORT` of every address:
  its tokens open the image only if asked with credentials when the spec says ``private``;
  ``cdn.test`` (a name, in this mount namespace's /etc/hosts) is :data:`PUBLIC`, a global address
  that exists only on the veth interface; the certificate names ``cdn.test`` but not that address,
  so TLS passes only if it is checked against the name;
- tripwires on port :data:`TRIPWIRE_PORT` of 127.0.0.1 and :data:`OTHER_PRIVATE` (``evil.test`` is
  127.0.0.1);

then pulls the image with a :class:`~sandrl.images.registry.RegistryClient` whose Docker config
holds credentials for the registry when the spec says ``credentials``, and prints one JSON line:
the error (type and message) or null, the requests each server saw, and the tripwires' counts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sandrl.background_server import BackgroundServer
from sandrl.images.credentials import DockerConfig
from sandrl.images.oci_layout import LayerSpec, OCILayout, regular_file
from sandrl.images.reference import Mirrors
from sandrl.images.registry import RegistryClient
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.pulled import pull_into_store

from .tripwire import Tripwire

REGISTRY_ADDR = "10.88.0.1"
REGISTRY_PORT = 8443
REGISTRY = f"{REGISTRY_ADDR}:{REGISTRY_PORT}"
OTHER_PRIVATE = "10.88.0.2"
PUBLIC = "192.88.99.1"
"""Global by Python's table (it is not loopback, private, reserved...): the namespace's stand-in for
the internet. Only this namespace has it."""
ADDRESSES = (REGISTRY_ADDR, OTHER_PRIVATE, PUBLIC)
"""What the namespace's veth interface holds."""
ELSEWHERE_PORT = 9443
TRIPWIRE_PORT = 7000
HOSTS = {"cdn.test": PUBLIC, "evil.test": "127.0.0.1"}
TOKEN = "netns-token"
USER, PASSWORD = "alice", "s3cret"
REPOSITORY = "test/image"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(work: Path) -> tuple[Path, tuple[str, str]]:
    """A CA, and a server certificate it signed for the registry and the names (not ``PUBLIC``)."""
    ca_key, ca, key, csr, cert, ext = (work / n for n in ("ca.key", "ca.pem", "tls.key", "tls.csr", "tls.pem", "ext"))
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=netns CA")
    _openssl("req", *curve, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=netns")
    names = [f"IP:{REGISTRY_ADDR}", f"IP:{OTHER_PRIVATE}", "IP:127.0.0.1", "DNS:localhost"]
    names += [f"DNS:{host}" for host in HOSTS]
    ext.write_text(f"subjectAltName={','.join(names)}\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    return ca, (str(cert), str(key))


def _record(request: Request, seen: list[dict[str, str]]) -> None:
    server = request.scope.get("server") or ("", 0)
    seen.append(
        {
            "path": request.url.path,
            "host": request.headers.get("host", ""),
            "authorization": request.headers.get("authorization", ""),
            "reached": str(server[0]),
        }
    )


def _registry(blobs: dict[str, bytes], manifest: bytes, spec: dict[str, Any], seen: list[dict[str, str]]) -> FastAPI:
    app = FastAPI()
    challenge = f'Bearer realm="{spec.get("realm")}",service="netns",scope="repository:{REPOSITORY}:pull"'

    def refused(request: Request) -> Response | None:
        _record(request, seen)
        if spec.get("realm") and request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"errors": [{"code": "UNAUTHORIZED"}]}, 401, {"WWW-Authenticate": challenge})
        return None

    @app.get("/v2/{name:path}/manifests/{reference}")
    async def get_manifest(request: Request, name: str, reference: str) -> Response:
        media = "application/vnd.oci.image.manifest.v1+json"
        return refused(request) or Response(manifest, media_type=media)

    @app.get("/v2/{name:path}/blobs/{digest}")
    async def get_blob(request: Request, name: str, digest: str) -> Response:
        if (answer := refused(request)) is not None:
            return answer
        if spec.get("redirect"):
            return Response(status_code=307, headers={"Location": spec["redirect"].format(digest=digest)})
        return Response(blobs[digest])

    return app


def _elsewhere(blobs: dict[str, bytes], spec: dict[str, Any], seen: list[dict[str, str]]) -> FastAPI:
    app = FastAPI()

    @app.get("/token")
    async def token(request: Request) -> Response:
        _record(request, seen)
        anonymous = not request.headers.get("authorization")
        # As Docker Hub's: an anonymous request gets a token all the same, one a private image refuses.
        return JSONResponse({"token": "anonymous" if spec.get("private") and anonymous else TOKEN})

    @app.get("/blobs/{digest}")
    async def blob(request: Request, digest: str) -> Response:
        _record(request, seen)
        return Response(blobs[digest])

    return app


def _image(work: Path) -> tuple[dict[str, bytes], bytes]:
    layout = OCILayout(work / "layout")
    manifest = layout.add_image([layout.add_layer(LayerSpec([regular_file("hello", "from the namespace\n")]))])
    body = layout.read_blob(manifest.digest)
    parsed = json.loads(body)
    digests = [parsed["config"]["digest"], *(layer["digest"] for layer in parsed["layers"])]
    return {d: layout.read_blob(d) for d in digests}, body


async def _pull(spec: dict[str, Any], work: Path, ca: Path) -> dict[str, str] | None:
    config = work / "docker"
    config.mkdir()
    if spec.get("credentials"):
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": auth}}}))
    client = RegistryClient(
        mirrors=Mirrors(),
        docker_config=DockerConfig(config / "config.json"),
        retries=1,
        backoff_s=0.01,
        timeout_s=10,
        verify=ssl.create_default_context(cafile=str(ca)),
    )
    try:
        async with client:
            await pull_into_store(ImageStore(work / "store"), f"{REGISTRY}/{REPOSITORY}:1", client=client)
    except Exception as exc:  # the test judges what was raised: report it, whatever it is
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    work = Path(sys.argv[2])
    hosts = work / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{a} {h}\n" for h, a in HOSTS.items()))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)  # this mount namespace's only
    ca, tls = _certificates(work)
    blobs, manifest = _image(work)
    at_registry: list[dict[str, str]] = []
    at_elsewhere: list[dict[str, str]] = []
    registry = BackgroundServer(_registry(blobs, manifest, spec, at_registry), REGISTRY_ADDR, REGISTRY_PORT, tls=tls)
    elsewhere = BackgroundServer(_elsewhere(blobs, spec, at_elsewhere), "0.0.0.0", ELSEWHERE_PORT, tls=tls)
    with registry, elsewhere, Tripwire("127.0.0.1", TRIPWIRE_PORT) as lo, Tripwire(OTHER_PRIVATE, TRIPWIRE_PORT) as pv:
        error = asyncio.run(_pull(spec, work, ca))
        tripped = {"127.0.0.1": lo.connections, OTHER_PRIVATE: pv.connections}
    print(json.dumps({"error": error, "registry": at_registry, "elsewhere": at_elsewhere, "tripwires": tripped}))


if __name__ == "__main__":
    main()
