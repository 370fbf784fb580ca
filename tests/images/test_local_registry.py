"""The test registries, the layout writer and the fault proxy are right, checked against real tools.

``docker-registry`` serves what ``skopeo`` pushed from layouts that :mod:`sandrl.images.oci_layout`
wrote; ``skopeo inspect`` and ``umoci raw unpack`` (of the image copied back out of the registry) see
the same digests, config and files that the writer meant. The fault proxy forwards, injects and counts.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import zstandard

from sandrl.errors import ConfigError, RegistryError
from sandrl.images import local_registry
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import ImageConfig, Platform
from sandrl.images.oci_layout import (
    CONFIG_MEDIA_TYPE,
    FIXED_MTIME,
    INDEX_MEDIA_TYPE,
    LAYER_MEDIA_TYPES,
    MANIFEST_MEDIA_TYPE,
    LayerSpec,
    OCILayout,
    TarEntry,
    directory,
    hardlink,
    layer_blob,
    opaque_whiteout,
    raw_entry,
    regular_file,
    symlink,
    tree_entries,
    whiteout,
    write_rootfs_image,
    write_synthetic_image,
)

from .conftest import AUTH_PASSWORD, AUTH_USER, PushImage, needs_registry, needs_umoci
from .fault_proxy import FaultProxy

ACCEPT = ", ".join([MANIFEST_MEDIA_TYPE, INDEX_MEDIA_TYPE])
SRC = Path(__file__).resolve().parents[2] / "src"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def base_layer() -> LayerSpec:
    return LayerSpec(
        [
            directory("etc"),
            regular_file("etc/keep", "kept\n"),
            regular_file("etc/gone", "deleted by the layer above\n"),
            directory("var/cache", mode=0o700),
            regular_file("var/cache/old", "hidden by an opaque whiteout\n"),
            directory("bin"),
            regular_file("bin/tool", "#!/bin/sh\necho tool\n", mode=0o755),
        ],
        "gzip",
        created_by="base",
    )


def top_entries() -> list[TarEntry]:
    return [
        whiteout("etc/gone"),
        opaque_whiteout("var/cache"),
        regular_file("var/cache/new", "after the opaque whiteout\n"),
        hardlink("bin/tool2", "bin/tool"),
        symlink("bin/sh", "tool"),
        regular_file("home/user/data.bin", bytes(range(256)) * 64, mode=0o600, uid=1000, gid=1000),
    ]


def top_layer() -> LayerSpec:
    return LayerSpec(top_entries(), "zstd", created_by="top")


CONFIG = ImageConfig(
    env={"PATH": "/bin:/usr/bin", "GREETING": "hello world"},
    workdir="/home/user",
    user="1000:1000",
    entrypoint=["/bin/tool"],
    cmd=["--verbose"],
    exposed_ports=["8080/tcp"],
)


def decompress(blob: bytes, media_type: str) -> bytes:
    if media_type.endswith("+gzip"):
        return gzip.decompress(blob)
    if media_type.endswith("+zstd"):
        return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    return blob


def skopeo(*args: str) -> str:
    result = subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def fetch_manifest(client: httpx.Client, base: str, repository: str, reference: str) -> httpx.Response:
    response = client.get(f"{base}/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
    assert response.status_code == 200, response.text
    return response


# --- the writer alone


def test_layers_are_deterministic_and_diff_ids_cover_the_uncompressed_tar(tmp_path: Path) -> None:
    for compression in ("gzip", "zstd", "none"):
        first = OCILayout(tmp_path / f"a-{compression}").add_layer(top_layer(), compression)
        again = OCILayout(tmp_path / f"b-{compression}").add_layer(top_layer(), compression)
        assert first == again
        assert first.descriptor.media_type == LAYER_MEDIA_TYPES[compression]
        blob = (tmp_path / f"a-{compression}/blobs/sha256" / first.digest.removeprefix("sha256:")).read_bytes()
        assert sha256(blob) == first.digest and len(blob) == first.descriptor.size
        tar = decompress(blob, first.descriptor.media_type)
        assert sha256(tar) == first.diff_id and len(tar) == first.tar_size
        assert tar == layer_blob(top_entries())
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            members = {m.name: m for m in archive.getmembers()}
        assert members["etc/.wh.gone"].isfile() and members["var/cache/.wh..wh..opq"].isfile()
        assert members["bin/tool2"].islnk() and members["bin/tool2"].linkname == "bin/tool"
        assert members["bin/sh"].issym() and members["bin/sh"].linkname == "tool"
        data = members["home/user/data.bin"]
        assert (data.mode, data.uid, data.gid, data.mtime, data.uname) == (0o600, 1000, 1000, FIXED_MTIME, "")


def test_raw_entries_keep_hostile_names() -> None:
    escape = tarfile.TarInfo("../../etc/x")
    absolute = tarfile.TarInfo("/etc/passwd")
    blob = layer_blob([raw_entry(escape, b"owned"), raw_entry(absolute, b"root::0:0")])
    with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
        assert [(m.name, m.size) for m in archive.getmembers()] == [("../../etc/x", 5), ("/etc/passwd", 9)]
    assert escape.size == 0  # the caller's TarInfo is not changed


def test_tree_entries_walk_a_directory_with_links(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/a").write_text("a")
    (root / "usr/bin/a").chmod(0o751)
    os.link(root / "usr/bin/a", root / "usr/bin/b")
    (root / "usr/bin/c").symlink_to("a")
    (root / "usr/lib").symlink_to("bin")  # a symlink to a directory is a symlink, not walked into
    entries = [(e.info.name, e.info.type, e.info.mode, e.info.mtime, e.info.linkname) for e in tree_entries(root)]
    assert entries == [
        ("usr", tarfile.DIRTYPE, 0o755, FIXED_MTIME, ""),
        ("usr/bin", tarfile.DIRTYPE, 0o755, FIXED_MTIME, ""),
        ("usr/lib", tarfile.SYMTYPE, 0o777, FIXED_MTIME, "bin"),
        ("usr/bin/a", tarfile.REGTYPE, 0o751, FIXED_MTIME, ""),
        ("usr/bin/b", tarfile.LNKTYPE, 0o644, FIXED_MTIME, "usr/bin/a"),
        ("usr/bin/c", tarfile.SYMTYPE, 0o777, FIXED_MTIME, "a"),
    ]
    with pytest.raises(ConfigError):
        list(tree_entries(root / "usr/bin/a"))


def test_synthetic_images_are_deterministic_and_compressible(tmp_path: Path) -> None:
    one = write_synthetic_image(tmp_path / "one", tag="t", layers=2, files_per_layer=150, file_size=4096)
    two = write_synthetic_image(tmp_path / "two", tag="t", layers=2, files_per_layer=150, file_size=4096)
    assert one.digest == two.digest
    manifest = json.loads(OCILayout(tmp_path / "one").read_blob(one.digest))
    sizes = [layer["size"] for layer in manifest["layers"]]
    assert len(sizes) == 2 and all(150 * 4096 * 0.4 < s < 150 * 4096 * 0.7 for s in sizes), sizes


# --- the registry, with images pushed by skopeo


@needs_umoci
def test_a_rootfs_image_from_host_directories_unpacks_to_them(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "usr/share").mkdir(parents=True)
    (lower / "usr/share/a.txt").write_text("lower a")
    (lower / "usr/share/b.txt").write_text("lower b")
    (upper / "usr/share").mkdir(parents=True)
    (upper / "usr/share/b.txt").write_text("upper b")
    config = ImageConfig(cmd=["/bin/true"])
    image = write_rootfs_image(tmp_path / "layout", [lower, upper], tag="rootfs", config=config)
    rootfs = tmp_path / "rootfs"
    command = ["umoci", "raw", "unpack", "--rootless", "--image", f"{tmp_path / 'layout'}:rootfs", str(rootfs)]
    subprocess.run(command, check=True, capture_output=True)
    assert (rootfs / "usr/share/a.txt").read_text() == "lower a"
    assert (rootfs / "usr/share/b.txt").read_text() == "upper b"
    manifest = json.loads(OCILayout(tmp_path / "layout").read_blob(image.digest))
    assert len(manifest["layers"]) == 2


@needs_registry
@needs_umoci
def test_a_pushed_image_is_served_as_written(push_image: PushImage, tmp_path: Path) -> None:
    image = push_image([base_layer(), top_layer()], CONFIG)
    written = image.manifests[0]
    assert image.digest == written.digest  # --preserve-digests: skopeo changed nothing, zstd stayed zstd

    with httpx.Client(timeout=10) as client:
        response = fetch_manifest(client, image.registry.url, image.repository, image.tag)
        assert response.headers["content-type"] == MANIFEST_MEDIA_TYPE
        assert response.headers["docker-content-digest"] == sha256(response.content) == image.digest
        assert int(response.headers["content-length"]) == len(response.content) == written.size
        manifest = response.json()
        assert [layer["mediaType"] for layer in manifest["layers"]] == [
            LAYER_MEDIA_TYPES["gzip"],
            LAYER_MEDIA_TYPES["zstd"],
        ]
        assert manifest["config"]["mediaType"] == CONFIG_MEDIA_TYPE

        blobs = f"{image.registry.url}/v2/{image.repository}/blobs"
        config_blob = client.get(f"{blobs}/{manifest['config']['digest']}").content
        assert sha256(config_blob) == manifest["config"]["digest"]
        config = json.loads(config_blob)
        diff_ids = []
        for layer in manifest["layers"]:
            blob = client.get(f"{blobs}/{layer['digest']}").content
            assert sha256(blob) == layer["digest"] and len(blob) == layer["size"]
            diff_ids.append(sha256(decompress(blob, layer["mediaType"])))
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    assert config["config"]["Env"] == ["PATH=/bin:/usr/bin", "GREETING=hello world"]
    assert config["config"]["WorkingDir"] == "/home/user" and config["config"]["User"] == "1000:1000"
    assert config["config"]["Entrypoint"] == ["/bin/tool"] and config["config"]["Cmd"] == ["--verbose"]
    assert config["config"]["ExposedPorts"] == {"8080/tcp": {}}
    assert [h["created_by"] for h in config["history"]] == ["base", "top"]
    assert (config["architecture"], config["os"]) == ("amd64", "linux")

    inspected = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{image.ref}"))
    assert inspected["Digest"] == image.digest
    assert inspected["Layers"] == [layer["digest"] for layer in manifest["layers"]]
    assert inspected["Env"] == config["config"]["Env"] and inspected["Architecture"] == "amd64"

    # umoci 0.4.7 cannot unpack zstd layers: skopeo pulls the image back and recompresses them with gzip.
    pulled = tmp_path / "pulled"
    skopeo(
        "copy", "--quiet", "--src-tls-verify=false", "--dest-compress-format", "gzip",
        f"docker://{image.ref}", f"oci:{pulled}:latest",
    )  # fmt: skip
    rootfs = tmp_path / "rootfs"
    subprocess.run(["umoci", "raw", "unpack", "--rootless", "--image", f"{pulled}:latest", str(rootfs)], check=True)
    assert (rootfs / "etc/keep").read_text() == "kept\n"
    assert not (rootfs / "etc/gone").exists() and not (rootfs / "etc/.wh.gone").exists()
    assert sorted(os.listdir(rootfs / "var/cache")) == ["new"]
    assert (rootfs / "var/cache").stat().st_mode & 0o777 == 0o700
    tool, tool2 = (rootfs / "bin/tool").stat(), (rootfs / "bin/tool2").stat()
    assert tool.st_ino == tool2.st_ino and tool.st_nlink == 2 and tool.st_mode & 0o777 == 0o755
    assert int(tool.st_mtime) == FIXED_MTIME
    assert os.readlink(rootfs / "bin/sh") == "tool"
    assert (rootfs / "home/user/data.bin").read_bytes() == bytes(range(256)) * 64


@needs_registry
def test_a_two_platform_index_is_served_as_written(push_image: PushImage) -> None:
    platforms = [
        ImageConfig(platform=Platform(architecture="amd64")),
        ImageConfig(platform=Platform(architecture="arm64", variant="v8")),
    ]
    image = push_image([base_layer()], platforms=platforms)
    with httpx.Client(timeout=10) as client:
        response = fetch_manifest(client, image.registry.url, image.repository, image.tag)
        assert response.headers["content-type"] == INDEX_MEDIA_TYPE
        assert response.headers["docker-content-digest"] == sha256(response.content) == image.digest
        index = response.json()
        assert [(m["digest"], m["platform"]) for m in index["manifests"]] == [
            (image.manifests[0].digest, {"architecture": "amd64", "os": "linux"}),
            (image.manifests[1].digest, {"architecture": "arm64", "os": "linux", "variant": "v8"}),
        ]
        for entry in index["manifests"]:
            child = fetch_manifest(client, image.registry.url, image.repository, entry["digest"])
            assert sha256(child.content) == entry["digest"] and child.headers["content-type"] == MANIFEST_MEDIA_TYPE

    raw = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{image.ref}")
    assert sha256(raw.encode()) == image.digest
    arm = json.loads(skopeo("inspect", "--override-arch", "arm64", "--tls-verify=false", f"docker://{image.ref}"))
    assert arm["Architecture"] == "arm64" and arm["Digest"] == image.digest  # skopeo names the index's digest


@needs_registry
def test_pushing_one_platform_of_an_index_pushes_this_hosts_manifest(registry: LocalRegistry, tmp_path: Path) -> None:
    layout = OCILayout(tmp_path / "layout")
    layer = layout.add_layer(base_layer())
    amd64 = layout.add_image([layer], ImageConfig(platform=Platform(architecture="amd64")))
    arm64 = layout.add_image([layer], ImageConfig(platform=Platform(architecture="arm64")))
    layout.add_index([amd64, arm64], tag="multi")
    assert os.uname().machine == "x86_64", "this test names the host's platform"
    assert registry.push(layout.root, "test/one-platform:only", tag="multi") == amd64.digest


@needs_registry
def test_skopeo_converts_to_docker_schema_2_on_request(registry: LocalRegistry, tmp_path: Path) -> None:
    layout = OCILayout(tmp_path / "layout")
    layout.add_image([base_layer()], CONFIG, tag="gzip")
    layout.add_image([base_layer(), top_layer()], CONFIG, tag="zstd")
    digest = registry.push(layout.root, "test/docker-types", tag="gzip", manifest_format="v2s2")
    docker_manifest = "application/vnd.docker.distribution.manifest.v2+json"
    with httpx.Client(timeout=10) as client:
        url = f"{registry.url}/v2/test/docker-types/manifests/gzip"
        response = client.get(url, headers={"Accept": docker_manifest})
    assert response.headers["content-type"] == docker_manifest and sha256(response.content) == digest
    assert response.json()["layers"][0]["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar.gzip"
    with pytest.raises(RegistryError, match="zstd compression is not supported for docker images"):
        registry.push(layout.root, "test/docker-types", tag="zstd", manifest_format="v2s2")


@needs_registry
def test_the_registry_serves_ranges_lengths_and_deletes(push_image: PushImage) -> None:
    image = push_image([top_layer()])
    manifest = json.loads(image.layout.read_blob(image.digest))
    layer = manifest["layers"][0]
    blob_url = f"{image.registry.url}/v2/{image.repository}/blobs/{layer['digest']}"
    whole = image.layout.read_blob(layer["digest"])
    with httpx.Client(timeout=10) as client:
        head = client.head(blob_url)
        assert head.status_code == 200 and int(head.headers["content-length"]) == layer["size"]
        assert head.headers["docker-content-digest"] == layer["digest"]
        part = client.get(blob_url, headers={"Range": "bytes=100-"})
        assert part.status_code == 206 and part.headers["content-range"] == f"bytes 100-{len(whole) - 1}/{len(whole)}"
        assert part.content == whole[100:]
        url = f"{image.registry.url}/v2/{image.repository}/manifests/{image.digest}"
        assert client.delete(url).status_code == 202
        assert client.get(url, headers={"Accept": ACCEPT}).status_code == 404


@needs_registry
def test_the_auth_registry_wants_basic_auth(auth_registry: LocalRegistry, push_image: PushImage) -> None:
    with httpx.Client(timeout=10) as client:
        anonymous = client.get(f"{auth_registry.url}/v2/")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Basic realm=")
        assert client.get(f"{auth_registry.url}/v2/", auth=(AUTH_USER, AUTH_PASSWORD)).status_code == 200
        assert client.get(f"{auth_registry.url}/v2/", auth=(AUTH_USER, "wrong")).status_code == 401

        image = push_image([base_layer()], registry=auth_registry)
        url = f"{auth_registry.url}/v2/{image.repository}/manifests/{image.tag}"
        assert client.get(url, headers={"Accept": ACCEPT}).status_code == 401
        assert client.get(url, headers={"Accept": ACCEPT}, auth=(AUTH_USER, AUTH_PASSWORD)).status_code == 200

    with pytest.raises(RegistryError, match="unauthorized") as failed:
        auth_registry.push(image.layout.root, "test/denied", tag=image.tag, creds=(AUTH_USER, "wrong"))
    assert "wrong" not in str(failed.value)  # the password is not in the message


@needs_registry
def test_push_errors_say_what_went_wrong(registry: LocalRegistry, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an OCI image layout"):
        registry.push(tmp_path, "test/x", tag="1")
    layout = OCILayout(tmp_path / "layout")
    layout.add_image([base_layer()], tag="1")
    with pytest.raises(RegistryError, match="skopeo copy failed") as failed:
        registry.push(layout.root, "test/x", tag="no-such-tag")
    assert "no-such-tag" in str(failed.value)
    with pytest.raises(ConfigError, match="repository name"):
        registry.push(layout.root, "Test/Upper", tag="1")


def test_a_missing_binary_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_registry, "REGISTRY_BINARY", "sandrl-no-such-registry")
    with pytest.raises(RegistryError, match="apt-get install docker-registry"):
        LocalRegistry(tmp_path).start()


@needs_registry
def test_a_registry_that_cannot_start_shows_its_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        registry = LocalRegistry(tmp_path, port=taken.getsockname()[1], start_timeout_s=10)
        with pytest.raises(RegistryError, match="address already in use"):
            registry.start()
    assert registry.pid is None


@needs_registry
def test_a_relative_root_is_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with LocalRegistry(Path("relative")) as registry:
        assert registry.root == tmp_path / "relative" and registry.storage.is_dir()
        assert httpx.get(f"{registry.url}/v2/", timeout=10).status_code == 200


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True  # dead; only its reaper is late
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@needs_registry
@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_no_registry_outlives_its_process(tmp_path: Path, how: str) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sandrl.images.local_registry import LocalRegistry\n"
        "registry = LocalRegistry(Path(sys.argv[1])).start()\n"
        "print(registry.pid, flush=True)\n"
        "sys.stdin.readline()\n"  # then exits without stop(), or is killed before
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    with subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as owner:
        assert owner.stdin is not None and owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert not _gone(pid, within_s=0.2)
        if how == "is killed":
            owner.send_signal(signal.SIGKILL)  # no atexit, no finalizer: only the kernel's death signal is left
        else:
            owner.stdin.write("exit\n")
            owner.stdin.flush()
        assert owner.wait(timeout=30) == (-signal.SIGKILL if how == "is killed" else 0)
    assert _gone(pid), f"registry {pid} outlived the process that started it"


# --- the fault proxy


@needs_registry
def test_the_proxy_forwards_injects_and_counts(fault_proxy: FaultProxy, push_image: PushImage) -> None:
    image = push_image([base_layer(), top_layer()])
    manifest = json.loads(image.layout.read_blob(image.digest))
    layer = manifest["layers"][1]
    whole = image.layout.read_blob(layer["digest"])
    manifests = f"{fault_proxy.url}/v2/{image.repository}/manifests/{image.tag}"
    blob_url = f"{fault_proxy.url}/v2/{image.repository}/blobs/{layer['digest']}"

    fault_proxy.fail_next(r"/manifests/", status=429, retry_after="3")
    fault_proxy.fail_next(r"/blobs/", status=503, times=2)
    fault_proxy.cut_next(r"/blobs/", after_bytes=100)
    with httpx.Client(timeout=10) as client:
        limited = client.get(manifests, headers={"Accept": ACCEPT})
        assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
        assert limited.json()["errors"][0]["code"] == "TOOMANYREQUESTS"
        served = client.get(manifests, headers={"Accept": ACCEPT})
        assert served.status_code == 200 and served.content == image.layout.read_blob(image.digest)
        assert served.headers["docker-content-digest"] == image.digest

        assert [client.get(blob_url).status_code for _ in range(2)] == [503, 503]
        chunks: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError), client.stream("GET", blob_url) as cut:
            assert cut.status_code == 200 and int(cut.headers["content-length"]) == len(whole)
            chunks.extend(cut.iter_raw())
        received = b"".join(chunks)
        assert received == whole[:100]
        resumed = client.get(blob_url, headers={"Range": "bytes=100-"})
        assert resumed.status_code == 206 and received + resumed.content == whole
        assert client.get(blob_url).content == whole
        head = client.head(blob_url)
        assert head.status_code == 200 and int(head.headers["content-length"]) == len(whole)

    assert fault_proxy.pending_faults == 0
    assert fault_proxy.counts[("GET", f"/v2/{image.repository}/manifests/{image.tag}")] == 2
    assert fault_proxy.count("GET", layer["digest"]) == 5 and fault_proxy.count("HEAD", layer["digest"]) == 1
    seen = [(r.method, r.status, r.fault, r.headers.get("range")) for r in fault_proxy.requests if "blobs" in r.path]
    assert seen == [
        ("GET", 503, "status 503", None),
        ("GET", 503, "status 503", None),
        ("GET", 200, "cut after 100 bytes", None),
        ("GET", 206, None, "bytes=100-"),
        ("GET", 200, None, None),
        ("HEAD", 200, None, None),
    ]
    fault_proxy.reset()
    assert fault_proxy.requests == []


@needs_registry
def test_the_proxy_stalls_a_response(fault_proxy: FaultProxy, push_image: PushImage) -> None:
    image = push_image([top_layer()])
    layer = json.loads(image.layout.read_blob(image.digest))["layers"][0]
    blob_url = f"{fault_proxy.url}/v2/{image.repository}/blobs/{layer['digest']}"
    fault_proxy.stall_next(r"/blobs/", seconds=30, after_bytes=10)
    fault_proxy.stall_next(r"/blobs/", seconds=0.5)
    with httpx.Client(timeout=httpx.Timeout(10, read=0.3)) as client:
        with pytest.raises(httpx.ReadTimeout), client.stream("GET", blob_url) as stalled:
            assert stalled.status_code == 200
            stalled.read()
        started = time.monotonic()
        with httpx.Client(timeout=10) as patient:
            assert patient.get(blob_url).content == image.layout.read_blob(layer["digest"])
        assert time.monotonic() - started >= 0.5
    assert [r.fault for r in fault_proxy.requests] == ["stalled 30 s after 10 bytes", "stalled 0.5 s after 0 bytes"]
    # stop() ends the first stall at once, not 30 s later (the fixture's teardown would otherwise wait)


@needs_registry
def test_the_proxy_passes_authorization_and_names_itself_in_locations(
    auth_registry: LocalRegistry, registry: LocalRegistry
) -> None:
    with FaultProxy(auth_registry.url) as proxy, httpx.Client(timeout=10) as client:
        assert client.get(f"{proxy.url}/v2/").status_code == 401
        assert client.get(f"{proxy.url}/v2/", auth=(AUTH_USER, AUTH_PASSWORD)).status_code == 200
        assert proxy.requests[1].headers["authorization"].startswith("Basic ")
    with FaultProxy(registry.url) as proxy, httpx.Client(timeout=10) as client:
        upload = client.post(f"{proxy.url}/v2/test/upload/blobs/uploads/")
        assert upload.status_code == 202 and upload.headers["location"].startswith(proxy.url)
        data = b"a blob pushed through the proxy"
        location = httpx.URL(upload.headers["location"])
        done = client.put(location.copy_merge_params({"digest": sha256(data)}), content=data)
        assert done.status_code == 201, done.text
        assert client.get(f"{registry.url}/v2/test/upload/blobs/{sha256(data)}").content == data
