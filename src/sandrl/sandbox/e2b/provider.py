"""E2BProvider: sandboxes of any E2B-compatible service, through the official ``e2b`` SDK.

sandrl's rollouts then run on E2B itself, on another sandrl host (``sandrl serve sandboxes``
speaks E2B's API), or on any service that speaks it, configured as the SDK is configured:
``E2B_API_KEY``, and ``E2B_DOMAIN`` or ``E2B_API_URL`` + ``E2B_SANDBOX_URL``::

    async with E2BProvider() as provider:                       # E2B_* from the environment
        async with await provider.create(SandboxSpec(image="base", ttl_s=900)) as sandbox:
            print((await sandbox.exec("uname -a")).stdout)

What it does on top of the SDK, because a rollout needs it:

- **Images are templates** (:mod:`sandrl.sandbox.e2b.templates`): ``resolve_image`` names the template
  of a task's image; the service must hold it, else the create fails with
  :class:`~sandrl.errors.ImageNotFoundError` saying how to make it.
- **Creates are bounded and retried**: at most ``create_concurrency`` in flight (bursts are what
  hosted services refuse first); a create refused as full or rate-limited, or failing on the
  connection, is retried with exponential backoff and jitter, ``create_retries`` times.
- **Nothing outlives a crash**: every sandbox is created with its spec's TTL as E2B's
  ``timeout``, after which the service kills it whatever the client does; ``aclose`` kills the
  ones this provider made and still holds, and any whose create answer was lost (found by label).
- **Failures are typed** (:mod:`sandrl.sandbox.e2b.errors`): the service's failures are
  :class:`~sandrl.errors.SandboxError` s, so an episode ends ``infra_error``, never reward 0.

What E2B's API does not carry: a template fixes the CPU, memory and disk of its sandboxes, so a
spec's ``cpus``, ``memory_mb``, ``disk_mb`` and ``pids`` are not sent (choose the template for them);
``network`` is ``allow_internet_access``; the image's entrypoint is the template's start command.
Commands run as root with bash (``bash -l -c``, as the SDK runs every command), in the spec's
``workdir`` (made at create) unless ``cwd`` says otherwise. envd has no way to run an argv without a
shell: a list command is quoted with :func:`shlex.join` (:func:`~sandrl.sandbox.command.shell_line`), so
bash splits it back into the same arguments and expands none; a program that is not there exits 127
there too, though with bash's message, and bash still starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import posixpath
import shlex
import signal
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxUnreachableException,
    TimeoutException,
)
from e2b.connection_config import ApiParams
from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle

from sandrl.errors import ConfigError, SandboxClosedError, SandboxError, SandboxFileError, SandrlError
from sandrl.retry import Backoff, retry
from sandrl.sandbox.base import (
    DEFAULT_OUTPUT_CAP,
    MAX_READ_BYTES,
    ExecCall,
    ExecResult,
    ImageSource,
    SandboxBase,
    SandboxSpec,
    check_max_bytes,
    file_too_large,
)
from sandrl.sandbox.command import check_command, shell_line
from sandrl.sandbox.e2b.errors import RETRYABLE_CREATE, create_error, sandrl_error
from sandrl.sandbox.e2b.templates import BASE_TEMPLATE, HOST_IMAGE, template_for

PROVIDER_LABEL = "sandrl.provider"
"""Metadata key on every sandbox: the id of the provider that made it (to find the ones it lost)."""
STDIN_CHUNK = 256 * 1024
_USER = "root"


@dataclass(frozen=True)
class E2BConfig:
    """How an :class:`E2BProvider` creates sandboxes and talks to them. Where the service is and the
    key come from the SDK's own environment variables (``E2B_API_KEY``, ``E2B_DOMAIN``,
    ``E2B_API_URL``, ``E2B_SANDBOX_URL``), unless given here."""

    create_concurrency: int = 8
    """Creates in flight at once; the rest wait their turn (hosted services refuse bursts)."""
    create_retries: int = 4
    """Further attempts of a create refused as full or rate-limited, or failing on the connection."""
    backoff_s: float = 0.5
    """Wait before the first retry; doubles each time, up to ``backoff_max_s``, with jitter."""
    backoff_max_s: float = 8.0
    request_timeout_s: float = 60.0
    """Longest wait for one control or file call (create, kill, a file transfer's start)."""
    exec_margin_s: float = 30.0
    """An exec gives up this long after its own timeout when the service says nothing (an infra error)."""
    output_cap: int = DEFAULT_OUTPUT_CAP
    """Bytes kept per output stream of one exec; beyond it output is dropped and ``truncated`` set."""
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Labels added to every sandbox (E2B metadata)."""
    api_key: str | None = None
    domain: str | None = None
    api_url: str | None = None
    sandbox_url: str | None = None

    def __post_init__(self) -> None:
        if self.create_concurrency < 1 or self.create_retries < 0:
            raise ConfigError(
                f"create_concurrency must be >= 1 and create_retries >= 0, got {self.create_concurrency} "
                f"and {self.create_retries}"
            )
        if self.backoff_s < 0 or self.backoff_max_s < self.backoff_s:
            raise ConfigError("backoff_s must be >= 0 and backoff_max_s at least backoff_s")
        if self.request_timeout_s <= 0 or self.exec_margin_s <= 0 or self.output_cap < 1:
            raise ConfigError("request_timeout_s and exec_margin_s must be positive, output_cap at least 1 byte")

    def sdk_options(self) -> ApiParams:
        """The connection settings given here and the request timeout, as the SDK's keyword arguments
        (what is not given here: the SDK's environment variables)."""
        options = ApiParams(request_timeout=self.request_timeout_s)
        if self.api_key is not None:
            options["api_key"] = self.api_key
        if self.domain is not None:
            options["domain"] = self.domain
        if self.api_url is not None:
            options["api_url"] = self.api_url
        if self.sandbox_url is not None:
            options["sandbox_url"] = self.sandbox_url
        return options


class E2BProvider:
    """A :class:`~sandrl.sandbox.base.SandboxProvider` over an E2B-compatible service (see the module)."""

    def __init__(self, config: E2BConfig | None = None) -> None:
        self.config = cfg = config or E2BConfig()
        self.id = uuid.uuid4().hex[:12]
        self.service = (
            cfg.api_url or os.environ.get("E2B_API_URL") or (cfg.domain or os.environ.get("E2B_DOMAIN") or "e2b.app")
        )
        """Where the service is, for messages."""
        self._slots = asyncio.Semaphore(cfg.create_concurrency)
        self._live: weakref.WeakSet[E2BSandbox] = weakref.WeakSet()
        self.creates_in_flight = 0
        self.max_creates_in_flight = 0
        """The most creates that were ever in flight at once (never above ``create_concurrency``)."""
        self.create_retries_done = 0

    async def resolve_image(self, source: ImageSource) -> str:
        """The template of ``source`` (:func:`~sandrl.sandbox.e2b.templates.template_for`); the service must hold it."""
        return template_for(source)

    async def create(self, spec: SandboxSpec | None = None) -> E2BSandbox:
        """A new sandbox of ``spec`` from the template ``spec.image`` (``host`` is ``base``), with its TTL."""
        spec = spec or SandboxSpec()
        template = BASE_TEMPLATE if spec.image == HOST_IMAGE else spec.image
        cfg = self.config
        sdk = await retry(
            lambda _: self._create_once(spec, template),
            attempts=cfg.create_retries + 1,
            backoff=Backoff(cfg.backoff_s, cfg.backoff_max_s, jitter=(0.5, 1.0)),
            retry_on=RETRYABLE_CREATE,
            on_retry=self._count_retry,
        )
        sandbox = E2BSandbox(self, sdk, spec)
        self._live.add(sandbox)
        try:
            await sandbox.prepare()
        except BaseException:
            await asyncio.shield(sandbox.close())
            raise
        return sandbox

    def _count_retry(self, attempt: int, failure: object) -> None:
        self.create_retries_done += 1

    async def _create_once(self, spec: SandboxSpec, template: str) -> AsyncSandbox:
        async with self._slots:
            self.creates_in_flight += 1
            self.max_creates_in_flight = max(self.max_creates_in_flight, self.creates_in_flight)
            try:
                return await AsyncSandbox.create(
                    template,
                    timeout=max(1, math.ceil(spec.ttl_s)),
                    metadata={**self.config.metadata, PROVIDER_LABEL: self.id},
                    envs=dict(spec.env) or None,
                    allow_internet_access=spec.network,
                    # This loop is the one retry policy of a create: the SDK's own would hold the slot while it waits.
                    **(self.config.sdk_options() | ApiParams(retries=0)),
                )
            except Exception as exc:
                raise create_error(exc, template=template, service=self.service) from exc
            finally:
                self.creates_in_flight -= 1

    async def aclose(self) -> None:
        """Kill every sandbox this provider made that is still up: those it holds, and any whose create
        answer was lost on the way (found by its label). Best effort: the TTL is the backstop."""
        await asyncio.gather(*(sb.close() for sb in list(self._live)), return_exceptions=True)
        with contextlib.suppress(Exception):
            paginator = AsyncSandbox.list(
                query=SandboxQuery(metadata={PROVIDER_LABEL: self.id}),
                **self.config.sdk_options(),
            )
            while paginator.has_next:
                for info in await paginator.next_items():
                    with contextlib.suppress(Exception):
                        await AsyncSandbox.kill(info.sandbox_id, **self.config.sdk_options())

    async def __aenter__(self) -> E2BProvider:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.shield(self.aclose())


class _Capped:
    """One output stream of an exec, kept up to the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def add(self, text: str) -> None:
        if self.truncated:
            return
        data = text.encode()
        if self.size + len(data) >= self.cap:
            # At the cap exactly counts as cut: the service's own cap (sandrl's is the same 1 MiB) may
            # have dropped the rest before it reached this client.
            self.parts.append(data[: self.cap - self.size].decode(errors="ignore"))
            self.size = self.cap
            self.truncated = True
            return
        self.parts.append(text)
        self.size += len(data)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _signal_exit(exit_code: int, error: str | None) -> int:
    """envd reports a signal death as exit code -1 and ``signal: <name>`` (as Go does); sandrl says ``-N``."""
    if exit_code != -1 or not error or not error.startswith("signal: "):
        return exit_code
    name = error.removeprefix("signal: ").strip()
    name = {"killed": "kill", "terminated": "term", "interrupt": "int"}.get(name, name)
    try:
        return -int(signal.Signals["SIG" + name.upper()])
    except KeyError:
        return exit_code


class E2BSandbox(SandboxBase):
    """One sandbox of an E2B-compatible service (a :class:`~sandrl.sandbox.base.Sandbox`)."""

    def __init__(self, provider: E2BProvider, sdk: AsyncSandbox, spec: SandboxSpec) -> None:
        self.provider = provider
        self.sdk = sdk
        self.id: str = sdk.sandbox_id
        self.spec = spec
        self.closed = False

    def _what(self, action: str) -> str:
        return f"{action} in sandbox {self.id}"

    def _error(self, exc: Exception, action: str, *, file_op: bool = False) -> SandrlError:
        if isinstance(exc, AuthenticationException):
            # The key made this sandbox, so a refusal now means the service no longer knows it (a
            # sandrl service that restarted answers so for the sandboxes of its predecessor).
            return SandboxClosedError(
                f"{self._what(action)}: the E2B service at {self.provider.service} no longer accepts this "
                f"sandbox's access token (it restarted or lost the sandbox): {exc}"
            )
        return sandrl_error(exc, what=self._what(action), service=self.provider.service, file_op=file_op)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed")

    def _abs(self, path: str) -> str:
        if not path or "\0" in path:
            raise SandboxFileError(f"invalid path {path!r}: give a non-empty path without NUL bytes")
        return path if path.startswith("/") else posixpath.join(self.spec.workdir, path)

    async def prepare(self) -> None:
        """Make the spec's workdir, which every exec starts in."""
        try:
            await self.sdk.files.make_dir(
                self.spec.workdir, user=_USER, request_timeout=self.provider.config.request_timeout_s
            )
        except Exception as exc:
            raise self._error(exc, f"making the workdir {self.spec.workdir}") from exc

    async def _exec(self, call: ExecCall) -> ExecResult:
        self._check_open()
        line = shell_line(check_command(call.command))
        timeout_s, cwd, env, stdin = call.timeout_s, call.cwd, call.env, call.stdin
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        cfg = self.provider.config
        out, err = _Capped(cfg.output_cap), _Capped(cfg.output_cap)
        start = time.monotonic()
        try:
            handle = await self.sdk.commands.run(
                line,
                background=True,
                envs=dict(env) if env else None,
                user=_USER,
                cwd=self._abs(cwd) if cwd else self.spec.workdir,
                on_stdout=out.add,
                on_stderr=err.add,
                stdin=stdin is not None,
                timeout=timeout_s,
                request_timeout=cfg.request_timeout_s,
                retain_output=False,
            )
        except Exception as exc:
            raise self._error(exc, "starting a command") from exc
        feeder = asyncio.create_task(self._feed(handle, stdin)) if stdin is not None else None
        exit_code, timed_out = 0, False
        try:
            await asyncio.wait_for(handle.wait(), timeout_s + cfg.exec_margin_s)
        except CommandExitException as exc:
            exit_code = _signal_exit(exc.exit_code, exc.error)
        except TimeoutError:
            await self._kill_quietly(handle)
            raise SandboxError(
                f"{self._what('a command')}: the E2B service at {self.provider.service} said nothing "
                f"{cfg.exec_margin_s:g} s past the command's timeout of {timeout_s:g} s",
                error_code="service_timeout",
            ) from None
        except TimeoutException as exc:
            # The command's deadline (E2B kills it there) unless it came early: then the stream broke.
            if time.monotonic() - start < timeout_s * 0.95 or isinstance(
                exc, SandboxNotRunningException | SandboxUnreachableException
            ):
                raise self._error(exc, "a command") from exc
            await self._kill_quietly(handle)
            exit_code, timed_out = 124, True
        except Exception as exc:
            raise self._error(exc, "a command") from exc
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_quietly(handle))  # the caller gave up: so does the command
            raise
        finally:
            if feeder is not None:
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feeder
        return ExecResult(
            exit_code=exit_code,
            stdout=out.text,
            stderr=err.text,
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
        )

    async def _feed(self, handle: AsyncCommandHandle[None], data: bytes) -> None:
        """Write ``data`` to the command's stdin, then close it. A command that exits without reading
        it all makes the writes fail: that is the command's business, so it is not an error here."""
        with contextlib.suppress(Exception):
            for i in range(0, len(data), STDIN_CHUNK):
                await handle.send_stdin(data[i : i + STDIN_CHUNK])
            await handle.close_stdin()

    async def _kill_quietly(self, handle: AsyncCommandHandle[None]) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.kill(), 10)
        with contextlib.suppress(Exception):
            await handle.disconnect()

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (parents made), then set its mode when it is not E2B's default 0644."""
        self._check_open()
        target = self._abs(path)
        try:
            await self.sdk.files.write(target, data, user=_USER, request_timeout=self.provider.config.request_timeout_s)
        except Exception as exc:
            raise self._error(exc, f"writing {target}", file_op=True) from exc
        if mode & 0o7777 != 0o644:
            result = await self.exec(f"chmod {mode & 0o7777:o} -- {shlex.quote(target)}", cwd="/")
            if result.exit_code != 0:
                raise SandboxFileError(
                    f"setting the mode of {target} in sandbox {self.id} failed: {result.stderr.strip()}"
                )

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The file's bytes; one past ``max_bytes`` raises :class:`~sandrl.errors.SandboxFileTooLargeError`."""
        check_max_bytes(max_bytes)
        self._check_open()
        target = self._abs(path)
        chunks: list[bytes] = []
        taken = 0
        try:
            stream = await self.sdk.files.read(
                target, format="stream", user=_USER, request_timeout=self.provider.config.request_timeout_s
            )
            async with stream:
                async for chunk in stream:
                    if taken + len(chunk) > max_bytes:
                        raise file_too_large(target, self.id, max_bytes)
                    taken += len(chunk)
                    chunks.append(chunk)
        except SandrlError:
            raise
        except Exception as exc:
            raise self._error(exc, f"reading {target}", file_op=True) from exc
        return b"".join(chunks)

    async def close(self) -> None:
        """Kill the sandbox on the service; idempotent (one already gone is fine)."""
        if self.closed:
            return
        self.closed = True
        self.provider._live.discard(self)
        try:
            await self.sdk.kill(request_timeout=self.provider.config.request_timeout_s)
        except Exception as exc:
            error = self._error(exc, "closing")
            if not isinstance(error, SandboxClosedError):
                raise error from exc
