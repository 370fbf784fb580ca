"""The in-sandbox (envd) data plane of the E2B-compatible API, as one ASGI app.

Requests arrive on the service's own port carrying ``E2b-Sandbox-Id`` (see
:mod:`sandrl.sandbox.e2b.gateway`) and are served here:

- ``/process.Process/*`` and ``/filesystem.Filesystem/*``: Connect RPC, by the code generated
  from sandrl's own ``proto/*.proto`` (:mod:`.processes`, :mod:`.filesystem`);
- ``GET /files?path=``: a file's bytes, streamed; ``POST /files``: upload, as
  ``multipart/form-data`` (one part per file, named by its filename or ``?path=``) or
  ``application/octet-stream`` (``?path=``, optionally ``Content-Encoding: gzip``), streamed
  into the sandbox; the answer lists what was written;
- ``GET /health`` (204) and ``POST /init`` (204; sandrl needs no init).

Every call must carry the sandbox's envd access token as ``X-Access-Token``. Errors of the
HTTP routes are ``{"code", "message"}`` JSON as envd answers them; a sandbox that is gone is
a 502 whose message says it "was not found", which the SDK raises as
``SandboxNotRunningException``.
"""

from __future__ import annotations

import errno
import json
import posixpath
import zlib
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send as StarletteSend

from sandrl.errors import SandboxFileError, SandrlError
from sandrl.sandbox.e2b.filesystem import FilesystemService, absolute
from sandrl.sandbox.e2b.processes import ProcessService
from sandrl.sandbox.e2b.proto.filesystem_connect import FilesystemASGIApplication
from sandrl.sandbox.e2b.proto.process_connect import ProcessASGIApplication
from sandrl.sandbox.e2b.state import E2BRegistry, Refused, resolve
from sandrl.sandbox.service import Entry
from sandrl.sandbox.service_auth import Receive, Scope, Send

UPLOAD_CHUNK = 1 << 20
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


class EnvdApp:
    """Serves envd's routes for every sandbox of one service."""

    def __init__(self, registry: E2BRegistry) -> None:
        self.registry = registry
        self.process = ProcessASGIApplication(ProcessService(registry))
        self.filesystem = FilesystemASGIApplication(FilesystemService(registry))

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
        stream = sandbox.read_file_stream(path)
        try:
            first = await anext(stream, b"")  # a missing file fails here, before the response starts
        except SandrlError as exc:
            raise _file_error(exc, path) from exc
        svc = self.registry.service

        async def body() -> AsyncIterator[bytes]:
            with svc.busy(entry):
                if first:
                    yield first
                async for chunk in stream:
                    yield chunk

        name = posixpath.basename(path)
        return StreamingResponse(
            body(),
            media_type="application/octet-stream",
            headers={"Content-Disposition": f"attachment; filename*=UTF-8''{_quote(name)}"},
        )

    async def _upload(self, request: Request) -> Response:
        entry = self._sandbox(request)
        limit = self.registry.service.config.max_file_bytes
        content_type = request.headers.get("content-type", "")
        query_path = request.query_params.get("path")
        written: list[dict[str, Any]] = []
        if content_type.startswith("application/octet-stream"):
            if not query_path:
                raise EnvdError(400, "an octet-stream upload needs ?path=<file in the sandbox>")
            gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
            await self._write(entry, query_path, _limited(_decoded(request.stream(), gzipped), limit))
            written.append(_info(entry, query_path))
        elif content_type.startswith("multipart/form-data"):
            form = await request.form(max_files=10_000, max_fields=10_000)
            try:
                files = [(key, v) for key, v in form.multi_items() if isinstance(v, UploadFile)]
                if not files:
                    raise EnvdError(400, "the multipart upload has no file part")
                for _, upload in files:
                    target = query_path if query_path and len(files) == 1 else upload.filename
                    if not target:
                        raise EnvdError(400, "a file part has no filename: name each part by its path in the sandbox")
                    await self._write(entry, target, _limited(_parts(upload), limit))
                    written.append(_info(entry, target))
            finally:
                await form.close()
        else:
            raise EnvdError(400, "POST /files takes multipart/form-data or application/octet-stream")
        return Response(json.dumps(written), media_type="application/json")

    async def _write(self, entry: Entry, path: str, chunks: AsyncIterator[bytes]) -> None:
        svc = self.registry.service
        sandbox = svc.streaming(entry)
        try:
            with svc.busy(entry):
                if sandbox is not None:
                    await sandbox.write_file_stream(path, chunks)
                else:
                    await entry.sandbox.write_file(path, b"".join([c async for c in chunks]))
        except SandrlError as exc:
            raise _file_error(exc, path) from exc


def _info(entry: Entry, path: str) -> dict[str, Any]:
    full = absolute(entry, path)
    return {"name": posixpath.basename(full), "type": "file", "path": full}


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


async def _decoded(chunks: AsyncIterator[bytes], gzipped: bool) -> AsyncIterator[bytes]:
    if not gzipped:
        async for chunk in chunks:
            if chunk:
                yield chunk
        return
    inflate = zlib.decompressobj(wbits=31)
    try:
        async for chunk in chunks:
            while chunk:
                out = inflate.decompress(chunk, UPLOAD_CHUNK)
                chunk = inflate.unconsumed_tail
                if out:
                    yield out
        if tail := inflate.flush():
            yield tail
    except zlib.error as exc:
        raise EnvdError(400, f"the upload is not valid gzip: {exc}") from exc


async def _limited(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    seen = 0
    async for chunk in chunks:
        seen += len(chunk)
        if seen > limit:
            raise EnvdError(413, f"the file is over this server's limit of {limit} bytes")
        yield chunk


async def _parts(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(UPLOAD_CHUNK):
        yield chunk
