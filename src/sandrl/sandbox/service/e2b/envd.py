"""The in-sandbox (envd) data plane of the E2B-compatible API, as one ASGI app.

Requests arrive on the service's own port carrying ``E2b-Sandbox-Id`` (see
:mod:`sandrl.sandbox.service.e2b.gateway`) and are served here:

- ``/process.Process/*`` and ``/filesystem.Filesystem/*``: Connect RPC, by the code generated
  from sandrl's own ``proto/*.proto`` (:mod:`.processes`, :mod:`.filesystem`);
- ``GET /files?path=``: a file's bytes, streamed; ``POST /files``: upload, as
  ``multipart/form-data`` (one part per file, named by its filename or ``?path=``) or
  ``application/octet-stream`` (``?path=``, optionally ``Content-Encoding: gzip``), streamed
  into the sandbox; the answer lists what was written;
- ``GET /health`` (204) and ``POST /init`` (204; sandrl needs no init).

Every call must carry the sandbox's envd access token as ``X-Access-Token``; it is checked
before any request body is read (for Connect calls by a metadata interceptor, which connectrpc
runs before it reads the message), and a wrong one is answered exactly as an unknown sandbox
is (see :mod:`.state`). Errors of the HTTP routes are ``{"code", "message"}`` JSON as envd
answers them; a sandbox that is gone is, to the holder of its token, a 502 whose message says
it "was not found", which the SDK raises as ``SandboxNotRunningException``.

Uploads never touch the host's disk and are bounded by the sandbox's disk
(:meth:`~sandrl.sandbox.service.SandboxService.upload_limit`): a declared length over it is
refused before the body is read; multipart bodies are parsed as they arrive, each file part
streamed into the sandbox; the bytes read, and the bytes a gzip body inflates to, are cut once
they pass the bound (413), and a write that fails ends the upload at once.
"""

from __future__ import annotations

import errno
import json
import posixpath
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

from connectrpc.request import RequestContext
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send as StarletteSend

from sandrl.errors import SandboxFileError, SandrlError
from sandrl.sandbox.service.auth import Receive, Scope, Send, content_length
from sandrl.sandbox.service.e2b.filesystem import FilesystemService, absolute
from sandrl.sandbox.service.e2b.processes import ProcessService, connect_error
from sandrl.sandbox.service.e2b.proto.filesystem_connect import FilesystemASGIApplication
from sandrl.sandbox.service.e2b.proto.process_connect import ProcessASGIApplication
from sandrl.sandbox.service.e2b.state import E2BRegistry, Refused, resolve
from sandrl.sandbox.service.state import BoundedBody, Entry

UPLOAD_CHUNK = 1 << 20
MULTIPART_OVERHEAD = 64 << 10
"""What a multipart body may carry beyond its files' bytes (boundaries, part headers)."""
_REFUSED_STATUS = {"unauthenticated": 401, "not_found": 502, "port": 502}


class EnvdError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _file_error(exc: SandrlError, path: str) -> EnvdError:
    if isinstance(exc, SandboxFileError):
        if exc.errno == errno.ENOENT:
            return EnvdError(404, f"path '{path}' does not exist: {exc.message}")
        if exc.errno in (errno.EISDIR, errno.ENOTDIR):
            return EnvdError(400, f"path '{path}' is a directory or under a file: {exc.message}")
        if exc.errno == errno.ENOSPC:
            return EnvdError(507, f"not enough disk space in the sandbox to write '{path}': {exc.message}")
        return EnvdError(400, exc.message)
    return EnvdError(exc.http_status if exc.http_status != 410 else 502, exc.message)


class TokenCheck:
    """A connectrpc metadata interceptor: refuses a call without its sandbox's token before its body is read."""

    def __init__(self, registry: E2BRegistry) -> None:
        self.registry = registry

    async def on_start(self, ctx: RequestContext[Any, Any]) -> None:
        try:
            resolve(self.registry, ctx.request_headers)
        except Refused as exc:
            raise connect_error(exc) from None

    async def on_end(self, token: None, ctx: RequestContext[Any, Any], error: Exception | None, /) -> None:
        return None


class EnvdApp:
    """Serves envd's routes for every sandbox of one service."""

    def __init__(self, registry: E2BRegistry) -> None:
        self.registry = registry
        check = [TokenCheck(registry)]
        self.process = ProcessASGIApplication(ProcessService(registry), interceptors=check)
        self.filesystem = FilesystemASGIApplication(FilesystemService(registry), interceptors=check)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if path.startswith("/process.Process/"):
            await self.process(scope, receive, send)
            return
        if path.startswith("/filesystem.Filesystem/"):
            await self.filesystem(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._http(request, path)
        except EnvdError as exc:
            response = _error(exc.status, exc.message)
        await response(scope, receive, cast("StarletteSend", send))

    def _sandbox(self, request: Request) -> Entry:
        try:
            entry, _ = resolve(self.registry, request.headers)
        except Refused as exc:
            raise EnvdError(_REFUSED_STATUS[exc.kind], exc.message) from None
        return entry

    async def _http(self, request: Request, path: str) -> Response:
        method = request.method
        if path == "/health" and method == "GET":
            self._sandbox(request)
            return Response(status_code=204)
        if path == "/init" and method == "POST":
            self._sandbox(request)
            return Response(status_code=204)
        if path == "/files" and method == "GET":
            return await self._download(request)
        if path == "/files" and method == "POST":
            return await self._upload(request)
        if path in ("/files", "/health", "/init"):
            return _error(405, f"{method} is not allowed on {path}")
        return _error(
            404, f"envd of sandrl has no route {path}: it serves /files, /health, Connect process and filesystem"
        )

    async def _download(self, request: Request) -> Response:
        entry = self._sandbox(request)
        path = request.query_params.get("path")
        if not path:
            raise EnvdError(400, "GET /files needs ?path=<file in the sandbox>")
        sandbox = self.registry.service.streaming(entry)
        if sandbox is None:
            try:
                data = await entry.sandbox.read_file(path)
            except SandrlError as exc:
                raise _file_error(exc, path) from exc
            return Response(data, media_type="application/octet-stream")
        try:
            body = await self.registry.service.file_stream(entry, sandbox, path)
        except SandrlError as exc:  # a missing file fails here, before the response starts
            raise _file_error(exc, path) from exc
        name = posixpath.basename(path)
        return StreamingResponse(
            body,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f"attachment; filename*=UTF-8''{_quote(name)}"},
        )

    async def _upload(self, request: Request) -> Response:
        entry = self._sandbox(request)
        limit = self.registry.service.upload_limit(entry)
        content_type = request.headers.get("content-type", "")
        query_path = request.query_params.get("path")
        multipart = content_type.startswith("multipart/form-data")
        if not multipart and not content_type.startswith("application/octet-stream"):
            raise EnvdError(400, "POST /files takes multipart/form-data or application/octet-stream")
        if not multipart and not query_path:
            raise EnvdError(400, "an octet-stream upload needs ?path=<file in the sandbox>")
        room = limit + (MULTIPART_OVERHEAD if multipart else 0)
        try:
            declared = content_length(request.headers.get("content-length"))
        except ValueError as exc:
            raise EnvdError(400, str(exc)) from None
        if declared is not None and declared > room:
            raise self._too_big(entry, "the upload")
        raw = BoundedBody(request.stream(), room)
        gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
        body = BoundedBody(_inflated(aiter(raw)) if gzipped else aiter(raw), room)
        written: list[dict[str, Any]] = []
        what = "the upload, inflated," if gzipped else "the upload"
        try:
            if multipart:
                await self._write_parts(entry, request, body, query_path, limit, written)
            else:
                await self._write(entry, query_path or "", aiter(body), limit)
                written.append(_info(entry, query_path or ""))
        except EnvdError:
            if raw.over or body.over:  # what went wrong after the cut is the cut
                raise self._too_big(entry, what) from None
            raise
        if raw.over or body.over:
            raise self._too_big(entry, what)
        return Response(json.dumps(written), media_type="application/json")

    async def _write_parts(
        self,
        entry: Entry,
        request: Request,
        body: BoundedBody,
        query_path: str | None,
        limit: int,
        written: list[dict[str, Any]],
    ) -> None:
        _, options = parse_options_header(request.headers.get("content-type", ""))
        boundary = options.get(b"boundary")
        if not boundary:
            raise EnvdError(400, "the multipart upload has no boundary in its Content-Type")
        parts = MultipartReader(aiter(body), boundary)
        while (headers := await parts.next_part()) is not None:
            _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
            filename = disposition.get(b"filename")
            if filename is None:
                continue  # a form field, not a file: envd ignores it
            if query_path and written:
                raise EnvdError(400, "?path= names one file: send one file part with it, or name each part")
            target = query_path or filename.decode("utf-8", "replace")
            if not target:
                raise EnvdError(400, "a file part has no filename: name each part by its path in the sandbox")
            await self._write(entry, target, parts.data(), limit - parts.taken)
            written.append(_info(entry, target))
        if not written and not body.over:
            raise EnvdError(400, "the multipart upload has no file part")

    def _too_big(self, entry: Entry, what: str) -> EnvdError:
        return EnvdError(413, self.registry.service.too_big(entry, what).message)

    async def _write(self, entry: Entry, path: str, chunks: AsyncIterator[bytes], limit: int) -> None:
        svc = self.registry.service
        sandbox = svc.streaming(entry)
        data = BoundedBody(chunks, limit)
        try:
            with svc.busy(entry):
                if sandbox is not None:
                    await sandbox.write_file_stream(path, aiter(data))
                else:
                    content = b"".join([c async for c in data])
                    if not data.over:
                        await entry.sandbox.write_file(path, content)
        except SandrlError as exc:
            if data.over:
                raise self._too_big(entry, "the upload") from exc
            raise _file_error(exc, path) from exc
        if data.over:
            raise self._too_big(entry, "the upload")


class MultipartReader:
    """A ``multipart/form-data`` body read part by part as it arrives, holding no more than one chunk of it."""

    def __init__(self, chunks: AsyncIterator[bytes], boundary: bytes) -> None:
        self._chunks = chunks
        self._events: deque[tuple[str, Any]] = deque()
        self._headers: dict[bytes, bytes] = {}
        self._field = b""
        self._value = b""
        self._ended = False
        self.taken = 0
        """File bytes handed out so far, all parts together."""

        def header_field(data: bytes, start: int, end: int) -> None:
            self._field += data[start:end]

        def header_value(data: bytes, start: int, end: int) -> None:
            self._value += data[start:end]

        def header_end() -> None:
            self._headers[self._field.lower()] = self._value
            self._field = self._value = b""

        def headers_finished() -> None:
            self._events.append(("headers", self._headers))
            self._headers = {}

        def part_data(data: bytes, start: int, end: int) -> None:
            self._events.append(("data", data[start:end]))

        self._parser = MultipartParser(
            boundary,
            {
                "on_header_field": header_field,
                "on_header_value": header_value,
                "on_header_end": header_end,
                "on_headers_finished": headers_finished,
                "on_part_data": part_data,
                "on_part_end": lambda: self._events.append(("end", None)),
                "on_end": lambda: self._events.append(("done", None)),
            },
        )

    async def _next(self) -> tuple[str, Any]:
        while not self._events:
            if self._ended:
                raise EnvdError(400, "the multipart body ended before its closing boundary")
            chunk = await anext(self._chunks, None)
            if chunk is None:
                self._ended = True
                continue
            try:
                self._parser.write(chunk)
            except MultipartParseError as exc:
                raise EnvdError(400, f"the multipart body is malformed: {exc}") from exc
        return self._events.popleft()

    async def next_part(self) -> dict[bytes, bytes] | None:
        """The next part's headers (what is left of the current part is skipped), or None after the last."""
        while True:
            kind, value = await self._next()
            if kind == "headers":
                return cast("dict[bytes, bytes]", value)
            if kind == "done":
                return None

    async def data(self) -> AsyncIterator[bytes]:
        """The current part's bytes."""
        while True:
            kind, value = await self._next()
            if kind == "data":
                self.taken += len(value)
                yield value
            elif kind == "end":
                return
            elif kind == "done":  # malformed: cannot happen inside a part
                raise EnvdError(400, "the multipart body ended inside a part")


def _info(entry: Entry, path: str) -> dict[str, Any]:
    full = absolute(entry, path)
    return {"name": posixpath.basename(full), "type": "file", "path": full}


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


async def _inflated(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip body inflated at most :data:`UPLOAD_CHUNK` bytes at a time, so its reader bounds how far it goes."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        async for data in chunks:
            while True:
                out = inflate.decompress(data, UPLOAD_CHUNK)
                data = inflate.unconsumed_tail
                if out:
                    yield out
                if not data and len(out) < UPLOAD_CHUNK:
                    break
        if tail := inflate.flush():
            yield tail
    except zlib.error as exc:
        raise EnvdError(400, f"the upload is not valid gzip: {exc}") from exc
