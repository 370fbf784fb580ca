"""`sandrl images pull|import|ls|prune` against a real loopback registry and a real store."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.images.host_rootfs import shell_layer, shell_rootfs
from sandrl.images.manifest import ImageConfig, Platform
from sandrl.images.oci_layout import LayerSpec, regular_file
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import REASON as SANDBOX_REASON
from .conftest import PushImage, needs_registry

SANDRL = Path(sys.executable).with_name("sandrl")
pytestmark = [needs_registry, pytest.mark.skipif(SANDBOX_REASON is not None, reason=SANDBOX_REASON or "")]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The CLI's providers on a state directory of this test's own, with no mirrors or credentials."""
    state = tmp_path / "state"
    monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state)
    monkeypatch.setenv("SANDRL_REGISTRY_MIRRORS", "")
    monkeypatch.setenv("SANDRL_REGISTRIES_CONFIG", str(tmp_path / "registries.toml"))
    (tmp_path / "registries.toml").write_text("")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    yield state


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_pull_ls_and_prune(state: Path, push_image: PushImage) -> None:
    pushed = push_image(
        [LayerSpec([regular_file("etc/motd", "hello\n")])], ImageConfig(env={"PATH": "/usr/bin"}, workdir="/")
    )
    code, output = _run(["images", "pull", pushed.ref])
    assert code == 0, output
    line = json.loads(output.strip().splitlines()[-1])
    assert line["digest"] == pushed.digest and line["reference"] == pushed.ref
    code, output = _run(["images", "ls"])
    assert code == 0 and line["image"] in output and pushed.digest[:19] in output and pushed.repository in output
    code, output = _run(["images", "prune", "--dry-run"])
    assert code == 0 and json.loads(output.strip().splitlines()[-1])["layers"] == 0  # the pulled image uses it
    code, output = _run(["images", "rm", line["image"], "--no-prune"])
    assert code == 0, output
    code, output = _run(["images", "prune", "--dry-run"])
    planned = json.loads(output.strip().splitlines()[-1])
    assert planned["dry_run"] and planned["layers"] == 1
    code, output = _run(["images", "prune", "--yes"])
    assert code == 0 and json.loads(output.strip().splitlines()[-1])["layers"] == 1
    assert [p.name for p in (state / "images" / "layers").iterdir() if not p.name.startswith(".")] == []


def test_pull_of_an_unknown_image_is_one_clear_line(state: Path, push_image: PushImage) -> None:
    pushed = push_image([LayerSpec([regular_file("x", "x")])])
    env = {**os.environ, "SANDRL_STATE_DIR": str(state)}
    for ref, said in [
        (pushed.ref.replace(":1", ":no-such-tag"), "MANIFEST_UNKNOWN"),
        ("Not A Reference", "not an image reference"),
    ]:
        done = subprocess.run(
            [str(SANDRL), "images", "pull", ref], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


async def test_import_a_rootfs_tar_and_run_it(state: Path, tmp_path: Path) -> None:
    rootfs = shell_rootfs(tmp_path / "rootfs")
    archive = tmp_path / "rootfs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(rootfs, arcname=".")
        evil = tarfile.TarInfo("usr/bin/evil")
        evil.mode = 0o4755
        evil.size = 3
        tar.addfile(evil, io.BytesIO(b"#!/"))
    code, output = _run(["images", "import", str(archive), "imported"])
    assert code == 0, output
    provider = BwrapProvider(state)
    try:
        async with await provider.create(SandboxSpec(image="imported", ttl_s=60)) as sandbox:
            out = await sandbox.exec("echo $0; stat -c %a /usr/bin/evil")
        assert out.stdout.splitlines() == ["sh", "755"]  # the setuid bit did not come in
    finally:
        await provider.close_all()


def test_from_platform_picks_that_platforms_image(state: Path, push_image: PushImage, tmp_path: Path) -> None:
    pushed = push_image(
        [shell_layer(tmp_path / "rootfs")],
        platforms=[
            ImageConfig(platform=Platform(architecture="amd64")),
            ImageConfig(platform=Platform(architecture="arm64", variant="v8")),
        ],
    )
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f'FROM --platform=linux/arm64 {pushed.ref}\nCMD ["true"]\n')
    code, output = _run(["images", "build", "armed", "-f", str(tmp_path / "ctx" / "Dockerfile")])
    assert code == 0, output
    store = BwrapProvider(state).images
    pulled = [n for n in store.names() if store.meta(n).get("config", {}).get("platform") == "linux/arm64/v8"]  # type: ignore[union-attr]
    assert len(pulled) == 1
