"""Environment images without Docker: a Dockerfile subset built in sandboxes, layer by layer.

::

    builder = ImageBuilder(BwrapProvider())
    result = await builder.build(Path("environment/Dockerfile"), context=Path("environment"))
    spec = SandboxSpec(image=result.image)

Supported: ``FROM`` (an image of the store: ``host``, one built before, ``debian`` made by
``sandrl images build debian`` for the ``debian:bookworm`` family; anything else is a registry
reference, pulled on first use and cached by digest, :mod:`sandrl.sandbox.bwrap.pulled`;
``--platform`` chooses the platform), ``RUN``, ``COPY`` and ``ADD`` of build-context files
(``ADD`` unpacks local tar archives; URLs are refused), ``WORKDIR``, ``ENV``, ``ARG``, ``USER``,
``SHELL``; ``ENTRYPOINT``, ``CMD``, ``EXPOSE`` and ``HEALTHCHECK`` go into the image's config as
Docker's do (a sandbox of the image starts its ``ENTRYPOINT``, :mod:`sandrl.sandbox.entrypoint`),
and ``LABEL``, ``VOLUME``, ``STOPSIGNAL``, ``MAINTAINER`` and ``ONBUILD`` are kept as metadata.
Anything else (multi-stage builds, ``COPY --from``, ``RUN --mount``, heredocs) is an
:class:`~sandrl.errors.ImageBuildError` naming the file and line.

Each ``RUN``, ``COPY`` and ``ADD`` runs in a fresh build sandbox started from the image so far
(with the network, as Docker builds have it, unless the build turns it off or ``RUN
--network=none``: through slirp4netns, :mod:`sandrl.sandbox.bwrap.nat`, so out to the world but
not to the host or its private network); what the step changed is exported
(:func:`sandrl.sandbox.bwrap.export.export_changes`) as a read-only layer, and the image so far plus
that layer is registered in the store as ``build-<key>`` (a task's finished image as
``task-<task id>-<key>``, :mod:`.names`: the store says whose each image is). The key hashes the
parent's key, the instruction and the state it runs in (environment, working directory, user,
shell) and, for ``COPY``/``ADD``, the content of the files copied: as Docker's layer cache, a
rebuild with nothing changed starts no sandbox at all, and a changed ``COPY`` source rebuilds
that step and every one after it. ``USER`` applies to ``RUN`` (through ``setpriv``); the sandboxes of the
finished image still run every command as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from sandrl.errors import ConfigError, ImageBuildError, ImageError, ImageNotFoundError, LayerTooLargeError
from sandrl.images.dockerfile import Instruction, expand, key_values, parse_dockerfile, words
from sandrl.images.manifest import Platform
from sandrl.sandbox.base import ExecResult, SandboxSpec
from sandrl.sandbox.bwrap.dockerfile.context_copy import (
    copy_args,
    has_glob,
    is_archive,
    match,
    mode_of,
    owner_of,
    sources_digest,
    tar_of,
)
from sandrl.sandbox.bwrap.dockerfile.names import image_name_for, task_image_name
from sandrl.sandbox.bwrap.dockerfile.runtime import RUNTIME_KEYS, runtime_step
from sandrl.sandbox.bwrap.export import export_changes, is_empty_layer
from sandrl.sandbox.bwrap.images import HOST_IMAGE, ImageStore
from sandrl.sandbox.bwrap.nat import RESOLV_CONF
from sandrl.sandbox.bwrap.pulled import pull_into_store
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox

CACHE_VERSION = "sandrl-build-1"
"""Part of every cache key: bump it when the way a step is built changes."""
MAX_BUILD_LAYERS = 120
"""Layers one image may have, its base's included (the sandbox helper mounts at most 128 in all;
Docker allows 127)."""
DEFAULT_SHELL = ("/bin/sh", "-c")
METADATA_ONLY = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "MAINTAINER", "ONBUILD"}
_DEBIAN_ALIASES = {"debian", "debian:bookworm", "debian:12", "debian:bookworm-slim", "debian:12-slim", "debian:stable"}
_TAIL_LINES = 25
BUILD_HINT = "make the step write less, or give the build more disk (BuildOptions.disk_mb: a task's storage_mb)"

StepStatus = Literal["cached", "built", "metadata"]


@dataclass(frozen=True)
class BuildOptions:
    """How a build runs: its budget, the build sandboxes' limits, and build arguments."""

    timeout_s: float = 600.0
    """The whole build (every step) must finish within this; Harbor's ``build_timeout_sec``."""
    network: bool = True
    """Give ``RUN`` steps the network, as Docker builds have it (through slirp4netns, never the host's
    own network, :mod:`sandrl.sandbox.bwrap.nat`; ``RUN --network=none`` turns it off for one step).
    Independent of the network of the image's sandboxes."""
    platform: str | None = None
    """The platform of registry images ``FROM`` names (``linux/arm64``...); default this host's."""
    cpus: float = float(min(2, os.cpu_count() or 1))
    memory_mb: int = 4096
    """Memory of a build sandbox; its writable layer (the step's changes) counts against it."""
    disk_mb: int = 4096
    """Size of a build sandbox's writable layer."""
    build_args: Mapping[str, str] = field(default_factory=dict)
    """Values for ``ARG`` (as ``docker build --build-arg``)."""
    use_cache: bool = True
    """False rebuilds every step (and refreshes the cache)."""


@dataclass(frozen=True)
class StepEvent:
    """Progress of a build, one event as a step starts and one as it ends."""

    index: int
    """1-based."""
    total: int
    instruction: Instruction
    phase: Literal["start", "done"]
    status: StepStatus | None = None
    duration_s: float = 0.0


@dataclass(frozen=True)
class BuildResult:
    image: str
    """The built image's name in the store (the tag asked for, ``task-<task>-<key>``, or ``build-<key>``)."""
    key: str
    steps: int
    cached: int
    """Steps that were cache hits."""
    built: int
    """Steps that ran in a sandbox."""
    duration_s: float
    env: Mapping[str, str]
    workdir: str | None
    user: str | None


@dataclass
class _State:
    """What a Dockerfile has set up to the current step."""

    key: str
    image: str
    """The store image the next sandbox step starts from."""
    base: str | None
    """The image the layers are stacked on (``host``), or None when ``layers`` are a whole rootfs."""
    layers: list[str]
    """The image's own layer ids, topmost first."""
    env: dict[str, str]
    workdir: str | None = None
    user: str | None = None
    shell: tuple[str, ...] = DEFAULT_SHELL
    args: dict[str, str] = field(default_factory=dict)
    declared_args: set[str] = field(default_factory=set)
    metadata: dict[str, object] = field(default_factory=dict)
    runtime: dict[str, object] = field(default_factory=dict)
    """ENTRYPOINT, CMD, EXPOSE, HEALTHCHECK as the image's config will hold them (:data:`RUNTIME_KEYS`)."""

    def expansion_env(self) -> dict[str, str]:
        return {**self.args, **self.env}


_KEY_LOCKS: dict[str, asyncio.Lock] = {}


def _lock(key: str) -> asyncio.Lock:
    return _KEY_LOCKS.setdefault(key, asyncio.Lock())


def _hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class BuildHost(Protocol):
    """What a build needs of its provider (a :class:`~sandrl.sandbox.bwrap.provider.BwrapProvider`):
    its image store, and sandboxes started from the store's images. A protocol, so that the
    provider can build (its ``resolve_image``) without this module importing it."""

    images: ImageStore

    async def create(self, spec: SandboxSpec) -> BwrapSandbox: ...


class ImageBuilder:
    """Builds Dockerfiles into images of ``provider``'s store, in ``provider``'s sandboxes."""

    def __init__(self, provider: BuildHost, *, on_event: Callable[[StepEvent], None] | None = None) -> None:
        self.provider = provider
        self.store: ImageStore = provider.images
        self.on_event = on_event

    async def build(
        self,
        dockerfile: Path | None = None,
        *,
        context: Path | None = None,
        text: str | None = None,
        options: BuildOptions | None = None,
        tag: str | None = None,
        task: str | None = None,
    ) -> BuildResult:
        """Build ``dockerfile`` (or ``text``) with ``context`` (default: the Dockerfile's directory) into
        the image ``tag``, else one named after ``task`` (the task's id, :mod:`.names`), else ``build-<key>``."""
        options = options or BuildOptions()
        if text is None:
            if dockerfile is None:
                raise ImageBuildError("give a Dockerfile path or its text")
            try:
                text = dockerfile.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ImageBuildError(f"{dockerfile}: cannot be read ({exc})") from exc
        source = str(dockerfile) if dockerfile is not None else "Dockerfile"
        if context is None:
            context = dockerfile.parent if dockerfile is not None else Path.cwd()
        if not context.is_dir():
            raise ImageBuildError(f"{source}: the build context {context} is not a directory")
        instructions = parse_dockerfile(text, source)
        self._check_supported(instructions, source)
        start = time.monotonic()
        deadline = start + options.timeout_s
        try:
            return await asyncio.wait_for(
                self._run(instructions, context.resolve(), options, tag, task, deadline, start), options.timeout_s
            )
        except TimeoutError:
            raise ImageBuildError(
                f"{source}: the build did not finish within {options.timeout_s:g} s (build_timeout_sec); "
                "raise the timeout or make the slow RUN step faster"
            ) from None

    # -- checking

    def _check_supported(self, instructions: list[Instruction], source: str) -> None:
        if heredoc := next((inst for inst in instructions if inst.heredocs), None):
            raise heredoc.error(
                "heredocs (<<EOF) are not supported by sandrl's builder; put the script in a file and COPY it"
            )
        froms = [inst for inst in instructions if inst.keyword == "FROM"]
        if not froms:
            raise ImageBuildError(f"{source}: has no FROM instruction; start with FROM host")
        if len(froms) > 1:
            raise froms[1].error("multi-stage builds (a second FROM) are not supported by sandrl's builder")
        for inst in instructions:
            if inst.keyword == "FROM":
                break
            if inst.keyword != "ARG":
                raise inst.error("only ARG may come before FROM")
        known = {"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "SHELL", *METADATA_ONLY}
        for inst in instructions:
            if inst.keyword not in known:
                raise inst.error(
                    "is not an instruction sandrl's builder supports (FROM, RUN, COPY, ADD, WORKDIR, ENV, "
                    "ARG, USER, SHELL; CMD, ENTRYPOINT, EXPOSE, LABEL, VOLUME... are kept as metadata)"
                )
            allowed = {
                "FROM": {"platform"},
                "HEALTHCHECK": {"interval", "timeout", "start-period", "start-interval", "retries"},
                "RUN": {"network"},
                "COPY": {"chown", "chmod", "link"},
                "ADD": {"chown", "chmod", "link"},
            }
            for flag in inst.flags:
                if inst.keyword in ("COPY", "ADD") and flag == "from":
                    raise inst.error("--from (copying from another stage or image) is not supported")
                if flag not in allowed.get(inst.keyword, set()):
                    raise inst.error(f"the option --{flag} is not supported by sandrl's builder")
            if inst.keyword == "RUN" and inst.flags.get("network", "none") not in ("none", "default", "host"):
                raise inst.error(f"--network={inst.flags['network']} is not supported (none, default or host)")

    # -- running

    async def _run(
        self,
        instructions: list[Instruction],
        context: Path,
        options: BuildOptions,
        tag: str | None,
        task: str | None,
        deadline: float,
        start: float,
    ) -> BuildResult:
        global_args: dict[str, str] = {}
        state: _State | None = None
        cached = built = 0
        total = len(instructions)
        for index, inst in enumerate(instructions, 1):
            self._emit(StepEvent(index, total, inst, "start"))
            step_start = time.monotonic()
            status: StepStatus = "metadata"
            if state is None:
                if inst.keyword == "ARG":
                    for name, value in key_values(inst, global_args):
                        given = options.build_args.get(name, value)
                        if given is not None:
                            global_args[name] = given
                else:
                    state = await self._from(inst, global_args, options)
            elif inst.keyword in ("RUN", "COPY", "ADD"):
                try:
                    status = await self._layer_step(inst, state, context, options, deadline, index, total)
                except LayerTooLargeError as exc:
                    raise ImageBuildError(f"step {index}/{total} ({inst.where}) `{_short(inst.text)}`: {exc}") from exc
                cached += status == "cached"
                built += status == "built"
            else:
                self._metadata_step(inst, state, options, global_args)
            self._emit(StepEvent(index, total, inst, "done", status, time.monotonic() - step_start))
        assert state is not None  # _check_supported saw a FROM
        final_key = _hash(state.key, "final", state.env, state.workdir, state.user, state.metadata, state.runtime)
        name = tag or (task_image_name(task, final_key) if task is not None else image_name_for(final_key))
        config: dict[str, object] = {"key": final_key, "user": state.user, "shell": list(state.shell)}
        if task is not None:
            config["task"] = task
        config.update(state.metadata)
        config.update(state.runtime)
        self.store.add_image(
            name, list(state.layers), env=state.env, workdir=state.workdir, base=state.base, config=config
        )
        return BuildResult(
            image=name,
            key=final_key,
            steps=total,
            cached=cached,
            built=built,
            duration_s=time.monotonic() - start,
            env=dict(state.env),
            workdir=state.workdir,
            user=state.user,
        )

    def _emit(self, event: StepEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def _from(self, inst: Instruction, global_args: dict[str, str], options: BuildOptions) -> _State:
        parts = words(inst.args, global_args, inst.where)
        if not parts or (len(parts) not in (1, 3)) or (len(parts) == 3 and parts[1].lower() != "as"):
            raise inst.error("write FROM <image> [AS <name>]")
        platform_text = expand(inst.flags["platform"], global_args, inst.where) if "platform" in inst.flags else None
        name = await self._base_image(inst, parts[0], platform_text or options.platform)
        meta = self.store.meta(name)
        image = self.store.get(name)
        if name == HOST_IMAGE:
            host_layers = [str(p) for p in image.plan.layers]
            return _State(
                key=_hash(CACHE_VERSION, "from-host", host_layers),
                image=name,
                base=HOST_IMAGE,
                layers=[],
                env=dict(image.env),
                workdir=image.workdir,
            )
        raw_layers = meta.get("layers", [])
        layers = [str(x) for x in raw_layers] if isinstance(raw_layers, list) else []
        base = meta.get("base")
        config = meta.get("config")
        runtime = {k: config[k] for k in RUNTIME_KEYS if config.get(k)} if isinstance(config, dict) else {}
        user = config.get("user") if isinstance(config, dict) else None
        key = _hash(CACHE_VERSION, "from", name, layers, base, meta.get("created"))
        return _State(
            key=key,
            image=name,
            base=str(base) if base is not None else None,
            layers=layers,
            env=dict(image.env),
            workdir=image.workdir,
            user=str(user) if isinstance(user, str) and user else None,
            runtime=runtime,
        )

    async def _base_image(self, inst: Instruction, wanted: str, platform_text: str | None) -> str:
        """The store image ``FROM wanted`` starts from: an image of the store by name, the local
        ``debian`` for the Debian family, else the registry image (pulled once, then cached)."""
        if wanted.lower() == "scratch":
            raise inst.error("FROM scratch is not supported: start from an image with a shell")
        if platform_text is None and self.store.exists(wanted):
            return wanted
        if platform_text is None and wanted.lower() in _DEBIAN_ALIASES and self.store.exists("debian"):
            return "debian"
        try:
            platform = Platform.parse(platform_text) if platform_text else None
            return await pull_into_store(self.store, wanted, platform=platform)
        except ConfigError as exc:
            raise inst.error(f"{wanted!r} is not an image of the store nor a registry reference ({exc})") from exc
        except ImageError as exc:
            raise inst.error(f"cannot pull {wanted!r}: {exc}") from exc

    def _metadata_step(
        self, inst: Instruction, state: _State, options: BuildOptions, global_args: Mapping[str, str]
    ) -> None:
        env = state.expansion_env()
        if inst.keyword == "ENV":
            for name, value in key_values(inst, env):
                if value is None:
                    raise inst.error(f"{name} needs a value (ENV {name}=value)")
                state.env[name] = value
        elif inst.keyword == "ARG":
            for name, value in key_values(inst, env):
                state.declared_args.add(name)
                given = options.build_args.get(name, value if value is not None else global_args.get(name))
                if given is not None:
                    state.args[name] = given
        elif inst.keyword == "WORKDIR":
            path = " ".join(words(inst.args, env, inst.where))
            if not path:
                raise inst.error("needs a directory")
            base = state.workdir or "/"
            state.workdir = posixpath.normpath(posixpath.join(base, path))
        elif inst.keyword == "USER":
            user = " ".join(words(inst.args, env, inst.where))
            if not user or " " in user:
                raise inst.error("write USER <user>[:<group>]")
            state.user = user
        elif inst.keyword == "SHELL":
            if inst.exec_form is None or not inst.exec_form:
                raise inst.error('must be a JSON array, e.g. SHELL ["/bin/bash", "-c"]')
            state.shell = inst.exec_form
        elif inst.keyword in ("ENTRYPOINT", "CMD", "EXPOSE", "HEALTHCHECK"):
            runtime_step(inst, state.runtime, state.shell, env)
        else:  # LABEL, VOLUME, STOPSIGNAL...: recorded, not acted on
            recorded: object = list(inst.exec_form) if inst.exec_form is not None else inst.args
            ignored = state.metadata.setdefault("ignored", [])
            assert isinstance(ignored, list)
            ignored.append({"instruction": inst.keyword, "value": recorded, "line": inst.line})
        # ARG values count only where they are used (as Docker): in RUN's environment, in
        # what ENV, WORKDIR, USER and COPY expand to; not in the ARG line itself.
        state.key = _hash(state.key, inst.keyword, inst.flags, inst.args, state.env, state.workdir, state.user)

    async def _layer_step(
        self,
        inst: Instruction,
        state: _State,
        context: Path,
        options: BuildOptions,
        deadline: float,
        index: int,
        total: int,
    ) -> StepStatus:
        env = state.expansion_env()
        network = options.network and inst.flags.get("network", "default") != "none"
        if inst.keyword == "RUN":
            content: object = None
            args: object = state.args
        else:
            content = sources_digest(inst, context, env, options.disk_mb << 20)
            args = [copy_args(inst, env), {k: expand(v, env, inst.where) for k, v in inst.flags.items()}]
        key = _hash(
            state.key,
            inst.keyword,
            inst.flags,
            inst.args,
            content,
            state.env,
            args,
            state.workdir,
            state.user,
            list(state.shell),
            network,
        )
        name = image_name_for(key)
        async with _lock(key):
            if options.use_cache and self.store.exists(name):
                with contextlib.suppress(ImageNotFoundError):
                    self.store.get(name)  # a hit only when every layer is still there
                    cached_layers = self.store.meta(name).get("layers", [])
                    if isinstance(cached_layers, list):
                        state.layers = [str(x) for x in cached_layers]
                        state.key, state.image = key, name
                        return "cached"
            if len(state.layers) >= MAX_BUILD_LAYERS:
                raise inst.error(
                    f"the image would have more than {MAX_BUILD_LAYERS} layers; join RUN steps with && "
                    "or COPY a whole directory at once"
                )
            remaining = deadline - time.monotonic()
            spec = SandboxSpec(
                image=state.image,
                cpus=options.cpus,
                memory_mb=options.memory_mb,
                disk_mb=options.disk_mb,
                network=network,
                ttl_s=max(remaining, 1.0) + 120.0,
                workdir=state.workdir or "/",
                env={k: v for k, v in env.items() if _valid_env_name(k)},
                entrypoint=False,
            )
            layer_dir = self.store.root / "layers" / f".build-{uuid.uuid4().hex}"
            try:
                sandbox = await self.provider.create(spec)
                try:
                    if inst.keyword == "RUN":
                        await self._run_step(inst, state, sandbox, remaining, index, total)
                    else:
                        await self._copy_step(inst, state, sandbox, context, env)
                    skip = RESOLV_CONF if network else frozenset()
                    await export_changes(sandbox, layer_dir, skip=skip, reserve=self.store.reserve, hint=BUILD_HINT)
                finally:
                    await sandbox.close()
                layers = list(state.layers)
                if not is_empty_layer(layer_dir):
                    layers.insert(0, self.store.add_layer(layer_dir, move=True))
                self.store.add_image(
                    name,
                    layers,
                    env=state.env,
                    workdir=state.workdir,
                    base=state.base,
                    config={"key": key, "step": inst.text, "where": inst.where},
                )
            finally:
                shutil.rmtree(layer_dir, ignore_errors=True)
        state.layers, state.key, state.image = layers, key, name
        return "built"

    async def _run_step(
        self, inst: Instruction, state: _State, sandbox: BwrapSandbox, remaining: float, index: int, total: int
    ) -> None:
        if inst.exec_form is not None:
            if not inst.exec_form:
                raise inst.error("the JSON array is empty")
            command = shlex.join(inst.exec_form)
        elif not inst.args:
            raise inst.error("needs a command")
        elif state.shell == DEFAULT_SHELL:
            command = inst.args
        else:
            command = shlex.join([*state.shell, inst.args])
        if state.user not in (None, "root", "0", "root:root", "0:0"):
            command = _as_user(state.user or "", command)
        result: ExecResult = await sandbox.exec(command, timeout_s=max(remaining, 1.0), cwd=state.workdir or "/")
        if result.timed_out:
            raise ImageBuildError(
                f"step {index}/{total} ({inst.where}) `{_short(inst.text)}` did not finish within the build's "
                f"time budget{_tail(result)}"
            )
        if result.exit_code != 0:
            raise ImageBuildError(
                f"step {index}/{total} ({inst.where}) `{_short(inst.text)}` failed with exit code "
                f"{result.exit_code}{_tail(result)}"
            )

    async def _copy_step(
        self, inst: Instruction, state: _State, sandbox: BwrapSandbox, context: Path, env: Mapping[str, str]
    ) -> None:
        sources, dest = copy_args(inst, env)
        workdir = state.workdir or "/"
        dest_abs = posixpath.normpath(posixpath.join(workdir, dest))
        matched = [path for pattern in sources for path in match(inst, context, pattern)]
        into_dir = dest.endswith("/") or len(matched) > 1 or any(has_glob(p) for p in sources)
        if not into_dir and matched[0].is_file() and not is_archive(inst, matched[0]):
            probe = await sandbox.exec(f"test -d {shlex.quote(dest_abs)}", timeout_s=30, cwd="/")
            into_dir = probe.exit_code == 0
        owner = await owner_of(inst, sandbox, env)
        mode = mode_of(inst, env)
        archive = tar_of(inst, matched, posixpath.basename(dest_abs), into_dir, owner, mode, sandbox.spec.disk_mb << 20)
        extract_at = (
            dest_abs
            if into_dir or matched[0].is_dir() or is_archive(inst, matched[0])
            else (posixpath.dirname(dest_abs) or "/")
        )
        quoted = shlex.quote(extract_at)
        result = await sandbox.exec(
            f"mkdir -p {quoted} && tar --numeric-owner -xpf - -C {quoted}",
            stdin=archive,
            timeout_s=300,
            cwd="/",
        )
        if result.exit_code != 0:
            raise inst.error(f"writing the files to {extract_at} failed (exit {result.exit_code}){_tail(result)}")


# -- helpers


def _valid_env_name(name: str) -> bool:
    return name.replace("_", "a").isalnum() and not name[0].isdigit()


def _as_user(user: str, command: str) -> str:
    """``command`` run as ``user[:group]`` by setpriv (util-linux), which the image must have."""
    name, _, group = user.partition(":")
    uid = name if name.isdigit() else f"$(id -u {shlex.quote(name)})"
    if group:
        gid = group if group.isdigit() else f"$(getent group {shlex.quote(group)} | cut -d: -f3)"
    else:
        gid = name if name.isdigit() else f"$(id -g {shlex.quote(name)})"
    groups = "--clear-groups" if name.isdigit() else "--init-groups"
    return f"exec setpriv --reuid={uid} --regid={gid} {groups} -- /bin/sh -c {shlex.quote(command)}"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(result: ExecResult) -> str:
    lines = (result.stdout + ("\n" if result.stdout and result.stderr else "") + result.stderr).strip().splitlines()
    if not lines:
        return " and printed nothing"
    return ":\n" + "\n".join("  " + line for line in lines[-_TAIL_LINES:])
