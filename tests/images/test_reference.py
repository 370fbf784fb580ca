"""References, mirrors, credentials and platforms: the rules Docker uses, checked case by case."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.images.credentials import DockerConfig
from sandrl.images.manifest import Platform, parse_config, parse_manifest, select_platform
from sandrl.images.reference import Mirrors, endpoints, is_loopback, parse_reference

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", "latest", None),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("alexgshaw/task:20250101", "docker.io", "alexgshaw/task", "20250101", None),
        ("docker.io/library/python:3.11-slim", "docker.io", "library/python", "3.11-slim", None),
        ("index.docker.io/library/python", "docker.io", "library/python", "latest", None),
        (
            "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
            "ghcr.io",
            "laude-institute/t-bench/python-3-13",
            "20250620",
            None,
        ),
        ("127.0.0.1:5000/test/base:1", "127.0.0.1:5000", "test/base", "1", None),
        ("localhost/img", "localhost", "img", "latest", None),
        (f"ubuntu@{DIGEST}", "docker.io", "library/ubuntu", None, DIGEST),
        (f"ubuntu:24.04@{DIGEST}", "docker.io", "library/ubuntu", "24.04", DIGEST),
        (
            "swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
            "docker.io",
            "swebench/sweb.eval.x86_64.django_1776_django-11099",
            "latest",
            None,
        ),
    ],
)
def test_references_parse_as_docker_reads_them(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert parse_reference(str(ref)) == ref  # the canonical form reads back the same


@pytest.mark.parametrize(
    "text", ["", "Ubuntu:24.04", "ubuntu:bad tag", "ubuntu@sha256:short", "a//b", "ubuntu:" + "x" * 200, "-x"]
)
def test_bad_references_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_reference(text)


def test_familiar_form_drops_docker_hub_prefixes() -> None:
    assert parse_reference("docker.io/library/ubuntu:24.04").familiar == "ubuntu:24.04"
    assert parse_reference("ghcr.io/a/b:1").familiar == "ghcr.io/a/b:1"


def test_mirrors_come_first_and_keep_the_repository_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDRL_REGISTRIES_CONFIG", str(tmp_path / "absent.toml"))
    (tmp_path / "absent.toml").write_text('[mirrors]\n"docker.io" = ["https://file-mirror.example"]\n')
    monkeypatch.setenv("SANDRL_REGISTRY_MIRRORS", "docker.io=http://127.0.0.1:5000,index.docker.io=http://m2:1")
    mirrors = Mirrors.from_environment()
    ref = parse_reference("python:3.11-slim")
    assert endpoints(ref, mirrors) == [
        "http://127.0.0.1:5000",
        "http://m2:1",
        "https://file-mirror.example",
        "https://registry-1.docker.io",
    ]
    assert endpoints(parse_reference("127.0.0.1:5055/x/y"), mirrors) == ["http://127.0.0.1:5055"]
    assert endpoints(parse_reference("ghcr.io/x/y"), mirrors) == ["https://ghcr.io"]


@pytest.mark.parametrize("bad", ["docker.io", "docker.io=ftp://x", "=http://x"])
def test_bad_mirror_settings_say_what_to_write(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"docker\.io=http|http:// or https://"):
        Mirrors.parse(bad)


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost") and is_loopback("[::1]:80")
    assert not is_loopback("ghcr.io") and not is_loopback("10.0.0.1:5000")


def test_docker_config_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = base64.b64encode(b"alice:s3cret").decode()
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "auths": {
                    "https://index.docker.io/v1/": {"auth": auth},
                    "127.0.0.1:5055": {"username": "bob", "password": "pw"},
                    "ghcr.io": {"identitytoken": "tok"},
                }
            }
        )
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    config = DockerConfig()
    hub = config.lookup("docker.io")
    assert hub is not None and (hub.username, hub.password) == ("alice", "s3cret")
    local = config.lookup("127.0.0.1:5055")
    assert local is not None and local.username == "bob"
    ghcr = config.lookup("ghcr.io")
    assert ghcr is not None and ghcr.identity_token == "tok"
    assert config.lookup("quay.io") is None
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json"):
        DockerConfig()


def _index(*platforms: tuple[str, str, str | None]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": "sha256:" + str(i) * 64,
                    "size": 10,
                    "platform": {"os": os_, "architecture": arch, **({"variant": var} if var else {})},
                }
                for i, (os_, arch, var) in enumerate(platforms, 1)
            ],
        }
    ).encode()


def test_platform_selection_from_an_index() -> None:
    index = parse_manifest(
        _index(("linux", "amd64", None), ("linux", "arm64", "v8"), ("unknown", "unknown", None)), "", "x"
    )
    assert index.is_index
    assert select_platform(index, Platform("linux", "amd64"), "x").digest == "sha256:" + "1" * 64
    assert select_platform(index, Platform.parse("linux/arm64"), "x").digest == "sha256:" + "2" * 64
    assert select_platform(index, Platform.parse("linux/aarch64/v8"), "x").digest == "sha256:" + "2" * 64
    with pytest.raises(Exception, match=r"no image for linux/s390x \(it has: linux/amd64, linux/arm64/v8\)"):
        select_platform(index, Platform.parse("linux/s390x"), "x")
    with pytest.raises(ConfigError):
        Platform.parse("amd64")


def test_image_config_fields() -> None:
    body = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/bin:/bin", "A=b=c"],
                "WorkingDir": "/app",
                "User": "1000:1000",
                "Entrypoint": ["/entry.sh"],
                "Cmd": ["bash"],
                "ExposedPorts": {"8080/tcp": {}},
                "Healthcheck": {"Test": ["CMD-SHELL", "true"]},
            },
            "rootfs": {"type": "layers", "diff_ids": [DIGEST]},
        }
    ).encode()
    config = parse_config(body, "x")
    assert config.env == {"PATH": "/usr/bin:/bin", "A": "b=c"}
    assert (config.workdir, config.user, config.entrypoint, config.cmd) == (
        "/app",
        "1000:1000",
        ("/entry.sh",),
        ("bash",),
    )
    assert config.exposed_ports == ("8080/tcp",) and config.healthcheck == ("CMD-SHELL", "true")
    assert config.diff_ids == (DIGEST,)
