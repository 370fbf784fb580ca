"""RemoteProvider: the sandbox service's native API over httpx, as a SandboxProvider.

A rollout uses a remote host exactly as a local provider::

    async with RemoteProvider("http://gpu-box:8700") as provider:     # token from $SANDRL_TOKEN
        async with await provider.create(SandboxSpec(memory_mb=4096)) as sandbox:
            result = await sandbox.exec("pytest -q", timeout_s=600)

Calls whose bodies fit in memory (create, exec, close, get, timeout) share one connection, the
service's call channel (:mod:`sandrl.sandbox.remote.call_channel`); the rest (file and tar transfers,
streaming exec, list) and every call to a server without the channel go through one HTTP
connection pool per provider (:mod:`sandrl.sandbox.remote.http_pool`). Both are shared by the provider's
sandboxes and fail alike. Failures are typed:

- the server cannot be reached (refused, DNS, connect timeout): every call is retried with
  backoff (the request never arrived), then :class:`~sandrl.errors.SandboxUnavailableError`
  ``service_unreachable``;
- the connection broke after the request was sent (server killed, network): idempotent calls
  (GET, DELETE, timeout, file writes from bytes) are retried, others (create, exec) are not,
  since they may have run: ``SandboxUnavailableError`` ``service_connection_lost``, which the
  caller may retry as a whole (a new sandbox, the episode again);
- 502/503/504 answers: idempotent calls retried;
- error answers keep the server's ``error_code`` and message, as the matching class of
  :mod:`sandrl.errors` (``sandbox_not_found`` -> SandboxNotFoundError, ``capacity_exhausted``
  -> CapacityExhaustedError, ...), with ``http_status`` set.

Retry-worthy for a caller: ``SandboxUnavailableError`` and ``CapacityExhaustedError``.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar, Unpack
from urllib.parse import quote

import httpx

from sandrl import __version__
from sandrl.errors import (
    ConfigError,
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
)
from sandrl.retry import Backoff, retry
from sandrl.sandbox.base import (
    MAX_READ_BYTES,
    ExecCall,
    ExecOptions,
    ExecResult,
    ImageSource,
    OutputChunk,
    SandboxBase,
    SandboxSpec,
    check_max_bytes,
    file_too_large,
    prebuilt_image,
)
from sandrl.sandbox.command import Command, check_command
from sandrl.sandbox.remote.call_channel import CallChannel
from sandrl.sandbox.remote.config import SERVER_ENV, ClientConfig
from sandrl.sandbox.remote.errors import Answered, error_from, typed_error
from sandrl.sandbox.remote.http_pool import Answer, PooledTransport
from sandrl.sandbox.remote.wire import (
    API_PREFIX,
    TOKEN_ENV,
    ExecRequest,
    ExecResponse,
    FileWritten,
    Health,
    SandboxInfo,
    SandboxList,
)

_PCHAR = "/!$&'()*+,;=:@-._~"
"""What a path may hold unquoted (RFC 3986): a sandbox id from a caller cannot inject a header."""
_RETRY_STATUS = frozenset({502, 503, 504})


class RemoteProvider:
    """A :class:`~sandrl.sandbox.base.SandboxProvider` backed by a sandbox service."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        config: ClientConfig | None = None,
        metadata: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = url or os.environ.get(SERVER_ENV)
        if not url:
            raise ConfigError(f"no sandbox server given: pass its URL or set ${SERVER_ENV} (e.g. http://host:8700)")
        self.url = url.rstrip("/")
        self.config = cfg = config or ClientConfig()
        self.metadata = dict(metadata or {})
        """Labels added to every sandbox this provider creates."""
        token = token if token is not None else (os.environ.get(TOKEN_ENV) or "").strip() or None
        if token is not None and not (token.isascii() and token.isprintable()):
            raise ConfigError(f"the sandbox service token (${TOKEN_ENV} or token=) holds a character a header cannot")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Requests go straight to the transport: httpx.AsyncClient's redirect, cookie and auth
        # machinery costs as much per call as the call itself and none of it is used here.
        self._headers = {"User-Agent": f"sandrl/{__version__}", **headers}
        self._transport: httpx.AsyncBaseTransport = transport or PooledTransport(
            max_connections=cfg.max_connections, connect_timeout_s=cfg.connect_timeout_s
        )
        # Calls whose bodies fit in memory skip httpx.Request and httpx.Response too (the pool's fetch):
        # their head is this text, rendered once, and the call's own line, path and length.
        parts = httpx.URL(self.url)
        self._pool = (
            self._transport if isinstance(self._transport, PooledTransport) and parts.scheme == "http" else None
        )
        self._origin = (parts.host, parts.port or 80)
        self._path_prefix = parts.raw_path.decode("ascii").rstrip("/")
        fixed = {"host": parts.netloc.decode("ascii"), **{k.lower(): v for k, v in self._headers.items()}}
        self._fixed_head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._channel = (
            CallChannel(self._origin, self._path_prefix, self._fixed_head, connect_timeout_s=cfg.connect_timeout_s)
            if self._pool is not None and cfg.channel
            else None
        )

    # -- the API

    async def create(
        self, spec: SandboxSpec | None = None, *, metadata: Mapping[str, str] | None = None, wait_s: float | None = None
    ) -> RemoteSandbox:
        spec = spec or SandboxSpec()
        wait = self.config.create_wait_s if wait_s is None else wait_s
        # Sent as the spec has it: the server's checks (and messages) apply, not the client's copy of them.
        body = {**spec.to_dict(), "metadata": {**self.metadata, **(metadata or {})}, "wait_s": wait}
        timeout = self.config.timeout_s + wait
        content = await self.call("POST", "/sandboxes", json=body, idempotent=False, timeout=timeout)
        return RemoteSandbox(self, SandboxInfo.model_validate_json(content))

    async def resolve_image(self, source: ImageSource) -> str:
        """The server builds nothing for a client: ``source``'s prebuilt image, or ``host``."""
        return prebuilt_image(source)

    async def list_sandboxes(self, metadata: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        params = httpx.QueryParams([("metadata", f"{k}={v}") for k, v in (metadata or {}).items()])
        r = await self.request("GET", "/sandboxes", params=params)
        return SandboxList.model_validate_json(r.content).sandboxes

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.model_validate_json(await self.call("GET", f"/sandboxes/{sandbox_id}"))

    async def connect(self, sandbox_id: str) -> RemoteSandbox:
        """A handle to a sandbox that already exists (made by another client, say)."""
        return RemoteSandbox(self, await self.get(sandbox_id))

    async def kill(self, sandbox_id: str) -> bool:
        """Close a sandbox by id; False if the server had no such sandbox."""
        try:
            await self.call("DELETE", f"/sandboxes/{sandbox_id}")
        except SandboxNotFoundError:
            return False
        return True

    async def health(self) -> Health:
        return Health.model_validate_json(await self.call("GET", "/healthz", prefix=""))

    # -- transport

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
        prefix: str = API_PREFIX,
    ) -> bytes:
        """A call whose request and answer fit in memory (create, exec, close...): its 2xx answer's body,
        with the retry and error policy of :meth:`request`."""
        if self._pool is None:
            r = await self.request(method, path, json=json, idempotent=idempotent, timeout=timeout, prefix=prefix)
            return r.content
        pool, origin, channel = self._pool, self._origin, self._channel
        wait = timeout or self.config.timeout_s
        body = b"" if json is None else _json_bytes(json)
        target = quote(self._path_prefix + prefix + path, safe=_PCHAR)

        async def attempt() -> Answer:
            if channel is not None and channel.available:
                answer = await channel.fetch(method, target, body, timeout=wait)
                if answer is not None:
                    return answer
            kind = "content-type: application/json\r\n" if json is not None else ""
            head = f"{method} {target} HTTP/1.1\r\n{self._fixed_head}{kind}content-length: {len(body)}\r\n\r\n"
            return await pool.fetch(origin, method, head.encode(), body, timeout=wait, pool_timeout=wait)

        answer = await self._with_policy(method, prefix + path, idempotent, wait, attempt)
        return answer.content

    async def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool | None = None,
        json: Any = None,
        content: bytes | AsyncIterator[bytes] | None = None,
        params: httpx.QueryParams | None = None,
        timeout: float | None = None,
        stream: bool = False,
        prefix: str = API_PREFIX,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Any call, with the retry and error policy of the module docstring; returns a 2xx response.

        With ``stream`` the body is not read: the caller must close the response.
        """
        cfg = self.config
        http_timeout = httpx.Timeout(timeout or cfg.timeout_s, connect=cfg.connect_timeout_s)
        url = self.url + prefix + path

        async def attempt() -> httpx.Response:
            request = httpx.Request(
                method,
                url,
                json=json,
                content=content,
                params=params,
                headers={**self._headers, **headers} if headers else self._headers,
                extensions={"timeout": http_timeout.as_dict()},
            )
            response = await self._transport.handle_async_request(request)
            response.request = request
            if not stream:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            return response

        return await self._with_policy(method, prefix + path, idempotent, http_timeout.read, attempt)

    async def _with_policy(
        self, method: str, url: str, idempotent: bool | None, wait: float | None, attempt: Callable[[], Awaitable[_R]]
    ) -> _R:
        """``attempt`` until it answers 2xx, retried and its failures typed as the module docstring says."""
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "DELETE", "PUT")
        attempts = self.config.retries + 1

        async def typed(n: int) -> _R:
            """One try; a failure that is retried propagates as it is, any other one as its typed error."""
            try:
                response = await attempt()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if n < attempts:
                    raise
                raise SandboxUnavailableError(
                    f"the sandbox server at {self.url} is not reachable ({type(exc).__name__}: {exc}; "
                    f"{n} attempts): start it with `sandrl serve sandboxes` or check the URL",
                    error_code="service_unreachable",
                ) from exc
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                if n < attempts and idempotent:
                    raise
                raise SandboxUnavailableError(
                    f"the connection to the sandbox server at {self.url} broke during {method} {url} "
                    f"({type(exc).__name__}: {exc}): the server may have restarted; "
                    + ("retry the call" if idempotent else "the call may or may not have run, so retry it whole"),
                    error_code="service_connection_lost",
                ) from exc
            except httpx.TimeoutException as exc:
                raise SandboxError(
                    f"the sandbox server at {self.url} did not answer {method} {url} within "
                    f"{wait:g} s: raise ClientConfig.timeout_s, or check the server's load",
                    error_code="service_timeout",
                ) from exc
            retried = response.status_code in _RETRY_STATUS and idempotent and n < attempts
            if response.status_code >= 400 and not retried:
                await response.aread()
                await response.aclose()
                raise error_from(method, url, response)
            return response

        return await retry(
            typed,
            attempts=attempts,
            backoff=Backoff(self.config.backoff_s, self.config.backoff_max_s),
            retry_on=_RETRIED,
            retry_if=lambda response: response.status_code in _RETRY_STATUS,
            on_retry=_close_retried,
        )

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.aclose()
        await self._transport.aclose()

    async def __aenter__(self) -> RemoteProvider:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


_R = TypeVar("_R", bound=Answered)
_RETRIED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""What a try raises when it is retried: the request never arrived, or (idempotent calls only) its connection broke."""


async def _close_retried(attempt: int, outcome: Answered | Exception) -> None:
    if not isinstance(outcome, Exception):
        await outcome.aclose()  # a 502/503/504 answer, not read: the try after it replaces it


def _json_bytes(value: Any) -> bytes:
    """JSON as httpx sends it (compact, UTF-8, no NaN)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _exec_body(call: ExecCall) -> dict[str, Any]:
    # Checked here, as a local sandbox would, so bad input is the same typed error on either and is not sent.
    checked = check_command(call.command)
    request = ExecRequest(
        command=checked if isinstance(checked, str) else list(checked),
        timeout_s=call.timeout_s,
        cwd=call.cwd,
        env=dict(call.env) if call.env else None,
        stdin_b64=base64.b64encode(call.stdin).decode() if call.stdin is not None else None,
    )
    return request.model_dump(exclude_none=True)


class RemoteSandbox(SandboxBase):
    """One sandbox on a sandbox service (a :class:`~sandrl.sandbox.base.Sandbox`)."""

    def __init__(self, provider: RemoteProvider, info: SandboxInfo) -> None:
        self.provider = provider
        self.id = info.id
        self.info = info
        self.spec = info.spec.to_spec()
        self.closed = False
        self._base = f"/sandboxes/{info.id}"

    async def _exec(self, call: ExecCall) -> ExecResult:
        timeout = call.timeout_s + self.provider.config.exec_margin_s
        body = _exec_body(call)
        content = await self.provider.call("POST", self._base + "/exec", json=body, idempotent=False, timeout=timeout)
        return ExecResponse.model_validate_json(content).to_result()

    async def exec_stream(
        self, command: Command, **options: Unpack[ExecOptions]
    ) -> AsyncIterator[OutputChunk | ExecResult]:
        """Output chunks as the command prints them, then its :class:`ExecResult` (holding no output);
        the options are :meth:`exec`'s."""
        body = _exec_body(ExecCall(command, **options))
        r = await self.provider.request(
            "POST",
            self._base + "/exec/stream",
            json=body,
            idempotent=False,
            stream=True,
            timeout=self.provider.config.timeout_s,
        )
        try:
            event, data = "", ""
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line and event:
                    payload = json.loads(data)
                    if event == "stdout":
                        yield OutputChunk("stdout", payload["text"].encode())
                    elif event == "stderr":
                        yield OutputChunk("stderr", payload["text"].encode())
                    elif event == "exit":
                        yield ExecResponse.model_validate(payload).to_result()
                        return
                    elif event == "error":
                        raise typed_error(payload["error_code"], payload["message"], int(payload["code"]))
                    event, data = "", ""
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raise SandboxUnavailableError(
                f"the connection to {self.provider.url} broke while streaming a command in {self.id}: {exc}",
                error_code="service_connection_lost",
            ) from exc
        finally:
            await r.aclose()
        raise SandboxUnavailableError(
            f"the stream of a command in {self.id} ended without its exit status: the server may have restarted",
            error_code="service_connection_lost",
        )

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self._put("/files", path, data, mode)

    async def write_file_stream(self, path: str, chunks: AsyncIterator[bytes], mode: int = 0o644) -> int:
        """Write a file from a stream of chunks (never held whole); returns its size."""
        return await self._put("/files", path, chunks, mode)

    async def _put(self, route: str, path: str, content: bytes | AsyncIterator[bytes], mode: int | None) -> int:
        params = httpx.QueryParams({"path": path} | ({"mode": f"{mode & 0o7777:o}"} if mode is not None else {}))
        kind: Literal["application/octet-stream", "application/x-tar"] = (
            "application/x-tar" if route == "/tar" else "application/octet-stream"
        )
        r = await self.provider.request(
            "PUT",
            self._base + route,
            content=content,
            params=params,
            idempotent=isinstance(content, bytes),
            timeout=max(self.provider.config.timeout_s, 3600),
            headers={"Content-Type": kind},
        )
        return FileWritten.model_validate_json(r.content).size

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        return b"".join([c async for c in self.read_file_stream(path, max_bytes=max_bytes)])

    async def read_file_stream(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> AsyncIterator[bytes]:
        """The file's bytes, chunk by chunk as they arrive; at most ``max_bytes`` of them.

        A file with more raises :class:`~sandrl.errors.SandboxFileTooLargeError` and the transfer is
        dropped there, whatever the server would go on sending.
        """
        check_max_bytes(max_bytes)
        stream = self._get_stream("/files", path)
        taken = 0
        try:
            async for chunk in stream:
                if taken + len(chunk) > max_bytes:
                    raise file_too_large(path, self.id, max_bytes)
                taken += len(chunk)
                yield chunk
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()  # closes the response at once, not when the generator is collected

    async def upload_tar(self, path: str, archive: bytes | AsyncIterator[bytes]) -> int:
        """Unpack a tar archive into the directory ``path`` (made if missing); returns the archive's size."""
        return await self._put("/tar", path, archive, None)

    async def download_tar(self, path: str) -> AsyncIterator[bytes]:
        """The directory ``path`` as a tar archive (paths relative to it), streamed."""
        async for chunk in self._get_stream("/tar", path):
            yield chunk

    async def _get_stream(self, route: str, path: str) -> AsyncIterator[bytes]:
        r = await self.provider.request(
            "GET",
            self._base + route,
            params=httpx.QueryParams({"path": path}),
            stream=True,
            timeout=max(self.provider.config.timeout_s, 600),
        )
        try:
            async for chunk in r.aiter_bytes():
                yield chunk
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raise SandboxUnavailableError(
                f"the transfer of {path} from {self.id} broke off ({exc}): the file may be incomplete, retry",
                error_code="service_connection_lost",
            ) from exc
        finally:
            await r.aclose()

    async def set_ttl(self, ttl_s: float) -> None:
        """Let the sandbox live ``ttl_s`` more seconds, from now."""
        content = await self.provider.call("POST", self._base + "/timeout", json={"ttl_s": ttl_s}, idempotent=True)
        self.info = SandboxInfo.model_validate_json(content)

    async def refresh(self) -> SandboxInfo:
        self.info = await self.provider.get(self.id)
        return self.info

    async def close(self) -> None:
        """Close the sandbox on the server; idempotent (a sandbox already gone is fine)."""
        if self.closed:
            return
        await self.provider.kill(self.id)
        self.closed = True
