"""The npm fetch of a CLI agent's package, against a registry on loopback serving what the test made:
a version it does not have, a tarball that is not what its record says, one sent off the registry's
host, names that climb out of the package, links: each refused in one line naming the fix."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Response

from sandrl.background_server import BackgroundServer
from sandrl.cache_dirs import CACHE_ENV
from sandrl.errors import ConfigError, LayerError, RegistryError
from sandrl.rollout.agents.cli import CliAgentsConfig, cli_install
from sandrl.rollout.agents.cli.npm import NpmPackage, fetch_package


def tarball(
    files: dict[str, bytes], *, links: dict[str, str] | None = None, modes: dict[str, int] | None = None
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = (modes or {}).get(name, 0o644)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return out.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@dataclass
class FakeRegistry:
    """Packages by (name, version): the tarball served, and what the record says of it."""

    packages: dict[tuple[str, str], bytes] = field(default_factory=dict)
    lie: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    url: str = ""
    served: list[str] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/{scope}/{name}/{version}")
        def record(scope: str, name: str, version: str) -> Response:
            key = (f"{scope}/{name}" if scope.startswith("@") else scope, version)
            self.served.append(f"{key[0]}@{version}")
            if key not in self.packages:
                return Response(status_code=404)
            data = self.packages[key]
            dist = {"tarball": f"{self.url}/-/t/{len(self.served)}/{name}.tgz", "integrity": integrity(data)}
            dist.update(self.lie.get(key, {}))
            body = json.dumps({"name": key[0], "version": version, "dist": dist})
            return Response(body, media_type="application/json")

        @app.get("/-/t/{n}/{name}.tgz")
        def tgz(n: int, name: str) -> Response:
            data = next(d for (pkg, _), d in self.packages.items() if pkg.endswith("/" + name))
            return Response(data, media_type="application/octet-stream")

        return app


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRegistry]:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # fake packages never reach the real cache
    fake = FakeRegistry()
    with BackgroundServer(fake.app()) as server:
        fake.url = server.url
        yield fake


async def test_a_package_is_fetched_once_checked_and_unpacked(registry: FakeRegistry) -> None:
    data = tarball(
        {"package/bin/tool": b"#!/bin/sh\necho hi\n", "package/README.md": b"x"}, modes={"package/bin/tool": 0o4755}
    )
    registry.packages[("@acme/tool", "1.0.0")] = data
    package = NpmPackage("@acme/tool", "1.0.0", registry=registry.url)
    unpacked = await fetch_package(package, ["bin"])
    tool = unpacked / "bin" / "tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert tool.stat().st_mode & 0o7777 == 0o755  # executable, never setuid
    assert not (unpacked / "README.md").exists()  # only what was asked for
    assert await fetch_package(package, ["bin"]) == unpacked
    assert registry.served == ["@acme/tool@1.0.0"]  # the second fetch came from the cache


async def test_a_version_the_registry_does_not_have_names_the_setting(registry: FakeRegistry) -> None:
    install = cli_install("claude-code", CliAgentsConfig(claude_code="9.9.9", registry=registry.url))
    with pytest.raises(ConfigError) as caught:
        await install.prepare()
    message = caught.value.message
    assert "has no @anthropic-ai/claude-code-linux-" in message and "9.9.9" in message
    assert "[rollout.cli_agents] claude_code" in message and "\n" not in message


async def test_a_tarball_that_is_not_what_the_record_says_is_refused(registry: FakeRegistry) -> None:
    registry.packages[("@acme/tool", "1.0.0")] = tarball({"package/bin/tool": b"evil"})
    registry.lie[("@acme/tool", "1.0.0")] = {"integrity": integrity(b"something else")}
    package = NpmPackage("@acme/tool", "1.0.0", registry=registry.url)
    with pytest.raises(LayerError, match="does not match the registry's sha512"):
        await fetch_package(package, ["bin"])
    assert not package.cache_path(["bin"]).exists()


async def test_a_tarball_sent_off_the_registry_host_is_refused(registry: FakeRegistry) -> None:
    registry.packages[("@acme/tool", "1.0.0")] = tarball({"package/bin/tool": b"x"})
    registry.lie[("@acme/tool", "1.0.0")] = {"tarball": "http://10.1.2.3/tool.tgz"}
    with pytest.raises(LayerError, match="off the registry's host"):
        await fetch_package(NpmPackage("@acme/tool", "1.0.0", registry=registry.url), ["bin"])


@pytest.mark.parametrize(
    ("files", "links", "match"),
    [
        ({"package/../../etc/x": b"x"}, None, "unsafe name"),
        ({"/etc/x": b"x"}, None, "unsafe name"),
        ({}, {"package/bin/tool": "/etc/shadow"}, "link or a special file"),
        ({"package/other": b"x"}, None, "has no bin"),
    ],
)
async def test_hostile_or_wrong_tarballs_are_refused(
    registry: FakeRegistry, files: dict[str, bytes], links: dict[str, str] | None, match: str
) -> None:
    registry.packages[("@acme/tool", "1.0.0")] = tarball(files, links=links)
    package = NpmPackage("@acme/tool", "1.0.0", registry=registry.url)
    with pytest.raises(LayerError, match=match):
        await fetch_package(package, ["bin"])
    assert not package.cache_path(["bin"]).exists()


async def test_a_registry_that_cannot_be_reached_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    with BackgroundServer(FastAPI()) as server:
        url = server.url
    with pytest.raises(RegistryError, match="cannot reach the npm registry"):  # the port is closed now
        await fetch_package(NpmPackage("@acme/tool", "1.0.0", registry=url), ["bin"])


def test_bad_settings_are_refused_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match=r"not a version of .*\[rollout.cli_agents\] codex"):
        CliAgentsConfig(codex="latest; rm -rf /")
    with pytest.raises(ConfigError, match="must be an http"):
        CliAgentsConfig(registry="file:///etc")
    with pytest.raises(ConfigError, match="log_bytes"):
        CliAgentsConfig(log_bytes=-1)
