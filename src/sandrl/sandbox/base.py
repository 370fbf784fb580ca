"""The sandbox interfaces: what every backend offers and every caller codes against.

A *sandbox* is an isolated Linux environment that lives across many commands (one RL
episode). A *provider* makes sandboxes from a :class:`SandboxSpec`, and says which image an
:class:`ImageSource` (a Dockerfile, or a prebuilt image's name) gives on it. Backends: the local
bubblewrap one (:mod:`sandrl.sandbox.bwrap`), the HTTP client of the sandbox service,
and later a KVM microVM one. Everything above this module sees only these protocols.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Protocol, Self, TypedDict, Unpack, runtime_checkable

from sandrl.errors import (
    ConfigError,
    InvalidSpecError,
    PortForwardingUnsupportedError,
    SandboxFileTooLargeError,
    TaskError,
)
from sandrl.images.reference import parse_reference, store_name
from sandrl.sandbox.command import Command

DEFAULT_OUTPUT_CAP = 1 << 20
"""Bytes kept per output stream of one exec; beyond it output is dropped and ``truncated`` set."""
MAX_READ_BYTES = 64 << 20
"""Default bound of ``read_file`` and ``read_file_stream``. A file in a sandbox may be anything its
processes made it: a link to ``/dev/zero``, a sparse file of 100 GB, one that grows while it is read.
A read stops one byte past its bound and raises :class:`~sandrl.errors.SandboxFileTooLargeError`
when the file has more; callers pass a bound that fits what they read."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
"""What an image name may be: the spec checks it, the HTTP API publishes it."""
WORKDIR_PATTERN = r"^/[^\x00]*$"
"""An absolute path without NUL bytes: the spec checks it, the HTTP API publishes it."""
_IMAGE_NAME = re.compile(IMAGE_NAME_PATTERN)
_WORKDIR = re.compile(WORKDIR_PATTERN)


def validate_env(env: Mapping[str, str], where: str) -> dict[str, str]:
    """Check environment variable names and values; return a plain dict copy."""
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise InvalidSpecError(
                f"{where}: {key!r} is not a valid environment variable name "
                "(use letters, digits and '_', not starting with a digit)"
            )
        if not isinstance(value, str) or "\0" in value:
            raise InvalidSpecError(f"{where}: the value of {key} must be a string without NUL bytes")
        out[key] = value
    return out


@dataclass(frozen=True)
class Bounds:
    """The range of a number in a :class:`SandboxSpec`, stated once beside its field.

    The spec checks it (:meth:`check`); the HTTP API's model of a spec
    (:class:`~sandrl.sandbox.remote.wire.SpecBody`) is built from the same bounds
    (:meth:`constraints`), so the two cannot drift apart.
    """

    low: float
    high: float | None = None
    whole: bool = False
    """An ``int`` (not a bool); otherwise any finite number."""
    above: bool = False
    """``low`` itself is out of range (e.g. a TTL must be more than 0)."""
    unit: str = ""

    def check(self, name: str, value: object) -> None:
        if self.whole:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int | float) and math.isfinite(value)
        if ok:
            assert isinstance(value, int | float)
            ok = (value > self.low if self.above else value >= self.low) and (self.high is None or value <= self.high)
        if not ok:
            raise InvalidSpecError(f"{name} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        unit = f" {self.unit}" if self.unit else ""
        if self.high is not None:
            whole = "a whole number " if self.whole else ""
            return f"{whole}between {_number(self.low)} and {_number(self.high)}{unit}"
        if self.above and self.low == 0:
            return f"a positive {kind.removeprefix('a ')}" + (f" of {self.unit}" if self.unit else "")
        return f"{kind} {'above' if self.above else 'at least'} {_number(self.low)}{unit}"

    def constraints(self) -> dict[str, float | bool]:
        """The same range as pydantic ``Field`` arguments."""
        out: dict[str, float | bool] = {"gt" if self.above else "ge": self.low}
        if self.high is not None:
            out["le"] = self.high
        if not self.whole:
            out["allow_inf_nan"] = False
        return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _bounded(default: float, bounds: Bounds) -> Any:
    return field(default=default, metadata={"bounds": bounds})


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is made of and the limits it runs under.

    Every limit is enforced by the backend; a backend that cannot enforce one refuses to
    create the sandbox (:class:`~sandrl.errors.LimitUnsupportedError`) unless
    ``require_limits`` is False, in which case it warns and runs without that limit.
    The defaults and the :class:`Bounds` of the numbers are stated here only.
    """

    image: str = "host"
    """An image in the store; ``host`` is the host's system directories, read-only."""
    cpus: float = _bounded(1.0, Bounds(0.01, 1024, unit="cores"))
    """CPU quota in cores (a cgroup CFS quota, not a pin)."""
    memory_mb: int = _bounded(2048, Bounds(16, 1 << 22, whole=True))
    """Memory limit; a process that exceeds it is OOM-killed inside the sandbox. The
    writable layer lives in memory too and counts against this limit."""
    pids: int = _bounded(512, Bounds(8, 1 << 22, whole=True))
    """Most processes and threads at once, the sandbox's own supervisor included."""
    disk_mb: int = _bounded(4096, Bounds(1, 1 << 24, whole=True))
    """Size of the writable copy-on-write layer; writes beyond it fail with ENOSPC."""
    network: bool = False
    """Loopback only unless True; True gives egress through NAT from the sandbox's own network namespace
    (never the host's loopback, link-local or private addresses; see ``docs/security.md``)."""
    ttl_s: float = _bounded(3600.0, Bounds(0, above=True, unit="seconds"))
    """The sandbox is killed this long after creation, whatever the client does."""
    workdir: str = "/workspace"
    """Default working directory of every exec; created if missing."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Environment of every exec (a call's ``env`` adds to it)."""
    require_limits: bool = True
    """Fail rather than run without a limit the host cannot enforce."""
    entrypoint: bool = True
    """Start the image's ``ENTRYPOINT`` after create, as the sandbox's long-running process (with
    ``sleep infinity`` as its arguments, as Harbor and Terminal-Bench start task containers), and
    wait until it has handed over to them; images without one are unaffected. Image builds turn
    it off, as ``docker build`` runs no entrypoint."""

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not _IMAGE_NAME.match(self.image):
            raise InvalidSpecError(
                f"image {self.image!r} is not a valid image name "
                "(lower-case letters, digits, '.', '_' and '-'; e.g. 'host')"
            )
        for f in fields(self):
            bounds = f.metadata.get("bounds")
            if bounds is not None:
                bounds.check(f.name, getattr(self, f.name))
        if not isinstance(self.workdir, str) or not _WORKDIR.match(self.workdir):
            raise InvalidSpecError(f"workdir must be an absolute path, got {self.workdir!r}")
        for flag in ("network", "require_limits", "entrypoint"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidSpecError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        object.__setattr__(self, "env", MappingProxyType(validate_env(self.env, "SandboxSpec.env")))

    def to_dict(self) -> dict[str, object]:
        return {f.name: dict(self.env) if f.name == "env" else getattr(self, f.name) for f in fields(self)}


def check_max_bytes(max_bytes: object) -> int:
    """``max_bytes`` of a read, checked: a whole number of bytes, zero or more."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(f"max_bytes must be a whole number of bytes, 0 or more, got {max_bytes!r}")
    return max_bytes


def file_too_large(path: str, sandbox_id: str, max_bytes: int) -> SandboxFileTooLargeError:
    """The error of a read that found more than ``max_bytes`` bytes at ``path``."""
    return SandboxFileTooLargeError(
        f"{path} in sandbox {sandbox_id} is larger than {max_bytes} bytes, the bound of this read (reading "
        f"stopped there); pass a larger max_bytes if the caller can hold it, use read_file_stream to process "
        f"it in chunks, or look at a part of it with exec (e.g. head -c, tail -c, wc -c)"
    )


@dataclass(frozen=True)
class ExecResult:
    """What one command did."""

    exit_code: int
    """The exit status; ``-N`` when killed by signal N; 124 on timeout (as timeout(1))."""
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    """True when either stream exceeded the output cap and was cut."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a running process's output."""

    stream: Literal["stdout", "stderr"]
    data: bytes


class SandboxProcess(Protocol):
    """A command started in a sandbox that the caller can talk to while it runs."""

    pid: int
    """The process id inside the sandbox."""

    def output(self) -> AsyncIterator[OutputChunk]:
        """Output as it arrives (up to the output cap), ending when the process has exited."""
        ...

    async def write_stdin(self, data: bytes) -> None: ...
    async def close_stdin(self) -> None: ...
    async def signal(self, signum: int) -> None:
        """Send a signal to the process and everything it started."""
        ...

    async def wait(self) -> ExecResult:
        """Wait for the exit; the result holds all output not already taken by ``output()``."""
        ...


@dataclass(frozen=True)
class ImageSource:
    """Where the image of some sandboxes comes from: a Dockerfile to build, or a prebuilt image.

    What a task's environment says (``sandrl.tasks`` makes one from a task); a provider turns it
    into an image name (:meth:`SandboxProvider.resolve_image`), so its caller never asks which
    backend it has.
    """

    label: str
    """Whose image it is, for messages: e.g. ``task fix-lru-cache``."""
    name: str | None = None
    """What the image is for (a task's id): an image built from the Dockerfile is named after it,
    ``task-<name>-<hash>``, so a store says whose each image is; None: a cache name, ``build-<hash>``."""
    dockerfile_text: str | None = None
    """The Dockerfile to build; None when there is none."""
    dockerfile: Path | None = None
    """Where the Dockerfile is, for messages and as the default build context."""
    context_dir: Path | None = None
    """The build context; default the Dockerfile's directory."""
    image: str | None = None
    """A prebuilt image: an image of the provider's store by name, or a registry reference
    (``ubuntu:24.04``, ``ghcr.io/org/img@sha256:...``). Used first; the Dockerfile is built
    only when there is no image, or it cannot be had."""
    build_timeout_s: float = 600.0
    """The whole build must finish within this."""
    network: bool = True
    """Whether the build's ``RUN`` steps may use the network (Docker builds have it); not the
    network of the image's sandboxes, which their :class:`SandboxSpec` says."""
    cpus: float = SandboxSpec.cpus
    memory_mb: int = SandboxSpec.memory_mb
    disk_mb: int = SandboxSpec.disk_mb
    """The resources of the image's sandboxes (a sandbox's defaults): a build step gets at least these."""


def prebuilt_image(source: ImageSource) -> str:
    """The image of a provider that builds nothing: ``source``'s prebuilt image (a registry
    reference as the host's store names it: pull it there with ``sandrl images pull``), ``host``
    without one; a Dockerfile is refused with a :class:`~sandrl.errors.TaskError` naming what to do instead."""
    if source.image is not None:
        if _IMAGE_NAME.match(source.image):
            return source.image
        # A registry reference: the name the sandbox host's store gives it once pulled there.
        return store_name(parse_reference(source.image))
    if source.dockerfile_text is None:
        return "host"
    raise TaskError(
        f"{source.label} has a Dockerfile, and this provider cannot build it here: build the image on the "
        "sandbox host (sandrl images build) and pass the runner an image_for that names it"
    )


class ExecOptions(TypedDict, total=False):
    """The options of :meth:`Sandbox.exec`, by keyword; the defaults are :class:`ExecCall`'s."""

    timeout_s: float
    cwd: str | None
    env: Mapping[str, str] | None
    stdin: bytes | None


@dataclass(frozen=True, slots=True)
class ExecCall:
    """One :meth:`Sandbox.exec`: the command and its options, as :class:`SandboxBase` hands them to a
    backend's ``_exec``. The one statement of exec's options and their defaults."""

    command: Command
    timeout_s: float = 60
    """Seconds it may run; then it is killed, and the result is ``timed_out`` with exit code 124."""
    cwd: str | None = None
    """Where it runs; the spec's ``workdir`` by default."""
    env: Mapping[str, str] | None = None
    """Added to the spec's environment."""
    stdin: bytes | None = None
    """Fed to its standard input, which is then closed; an empty one when None."""

    async def run_in(self, sandbox: Sandbox) -> ExecResult:
        """The same call on ``sandbox`` (a wrapper hands its calls on with this)."""
        return await sandbox.exec(self.command, timeout_s=self.timeout_s, cwd=self.cwd, env=self.env, stdin=self.stdin)


@runtime_checkable
class Sandbox(Protocol):
    """One live sandbox. Commands run as root inside, in a persistent filesystem."""

    id: str

    async def exec(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """Run ``command`` to its end: a string by the shell, a list of strings as an argv with no shell
        (:mod:`sandrl.sandbox.command`). A bad command raises :class:`~sandrl.errors.InvalidCommandError`.
        The options and their defaults are :class:`ExecCall`'s: ``timeout_s`` (60), ``cwd``, ``env``, ``stdin``."""
        ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The file's bytes. A file larger than ``max_bytes`` raises
        :class:`~sandrl.errors.SandboxFileTooLargeError` after at most ``max_bytes + 1`` bytes were read."""
        ...

    async def close(self) -> None:
        """Kill everything inside and free every resource; idempotent."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class Pausable(Protocol):
    """A sandbox that can stop all its processes and its TTL clock, and go on later."""

    @property
    def paused(self) -> bool: ...

    async def pause(self) -> None:
        """Freeze every process (no CPU) and stop the TTL clock; commands and file calls are refused."""
        ...

    async def resume(self) -> None:
        """Thaw; the TTL goes on from where it stopped."""
        ...


@runtime_checkable
class Snapshottable(Protocol):
    """A sandbox whose filesystem can be captured as an image, and forked into new sandboxes."""

    async def snapshot(self, name: str | None = None) -> str:
        """An image of the sandbox's files as they are now (processes are not in it); its name."""
        ...

    async def fork(self, n: int) -> list[Sandbox]:
        """``n`` new sandboxes starting from the sandbox's current files, each with its limits; the
        sandbox itself keeps running."""
        ...


@runtime_checkable
class ForwardedPort(Protocol):
    """A host service reachable from inside one sandbox (:meth:`PortForwarding.forward_port`)."""

    port: int
    """The port listened on in the sandbox: ``http://127.0.0.1:<port>`` there reaches the target."""
    tag: str
    """What the host sees of the sandbox (its id): :func:`sandrl.peer_tags.tag_of_peer` of a
    connection relayed through this forward."""

    async def close(self) -> None:
        """Stop listening and end every relayed connection; idempotent (closing the sandbox does it too)."""
        ...


@runtime_checkable
class PortForwarding(Protocol):
    """A sandbox that can be given one service of the host, and nothing else of the host's network:
    what a program inside (a CLI agent) uses to reach the session gateway."""

    async def forward_port(self, port: int, target: tuple[str, int]) -> ForwardedPort:
        """Listen on ``127.0.0.1:port`` in the sandbox's own network namespace and relay each
        connection to ``target``, a loopback address of the host, until the forward or the sandbox
        closes; see :mod:`sandrl.sandbox.forwarding` for its bounds."""
        ...


@runtime_checkable
class PortForwardingProvider(Protocol):
    """A provider that says, before it has made any sandbox, whether its sandboxes are
    :class:`PortForwarding`; a wrapping provider answers for what it wraps."""

    @property
    def port_forwarding(self) -> bool: ...


_NO_FORWARDING = (
    "only the local bubblewrap backend can forward a host port into its sandboxes ([rollout] sandboxes = "
    '"local"); the sandbox service and E2B run sandboxes on another machine, where this run\'s gateway is not'
)


def require_port_forwarding(provider: object, what: str) -> None:
    """Refuse, before any episode, a plan in which ``what`` (e.g. ``the claude-code agent``) runs inside
    a sandbox of ``provider`` and needs a host service forwarded into it that it cannot have."""
    if not (isinstance(provider, PortForwardingProvider) and provider.port_forwarding):
        raise PortForwardingUnsupportedError(
            f"{what} runs inside the sandbox and reaches the gateway through a port forwarded into it, and this "
            f"provider ({type(provider).__name__}) cannot forward one: {_NO_FORWARDING}"
        )


async def forward_port(sandbox: Sandbox, port: int, target: tuple[str, int]) -> ForwardedPort:
    """``sandbox``'s :meth:`PortForwarding.forward_port`, or a
    :class:`~sandrl.errors.PortForwardingUnsupportedError` naming the fix when its backend has none."""
    if not isinstance(sandbox, PortForwarding):
        raise PortForwardingUnsupportedError(
            f"sandbox {sandbox.id} ({type(sandbox).__name__}) cannot have a host port forwarded into it: "
            f"{_NO_FORWARDING}"
        )
    return await sandbox.forward_port(port, target)


FORK_IMAGE_PREFIX = "fork-"
"""Names of images made only to start forks from: nothing but the forks uses them, and a provider
removes them once no sandbox does (``sandrl images prune`` removes any a crash left)."""


@runtime_checkable
class SnapshotProvider(Protocol):
    """A provider that says, before it has made any sandbox, whether its sandboxes are
    :class:`Snapshottable`, and removes the images their snapshots made.

    A plan that needs forks (GRPO groups from one prepared sandbox) asks at its start
    (:func:`snapshots_of`), so a backend that cannot fork fails there, not in every episode. A
    wrapping provider answers for what it wraps."""

    @property
    def snapshots(self) -> bool:
        """Whether this provider's sandboxes can be snapshotted and forked."""
        ...

    async def remove_image(self, name: str) -> None:
        """Remove an image a snapshot made, and the files only it held; once no sandbox runs on it."""
        ...


@runtime_checkable
class TreeLayering(Protocol):
    """A provider that lays a directory tree of this machine over one of its images without a build: the
    tree becomes one layer, kept once per ``key`` and shared by every image it tops (a CLI agent's files
    over each task's image, :mod:`sandrl.rollout.agents.cli.install`)."""

    async def layer_tree(self, base: str, tree: Path, *, key: str, name: str) -> str:
        """The image ``base`` with ``tree``'s contents over its root (made now unless it exists), named
        ``<name>-<hash>``; the same ``key`` must always mean the same files."""
        ...


def require_tree_layering(provider: object, what: str) -> None:
    """Refuse, before any episode, a plan in which ``what`` needs its files laid over the task's images by
    a provider that cannot (the sandbox service, E2B: their images are where their sandboxes run)."""
    if not isinstance(provider, TreeLayering):
        raise ConfigError(
            f"{what} is laid over each task's image by the provider that runs the sandboxes, and this provider "
            f"({type(provider).__name__}) cannot: run it with the local bubblewrap sandboxes ([rollout] sandboxes "
            '= "local")'
        )


def snapshots_of(provider: object) -> bool:
    """Whether ``provider``'s sandboxes are :class:`Snapshottable` (False for a provider that does not say)."""
    return isinstance(provider, SnapshotProvider) and bool(provider.snapshots)


class ClosesOnExit:
    """``async with`` for a sandbox: closes it on the way out, even when the block is cancelled,
    so that no sandbox outlives the block that made it. A base for sandbox classes, which define
    :meth:`close`."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self.close())


class SandboxBase(ClosesOnExit):
    """The base of sandrl's sandbox classes: ``async with`` (:class:`ClosesOnExit`), and
    :meth:`Sandbox.exec` made one :class:`ExecCall` for the backend's :meth:`_exec`."""

    async def exec(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """:meth:`Sandbox.exec` (the options: :class:`ExecCall`)."""
        return await self._exec(ExecCall(command, **options))

    async def _exec(self, call: ExecCall) -> ExecResult:
        """Run ``call`` to its end: what a backend implements."""
        raise NotImplementedError


@runtime_checkable
class SandboxProvider(Protocol):
    """Makes sandboxes, from images it can name."""

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def resolve_image(self, source: ImageSource) -> str:
        """The name of the image ``source`` gives on this provider, for :attr:`SandboxSpec.image`:
        built from its Dockerfile by a provider that builds (a cache hit when unchanged), else its
        prebuilt image (see :func:`prebuilt_image`). Raises :class:`~sandrl.errors.ImageBuildError`
        when a build fails, :class:`~sandrl.errors.TaskError` when the provider cannot build one."""
        ...


FetchHow = Literal["cached", "pulled", "built", "host", "named"]
"""How a provider came by an image: in its store already, pulled from a registry, built from a
Dockerfile (some steps ran), the built-in ``host`` image (nothing to fetch), or named by a provider
with no store here (not an :class:`ImageFetcher`: its host fetches the image when a sandbox needs it)."""


@dataclass(frozen=True)
class FetchedImage:
    """An image a provider has in its store now (:meth:`ImageFetcher.fetch_image`)."""

    name: str
    """As :meth:`SandboxProvider.resolve_image` answers it."""
    how: FetchHow
    downloaded_bytes: int = 0
    """Bytes that came from a registry for it (layers the store had are not fetched)."""


@runtime_checkable
class ImageFetcher(Protocol):
    """A provider whose images live in a store on this machine, fetched into it ahead of the
    sandboxes that start from them (``sandrl images prefetch``). A provider without a store of its
    own (a remote service, E2B) is not one: its images are fetched where its sandboxes run."""

    async def fetch_image(self, source: ImageSource, *, on_bytes: Callable[[int], None] | None = None) -> FetchedImage:
        """What :meth:`SandboxProvider.resolve_image` does (it calls this), saying how it went;
        ``on_bytes`` hears each chunk of a download, by its size."""
        ...

    def cached_image(self, source: ImageSource) -> str | None:
        """The image ``source`` gives when the store has it already (no network, no build); else
        None, also when only a build could tell (a Dockerfile's cache hit)."""
        ...

    def store_bytes(self) -> int:
        """The disk the store takes (its layers, whatever images share, counted once). Blocking:
        the first call walks every layer; later ones only the layers new since."""
        ...
