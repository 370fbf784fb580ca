"""Tasks as published, on images from a registry: FROM through a mirror, a prebuilt docker_image,
and an ENTRYPOINT whose service is up when the agent starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.images.host_rootfs import shell_layer
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import ImageConfig
from sandrl.images.oci_layout import LayerSpec, regular_file
from sandrl.sandbox.base import ImageSource, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.entrypoint import ENTRYPOINT_LOG
from sandrl.tasks.loader import load_tasks
from sandrl.wiring.suite import run_suite

from ..support import REASON as SANDBOX_REASON
from .conftest import PushImage, needs_registry

pytestmark = [needs_registry, pytest.mark.skipif(SANDBOX_REASON is not None, reason=SANDBOX_REASON or "")]

ENTRY = """#!/bin/sh
# What task images' entrypoints do: name a service in /etc/hosts, start it, then hand over.
echo "127.0.0.1 db.internal" >> /etc/hosts
( while :; do date +%s > /run/db.up; sleep 1; done ) &
while [ ! -e /run/db.up ]; do sleep 0.05; done
exec "$@"
"""


@pytest.fixture
def mirrors(registry: LocalRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> LocalRegistry:
    """The loopback registry as the mirror of Docker Hub and ghcr.io, as a user offline would set it."""
    monkeypatch.setenv("SANDRL_REGISTRY_MIRRORS", f"docker.io={registry.url},ghcr.io={registry.url}")
    monkeypatch.setenv("SANDRL_REGISTRIES_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    return registry


def _harbor_task(root: Path, *, dockerfile: str | None = None, docker_image: str | None = None) -> Path:
    root.mkdir(parents=True)
    environment = "[environment]\nbuild_timeout_sec = 300.0\nallow_internet = false\n"
    if docker_image is not None:
        environment += f'docker_image = "{docker_image}"\n'
    (root / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\n\n[verifier]\ntimeout_sec = 60.0\n\n'
        f"[agent]\ntimeout_sec = 60.0\n\n{environment}"
    )
    (root / "instruction.md").write_text("Write done to /app/answer.txt.\n")
    if dockerfile is not None:
        (root / "environment").mkdir()
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("#!/bin/sh\nmkdir -p /app && echo done > /app/answer.txt\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text(
        "#!/bin/sh\n"
        'if [ "$(cat /app/answer.txt)" = done ] && [ -e /opt/from-the-image ] && grep -q db.internal /etc/hosts; '
        "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return root


def _image_layers(rootfs: Path) -> list[LayerSpec]:
    return [
        shell_layer(rootfs),
        LayerSpec([regular_file("opt/from-the-image", "yes\n"), regular_file("entry.sh", ENTRY, mode=0o755)]),
    ]


ENTRY_CONFIG = ImageConfig(env={"PATH": "/usr/bin:/bin"}, entrypoint=("/entry.sh",), cmd=("/bin/sh",))


async def test_an_entrypoint_service_is_up_when_the_sandbox_is_handed_over(
    provider: BwrapProvider, push_image: PushImage, rootfs: Path, registry: LocalRegistry
) -> None:
    pushed = push_image(_image_layers(rootfs), ENTRY_CONFIG)
    name = await provider.resolve_image(_source(pushed.ref))
    async with await provider.create(SandboxSpec(image=name, ttl_s=60)) as sandbox:
        out = await sandbox.exec(
            "grep db.internal /etc/hosts && test -e /run/db.up && echo up; "
            "for p in /proc/[0-9]*; do tr '\\000' ' ' < $p/cmdline; echo; done | grep -c '^sleep infinity'"
        )
        log = await sandbox.exec(f"test -e {ENTRYPOINT_LOG} && echo logged")
    assert out.ok and out.stdout.splitlines()[-2:] == ["up", "1"], out
    assert log.stdout == "logged\n"
    async with await provider.create(SandboxSpec(image=name, ttl_s=60, entrypoint=False)) as sandbox:
        quiet = await sandbox.exec("test -e /run/db.up || echo not-started")
    assert quiet.stdout == "not-started\n"  # the image's CMD (/bin/sh) never runs either


def _source(image: str) -> ImageSource:
    return ImageSource(label="test", image=image)


async def test_harbor_task_from_a_mirrored_docker_hub_image_scores_1(
    provider: BwrapProvider, push_image: PushImage, rootfs: Path, mirrors: LocalRegistry, tmp_path: Path
) -> None:
    push_image(_image_layers(rootfs), ENTRY_CONFIG, repository="library/ubuntu", tag="24.04")
    _harbor_task(
        tmp_path / "tasks" / "from-ubuntu", dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN echo built > /app/b\n"
    )
    tasks, problems = load_tasks(tmp_path / "tasks")
    assert problems == [] and len(tasks) == 1
    runs = await run_suite(tasks, "oracle", provider, concurrency=1)
    assert runs[0].error is None, runs[0]
    assert runs[0].reward == 1.0, runs[0]
    null = await run_suite(tasks, "null", provider, concurrency=1)
    assert null[0].reward == 0.0


async def test_a_task_with_only_docker_image_runs_in_that_image(
    provider: BwrapProvider, push_image: PushImage, rootfs: Path, mirrors: LocalRegistry, tmp_path: Path
) -> None:
    push_image(_image_layers(rootfs), ENTRY_CONFIG, repository="alexgshaw/prebuilt-task", tag="20251031")
    _harbor_task(tmp_path / "tasks" / "tb2-style", docker_image="alexgshaw/prebuilt-task:20251031")
    tasks, problems = load_tasks(tmp_path / "tasks")
    assert problems == []
    runs = await run_suite(tasks, "oracle", provider, concurrency=1)
    assert runs[0].error is None and runs[0].reward == 1.0, runs[0]
    assert runs[0].image != "host"


async def test_a_missing_image_is_one_short_line(
    provider: BwrapProvider, mirrors: LocalRegistry, tmp_path: Path
) -> None:
    _harbor_task(tmp_path / "tasks" / "nowhere", docker_image="ghcr.io/nobody/nothing:1")
    tasks, _ = load_tasks(tmp_path / "tasks")
    runs = await run_suite(tasks, "oracle", provider, concurrency=1)
    error = runs[0].error or ""
    assert "ghcr.io/nobody/nothing:1" in error and mirrors.url in error and "SANDRL_REGISTRY_MIRRORS" in error
    assert "\n" not in error and len(error) < 1000, error
