"""A CLI agent in the task's image: fetched once, laid over each task image as a cached layer, checked to run.

Why not ``npm install`` in a build step: a task's image often has no node (Harbor's and SWE-bench's
registry images), a build step per task image would copy the 400 MB binary into each, and an
install script is code from the registry run at build time. What the CLIs ship is a native binary
per platform, so sandrl:

1. **fetches** the pinned version's platform package from npm into its cache, checked
   (:mod:`.npm`), when the agent is opened: a version that does not exist fails the run before any
   episode;
2. **lays** its files, as a tree ``/opt/sandrl/agents/<agent>-<version>/``, over each task image
   the run's episodes start from, as a layer the provider keeps once per tree and shares between
   images (:class:`~sandrl.sandbox.base.TreeLayering`; the local bubblewrap provider's is
   :mod:`sandrl.sandbox.bwrap.tree_layers`): no build, no copy per image, no cost per episode;
3. **checks**, once per task image per run, in a sandbox of that image: first what the image is
   (its CPU, its C library: the platform package to use), then that ``<agent> --version`` runs in
   the image with the agent laid over it. An image it cannot run in (no ``/bin/sh``, another CPU,
   no C library the binary needs) fails that task's episodes as the broken environment it is
   (:class:`~sandrl.errors.ImageBuildError`, an infra error not retried), in one line that says
   what the agent needs.

:class:`AgentImages` is the runner's ``image_for`` of a CLI agent: the task's image (from the image
source the runner had) with the agent over it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import platform as host_platform
import shutil
import uuid
from pathlib import Path

from sandrl.cache_dirs import cache_dir
from sandrl.errors import ConfigError, ImageBuildError
from sandrl.rollout.agents.cli.npm import CACHE_NAME, NpmPackage, fetch_package
from sandrl.rollout.agents.cli.spec import INSTALL_ROOT, CliSpec, Libc, Payload, Platform
from sandrl.rollout.images import ImageFor
from sandrl.sandbox.base import (
    ExecResult,
    SandboxProvider,
    SandboxSpec,
    TreeLayering,
    require_port_forwarding,
    require_tree_layering,
)
from sandrl.tasks.task import Task

ARCHES = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
"""``uname -m`` -> npm's CPU names."""
LOADERS: dict[str, tuple[tuple[str, Libc], ...]] = {
    "x64": (("/lib64/ld-linux-x86-64.so.2", "glibc"), ("/lib/ld-musl-x86_64.so.1", "musl")),
    "arm64": (("/lib/ld-linux-aarch64.so.1", "glibc"), ("/lib/ld-musl-aarch64.so.1", "musl")),
}
"""The program interpreter each binary names, by CPU and C library: what the image must have."""
CHECK_TIMEOUT_S = 60.0
_TAIL = 600


def host_arch() -> str:
    machine = host_platform.machine().lower()
    arch = ARCHES.get(machine)
    if arch is None:
        raise ConfigError(f"the CLI agents ship Linux binaries for x86-64 and arm64, and this machine is {machine}")
    return arch


class CliInstall:
    """One CLI agent at one version: its files fetched and laid over task images (see the module)."""

    def __init__(self, spec: CliSpec, version: str, *, registry: str) -> None:
        self.spec = spec
        self.version = version
        self.registry = registry
        self.install_dir = spec.install_dir(version)
        self._trees: dict[str, asyncio.Future[Path]] = {}

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.version}"

    def package(self, payload: Payload) -> NpmPackage:
        return NpmPackage(
            payload.npm_name,
            payload.npm_version,
            registry=self.registry,
            setting=f"[rollout.cli_agents] {self.spec.setting}",
        )

    async def prepare(self) -> None:
        """Fetch the files for this machine's usual platform (glibc) now, so that a version that does not
        exist, or a registry that cannot be reached, ends the run before its first episode."""
        await self.tree(self.spec.payload(self.version, Platform(host_arch(), "glibc")))

    async def tree(self, payload: Payload) -> Path:
        """The directory tree laid over an image for ``payload`` (``opt/sandrl/agents/...``), made once."""
        made = self._trees.get(payload.variant)
        if made is None:
            made = self._trees[payload.variant] = asyncio.ensure_future(self._make_tree(payload))
        return await asyncio.shield(made)

    async def _make_tree(self, payload: Payload) -> Path:
        package = self.package(payload)
        unpacked = await fetch_package(package, [source for source, _ in payload.files])
        root = (
            cache_dir(CACHE_NAME)
            / "trees"
            / f"{self.spec.name}-{self.version}-{payload.variant}-{tree_key(payload)[:12]}"
        )
        if root.is_dir():
            return root
        await asyncio.to_thread(_link_tree, unpacked, root, payload, self.install_dir)
        return root


def tree_key(payload: Payload) -> str:
    """Names a tree's content: the npm version (immutable once published) and what is taken of it."""
    return hashlib.sha256(json.dumps([payload.npm_name, payload.npm_version, payload.files]).encode()).hexdigest()


def _link_tree(unpacked: Path, root: Path, payload: Payload, install_dir: str) -> None:
    """``root/<install_dir>/`` with ``payload``'s files, hard links into the unpacked package (the
    cache's own), made aside and renamed into place whole."""
    staged = root.with_name(f".{root.name}.{uuid.uuid4().hex}")
    try:
        for source, dest in payload.files:
            src = unpacked / source
            target = staged / install_dir.lstrip("/") / dest
            paths = [(src, target)] if src.is_file() else _walk(src, target)
            for one, there in paths:
                there.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(one, there)
                except OSError:
                    shutil.copy2(one, there)
        for d in (staged, *staged.rglob("*")):
            if d.is_dir():
                os.chmod(d, 0o755)  # as the image's own directories; mkdir left them to the umask
        try:
            os.rename(staged, root)
        except OSError:
            if not root.is_dir():
                raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _walk(src: Path, target: Path) -> list[tuple[Path, Path]]:
    return [(f, target / f.relative_to(src)) for f in sorted(src.rglob("*")) if f.is_file()]


class AgentImages:
    """The ``image_for`` of a CLI agent's runner: ``task_image(task)`` with the agent laid over it,
    made and checked once per task image (concurrent askers share that work; a failure stays one)."""

    def __init__(self, install: CliInstall, task_image: ImageFor, provider: SandboxProvider) -> None:
        require_tree_layering(provider, f"the {install.spec.name} agent")
        require_port_forwarding(provider, f"the {install.spec.name} agent")
        assert isinstance(provider, TreeLayering)
        self.install = install
        self.task_image = task_image
        self.provider = provider
        self.layering: TreeLayering = provider
        self._made: dict[str, asyncio.Future[str]] = {}

    async def __call__(self, task: Task) -> str:
        base = await self.task_image(task)
        made = self._made.get(base)
        if made is None:
            made = self._made[base] = asyncio.ensure_future(self._over(base))
            made.add_done_callback(functools.partial(self._settled, base))
        return await asyncio.shield(made)

    def _settled(self, base: str, made: asyncio.Future[str]) -> None:
        """A broken image stays broken for the run; any other failure (a sandbox that could not be
        made now) is forgotten, so the next episode of that image tries again."""
        failure = None if made.cancelled() else made.exception()
        if (made.cancelled() or (failure is not None and not isinstance(failure, ImageBuildError | ConfigError))) and (
            self._made.get(base) is made
        ):
            del self._made[base]

    async def _over(self, base: str) -> str:
        install = self.install
        found = await self._platform(base)
        payload = install.spec.payload(install.version, found)
        tree = await install.tree(payload)
        image = await self.layering.layer_tree(
            base, tree, key=f"{tree_key(payload)}:{install.install_dir}", name=f"{install.spec.name}-{install.version}"
        )
        exe = f"{install.install_dir}/{install.spec.executable}"
        result = await self._run(image, f"{exe} --version")
        if result.exit_code != 0 or install.version not in result.stdout:
            raise ImageBuildError(
                f"{install.label} cannot run in the image {base}: `{exe} --version` exited {result.exit_code}"
                f"{_said(result)}; it needs {install.spec.needs}"
            )
        return image

    async def _platform(self, base: str) -> Platform:
        """The CPU and C library of the image ``base``, from a sandbox of it."""
        probes = " ".join(path for loaders in LOADERS.values() for path, _ in loaders)
        script = f'uname -m; for f in {probes}; do [ -e "$f" ] && echo "$f"; done; [ -L /opt ] && echo /opt; exit 0'
        result = await self._run(base, script)
        lines = result.stdout.split()
        if result.exit_code != 0 or not lines:
            raise ImageBuildError(
                f"{self.install.label} cannot run in the image {base}: its /bin/sh did not run (exit "
                f"{result.exit_code}{_said(result)}); it needs {self.install.spec.needs}"
            )
        arch = ARCHES.get(lines[0].lower())
        if arch is None:
            raise ImageBuildError(
                f"{self.install.label} cannot run in the image {base}: its CPU is {lines[0][:40]!r}; it needs "
                f"{self.install.spec.needs}"
            )
        if "/opt" in lines[1:]:
            raise ImageBuildError(
                f"{self.install.label} cannot be laid over the image {base}: its /opt is a link, which the agent's "
                f"directory {INSTALL_ROOT} would hide; make /opt a directory in the task's image"
            )
        libc = next((kind for path, kind in LOADERS[arch] if path in lines[1:]), None)
        return Platform(arch, libc)

    async def _run(self, image: str, command: str) -> ExecResult:
        spec = SandboxSpec(image=image, workdir="/", ttl_s=CHECK_TIMEOUT_S * 2, entrypoint=False)
        async with await self.provider.create(spec) as sandbox:
            return await sandbox.exec(command, timeout_s=CHECK_TIMEOUT_S, env={"HOME": "/tmp"})


def _said(result: ExecResult) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).replace("\n", " | ")
    return f": {text[-_TAIL:]}" if text else ""
