"""``SandrlEnvironment``: Harbor's ``BaseEnvironment`` on a sandrl sandbox service.

Harbor runs a trial's agent and verifier in an *environment*; this one is a sandbox of
``sandrl serve sandboxes`` (local or remote), reached over sandrl's native HTTP API::

    export SANDRL_TOKEN=$(cat /etc/sandrl.token)        # or --ek token_file=/etc/sandrl.token
    harbor trial start -p TASK -a oracle -e sandrl_harbor:SandrlEnvironment --ek url=http://host:8700

Options (``--ek key=value``): ``url`` (default ``$SANDRL_SERVER``, else ``http://127.0.0.1:8700``),
``token_file``, ``image`` (start from this image of the host's store instead of what ``FROM`` names),
``sandbox_id`` (attach to a sandbox that exists: nothing is created, built or deleted; how sandrl
lends an episode's sandbox to a Harbor agent), ``ttl_sec`` (the service kills the sandbox after
this whatever happens to Harbor; default 3 hours).

How the environment is made: the task's Dockerfile is applied in a fresh sandbox
(:mod:`sandrl_harbor.dockerfile`); a task with only a ``docker_image`` runs in it when the host's
store has that name (``sandrl images pull REF`` prints the name to pass as ``--ek image=``).
Limits: the task's ``cpus``, ``memory_mb`` and ``storage_mb`` are enforced by the sandbox (cgroup
quota, memory limit, writable-layer size); the network is loopback only unless the task allows the
internet (then egress through NAT, never to the host or its private network); allowlists, GPUs,
Windows and compose tasks are refused.
Commands run with ``bash -c`` as root, or as the user asked (``runuser``), with the Dockerfile's
``ENV`` under the task's and the command's environment. A command past its timeout is killed and
raises, as in Harbor's Docker environment.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import shlex
import tarfile
from pathlib import Path
from typing import Any, override

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from harbor.models.trial.config import ResourceMode
from pydantic import Field

from sandrl.errors import ImageBuildError
from sandrl.images.dockerfile import Instruction, key_values, words
from sandrl_harbor.client import SandrlAPIError, SandrlClient
from sandrl_harbor.dockerfile import SKIPPED, DockerfileError, Plan, copy_sources, parse, step_text

DEFAULT_URL = "http://127.0.0.1:8700"
DEFAULT_TIMEOUT_SEC = 24 * 3600
"""An exec given no timeout (the service's longest)."""
_IMAGE_NAME = r"^[a-z0-9][a-z0-9._-]{0,127}$"


class SandrlOptions(EnvironmentOptions):
    """``--ek`` options of :class:`SandrlEnvironment` (see the module)."""

    url: str | None = Field(default=None, description="The sandbox service; default $SANDRL_SERVER or 127.0.0.1:8700.")
    token_file: str | None = Field(default=None, description="A file holding the service's token; else $SANDRL_TOKEN.")
    image: str | None = Field(default=None, description="An image of the host's store to start from (not FROM's).")
    sandbox_id: str | None = Field(default=None, description="Attach to this sandbox (not created, not deleted).")
    ttl_sec: float = Field(default=3 * 3600, gt=0, description="The service kills the sandbox after this.")


def _token(options: SandrlOptions) -> str | None:
    if options.token_file:
        return Path(options.token_file).read_text().strip() or None
    return (os.environ.get("SANDRL_TOKEN") or "").strip() or None


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tar(entries: list[tuple[Path, str]]) -> bytes:
    """A tar of ``(host path, name in the archive)`` entries, directories whole, owned by root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, name in entries:
            archive.add(str(path), arcname=name, recursive=True, filter=_as_root)
    return buffer.getvalue()


class SandrlEnvironment(BaseEnvironment):
    """A Harbor environment in a sandrl sandbox (see the module)."""

    options_model = SandrlOptions
    options: SandrlOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options
        self._client = SandrlClient(options.url or os.environ.get("SANDRL_SERVER") or DEFAULT_URL, _token(options))
        self._sandbox_id: str | None = options.sandbox_id
        self._owned = options.sandbox_id is None
        self._image_env: dict[str, str] = {}
        self._image_user: str | None = None
        self._workdir: str | None = None

    @staticmethod
    @override
    def type() -> str:
        return "sandrl"

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @override
    def _validate_definition(self) -> None:
        if self.options.sandbox_id or self.options.image:
            return
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    @property
    def sandbox_id(self) -> str:
        if self._sandbox_id is None:
            raise RuntimeError("the sandrl environment has not started: call start() first")
        return self._sandbox_id

    # -- lifecycle

    @override
    async def start(self, force_build: bool) -> None:
        if not self._owned:
            await self._client.get(self.sandbox_id)  # it must exist
            await self.ensure_dirs(self._mount_targets(writable_only=True))  # /logs/agent, /logs/verifier...
            return
        plan = self._plan()
        image = self.options.image or (plan.base if plan is not None else self.task_env_config.docker_image)
        if not image or not _valid_image(image):
            raise SandboxBuildFailedError(
                f"{image!r} is not an image name of a sandrl host's store: pull it there (sandrl images pull "
                f"{image}) and pass the name it prints as --ek image=NAME"
            )
        info = await self._client.create(self._spec(image), {"harbor.session": self.session_id[:200]})
        self._sandbox_id = str(info["id"])
        self._workdir = self.task_env_config.workdir
        if plan is not None:
            try:
                await self._apply(plan)
            except BaseException:
                await self.stop(delete=True)
                raise
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    def _plan(self) -> Plan | None:
        dockerfile = self.environment_dir / "Dockerfile"
        if not dockerfile.is_file():
            return None
        try:
            return parse(dockerfile.read_text(), str(dockerfile))
        except (DockerfileError, ImageBuildError) as exc:
            raise SandboxBuildFailedError(str(exc)) from exc

    def _spec(self, image: str) -> dict[str, Any]:
        config = self.task_env_config
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        spec: dict[str, Any] = {
            "image": image,
            "network": self._network_policy.network_mode == NetworkMode.PUBLIC,
            "ttl_s": self.options.ttl_sec,
            "workdir": config.workdir or "/",
            "env": self._startup_env(),
        }
        if cpus:
            spec["cpus"] = float(cpus)
        if memory:
            spec["memory_mb"] = int(memory)
        if config.storage_mb:
            spec["disk_mb"] = int(config.storage_mb)
        return spec

    @override
    async def stop(self, delete: bool) -> None:
        try:
            if self._owned and self._sandbox_id is not None:
                await self._client.delete(self._sandbox_id)  # the TTL reaps it if this fails
                self._sandbox_id = None
        finally:
            await self._client.aclose()

    # -- the Dockerfile, applied in the sandbox

    async def _apply(self, plan: Plan) -> None:
        build_env: dict[str, str] = {}
        workdir = "/"
        shell = ["/bin/sh", "-c"]
        context = self.environment_dir
        for step in plan.steps:
            where = f"{plan.source}:{step.line}: {step_text(step)}"
            try:
                if step.keyword in ("ENV", "ARG"):
                    for name, value in key_values(step, {**build_env, **self._image_env}):
                        if step.keyword == "ENV":
                            self._image_env[name] = value or ""
                        elif name not in build_env and value is not None:
                            build_env[name] = value
                elif step.keyword == "WORKDIR":
                    path = " ".join(words(step.args, {**build_env, **self._image_env}, step.where))
                    workdir = posixpath.join(workdir, path)
                    await self._must(f"mkdir -p {shlex.quote(workdir)}", where, cwd="/")
                elif step.keyword == "USER":
                    user = " ".join(words(step.args, self._image_env, step.where))
                    self._image_user = user.split(":")[0] or None
                elif step.keyword == "SHELL":
                    shell = list(step.exec_form or shell)
                elif step.keyword in ("COPY", "ADD"):
                    await self._copy(step, context, workdir, {**build_env, **self._image_env}, where)
                elif step.keyword == "RUN":
                    command = shlex.join(step.exec_form) if step.exec_form else shlex.join([*shell, step.args])
                    env = {**build_env, **self._image_env}
                    await self._must(self._as_user(command, self._image_user), where, cwd=workdir, env=env)
                elif step.keyword not in SKIPPED:
                    raise SandboxBuildFailedError(f"{where}: {step.keyword} is not applied by the sandrl environment")
            except (DockerfileError, ImageBuildError, SandrlAPIError) as exc:
                raise SandboxBuildFailedError(f"{where}: {exc}") from exc
        self._workdir = self.task_env_config.workdir or workdir

    async def _copy(self, step: Instruction, context: Path, workdir: str, env: dict[str, str], where: str) -> None:
        sources, dest = copy_sources(step, context, env)
        target = posixpath.join(workdir, dest)
        into_dir = dest.endswith("/") or len(sources) > 1 or any(s.is_dir() for s in sources)
        copied: list[str] = []
        for source in sources:
            if source.is_dir():
                names = sorted(p.name for p in source.iterdir())
                await self._client.put_tar(self.sandbox_id, target, _tar([(source / n, n) for n in names]))
                copied += [posixpath.join(target, n) for n in names]
            elif into_dir:
                await self._client.put_tar(self.sandbox_id, target, _tar([(source, source.name)]))
                copied.append(posixpath.join(target, source.name))
            else:
                parent, name = posixpath.split(target.rstrip("/"))
                await self._client.put_tar(self.sandbox_id, parent or "/", _tar([(source, name)]))
                copied.append(target)
        owner = step.flags.get("chown")
        if owner and copied:
            await self._must(f"chown -R {shlex.quote(owner)} -- {shlex.join(copied)}", where, cwd="/")

    async def _must(self, command: str, where: str, *, cwd: str, env: dict[str, str] | None = None) -> None:
        timeout = max(1.0, float(self.task_env_config.build_timeout_sec))
        result = await self._client.exec(self.sandbox_id, command, timeout_s=timeout, cwd=cwd, env=env)
        if result["exit_code"] != 0:
            tail = (result["stderr"] or result["stdout"]).strip()[-1500:]
            raise SandboxBuildFailedError(f"{where}: exited {result['exit_code']}: {tail}")

    # -- commands and files

    @staticmethod
    def _as_user(command: str, user: str | int | None) -> str:
        if user is None or str(user) in ("root", "0"):
            return command
        if isinstance(user, int) or str(user).isdigit():
            return f"setpriv --reuid={user} --regid={user} --clear-groups -- {command}"
        return f"runuser -u {shlex.quote(str(user))} -- {command}"

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        merged = {**self._image_env, **(self._merge_env(env) or {})}
        wrapped = self._as_user(shlex.join(["bash", "-c", command]), user if user is not None else self._image_user)
        timeout = float(timeout_sec) if timeout_sec else DEFAULT_TIMEOUT_SEC
        result = await self._client.exec(
            self.sandbox_id, wrapped, timeout_s=timeout, cwd=cwd or self._workdir, env=merged or None
        )
        if result["timed_out"]:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        callback = self._output_callback()
        if callback is not None:
            for stream in ("stdout", "stderr"):
                if result[stream]:
                    await callback(result[stream], stream)
        return ExecResult(stdout=result["stdout"], stderr=result["stderr"], return_code=result["exit_code"])

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        await self._client.put_file(self.sandbox_id, target_path, source.read_bytes(), source.stat().st_mode)

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory {source_dir} does not exist")
        names = sorted(p.name for p in source.iterdir())
        await self._client.put_tar(self.sandbox_id, target_dir, _tar([(source / n, n) for n in names]))

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(await self._client.get_file(self.sandbox_id, source_path))

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        async for chunk in self._client.get_tar(self.sandbox_id, source_dir):
            buffer.write(chunk)
        buffer.seek(0)
        with tarfile.open(fileobj=buffer, mode="r:*") as archive:
            archive.extractall(target, filter=transfer_tar_filter)


def _valid_image(name: str) -> bool:
    return re.match(_IMAGE_NAME, name) is not None
