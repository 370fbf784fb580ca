"""The native ``/v1`` routes of the sandbox service (mounted by :func:`sandrl.sandbox.service.server.create_app`).

File paths are passed as given to the agent inside the sandbox, which resolves them in the
sandbox's own mount namespace: ``..`` and symlinks cannot reach the host, and nothing is
resolved on the host side. File and tar bodies are streamed both ways in chunks, never
buffered whole. Uploads are bounded by the sandbox's disk (:meth:`SandboxService.upload_limit`):
one declared longer is refused before its body is read, a streamed one is cut once it passes the
bound. Command output and tar downloads are paced by their reader: the provider's process handle
stops reading a command's pipes while its reader is behind (:meth:`BwrapProcess.output`), and
nothing here takes a chunk before the previous one was sent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import errno
import json
import shlex
import signal
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, cast

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from sandrl.errors import InvalidCommandError, SandboxError, SandboxFileError, SandrlError
from sandrl.sandbox.base import ExecCall, OutputChunk, SandboxProcess
from sandrl.sandbox.command import check_command
from sandrl.sandbox.remote.frames import CHANNEL_PATH, UPGRADE
from sandrl.sandbox.remote.wire import (
    API_PREFIX,
    OCTET_MEDIA_TYPE,
    SSE_MEDIA_TYPE,
    TAR_MEDIA_TYPE,
    ChannelInfo,
    CreateRequest,
    ErrorBody,
    ExecRequest,
    ExecResponse,
    FileWritten,
    SandboxInfo,
    SandboxList,
    SpecBody,
    TimeoutRequest,
)
from sandrl.sandbox.service.auth import content_length
from sandrl.sandbox.service.errors import ServiceError
from sandrl.sandbox.service.state import BoundedBody, Entry, SandboxService, StreamingSandbox

_DESCRIPTIONS = {
    400: "Invalid request or spec",
    401: "Missing or wrong bearer token",
    404: "No such sandbox or file",
    410: "The sandbox closed",
    413: "Body over the limit (for uploads: over the sandbox's disk)",
    429: "Capacity exhausted",
    503: "Shutting down or unavailable",
    504: "The command overran its timeout",
    507: "The sandbox's disk is full",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in _DESCRIPTIONS.items()
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: ERRORS[c] for c in (400, 401, *codes)}


# Documents the scheme in the OpenAPI document; the check itself is auth.BearerAuth.
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "The server's token ($SANDRL_TOKEN or --token-file).",
}
"""How every route under the API prefix is authenticated, for the OpenAPI document (:func:`document_bearer`).
The check itself is :class:`~sandrl.sandbox.service.auth.BearerAuth`, in front of the app: a FastAPI
security dependency here would parse the header again on every request, for the document only."""
router = APIRouter(prefix=API_PREFIX, tags=["sandboxes"])


def document_bearer(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (an OpenAPI document) with the bearer scheme on every operation under the API prefix."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["HTTPBearer"] = BEARER_SCHEME
    for path, operations in schema.get("paths", {}).items():
        if path.startswith(API_PREFIX):
            for operation in operations.values():
                operation.setdefault("security", [{"HTTPBearer": []}])
    return schema


CHANNEL_EXTENSION = "sandrl.channel"
"""Set (to a dict) in the scope of an upgrade to the call channel: the app's route consents
(:func:`open_channel`) only then, and fills the dict with what the
channel's connection needs of it."""

SANDBOX_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
SandboxId = Annotated[str, Path(pattern=SANDBOX_ID_PATTERN, description="A sandbox id.")]
FilePath = Annotated[
    str,
    Query(min_length=1, max_length=4096, description="Path inside the sandbox; relative paths start at its workdir."),
]


def service_of(request: Request) -> SandboxService:
    return cast(SandboxService, request.app.state.service)


def _info(entry: Entry) -> SandboxInfo:
    return SandboxInfo(
        id=entry.id,
        spec=SpecBody.from_spec(entry.spec),
        metadata=entry.metadata,
        created_at=entry.created_at,
        expires_at=entry.expires_at,
    )


def _no_nul(value: str | None, what: str) -> None:
    if value is not None and "\0" in value:
        raise ServiceError(f"{what} cannot contain NUL bytes", error_code="invalid_request", http_status=400)


def _parse_metadata(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ServiceError(
                f"metadata filter {pair!r} is not key=value (e.g. ?metadata=run=7&metadata=user=ana)",
                error_code="invalid_request",
                http_status=400,
            )
        out[key] = value
    return out


def _json(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` serialized by pydantic-core in one call. The hot routes return this rather than the
    model: FastAPI would validate it against ``response_model`` again and walk it with
    ``jsonable_encoder``, which cost as much as the rest of an exec's handling."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


@router.get(
    "/channel",
    response_model=ChannelInfo,
    responses={426: {"model": ErrorBody, "description": "Sent without the upgrade"}, **_errors()},
)
async def open_channel(request: Request) -> Response:
    """Open the call channel: many calls in flight on one connection, answered in any order.

    Only as an upgrade (``Connection: Upgrade``, ``Upgrade: sandrl-channel/1``), answered
    ``101 Switching Protocols``; the framing is in :mod:`sandrl.sandbox.service.channel_frames`.
    Each call on it is served as the same request over HTTP would be. sandrl's ``RemoteProvider``
    opens it by itself.
    """
    # The docstring is the published OpenAPI description, kept byte for byte (#38): the framing
    # has since moved to sandrl.sandbox.remote.frames.
    consent = request.scope.get("extensions", {}).get(CHANNEL_EXTENSION)
    if consent is None:
        raise ServiceError(
            f"{CHANNEL_PATH} opens the call channel: send it with 'Connection: Upgrade' and "
            f"'Upgrade: {UPGRADE.decode()}' (sandrl's RemoteProvider does), or use the other routes over HTTP",
            error_code="upgrade_required",
            http_status=426,
        )
    svc = service_of(request)
    info = ChannelInfo(max_call_bytes=svc.config.max_json_bytes)
    # What the channel's connection needs of the app: its bounds, and the hot routes' handling.
    consent.update(
        max_call_bytes=info.max_call_bytes,
        max_unread=svc.config.max_unread_bytes,
        hot_calls=request.app.state.hot_calls,
        open=svc.metrics.channels,
    )
    return _json(info)


@router.post("/sandboxes", status_code=201, response_model=SandboxInfo, responses=_errors(404, 429, 503))
async def create_sandbox(body: CreateRequest, request: Request) -> Response:
    """Create a sandbox. At capacity: 429 capacity_exhausted at once, or after queueing up to ``wait_s``."""
    return await create(service_of(request), body)


async def create(svc: SandboxService, body: CreateRequest) -> Response:
    """``POST /sandboxes``, once the body is valid (also served by :mod:`.hot_routes`)."""
    spec = SpecBody.model_validate(body.model_dump(exclude={"metadata", "wait_s"})).to_spec()
    entry = await svc.create(spec, body.metadata, body.wait_s)
    return _json(_info(entry), 201)


@router.get("/sandboxes", response_model=SandboxList, responses=_errors())
async def list_sandboxes(
    request: Request,
    metadata: Annotated[list[str], Query(description="key=value; repeat to require several labels.")] = [],  # noqa: B006
) -> SandboxList:
    """The live sandboxes, those with every given metadata label only."""
    wanted = _parse_metadata(metadata)
    return SandboxList(sandboxes=[_info(e) for e in service_of(request).list(wanted)])


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo, responses=_errors(404))
async def get_sandbox(sandbox_id: SandboxId, request: Request) -> SandboxInfo:
    return _info(service_of(request).get(sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=204, responses=_errors(404))
async def delete_sandbox(sandbox_id: SandboxId, request: Request) -> Response:
    """Kill everything in the sandbox and remove it."""
    return await delete(service_of(request), sandbox_id)


async def delete(svc: SandboxService, sandbox_id: str) -> Response:
    """``DELETE /sandboxes/{id}`` (also served by :mod:`.hot_routes`)."""
    await svc.delete(svc.get(sandbox_id))
    return Response(status_code=204, media_type="application/json")  # what FastAPI answers for a None


@router.post("/sandboxes/{sandbox_id}/timeout", response_model=SandboxInfo, responses=_errors(404, 410))
async def set_timeout(sandbox_id: SandboxId, body: TimeoutRequest, request: Request) -> SandboxInfo:
    """Let the sandbox live ``ttl_s`` more seconds, counted from now."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    await svc.extend(entry, body.ttl_s)
    return _info(entry)


def _stdin(body: ExecRequest) -> bytes | None:
    if body.stdin is not None and body.stdin_b64 is not None:
        raise ServiceError("give stdin or stdin_b64, not both", error_code="invalid_request", http_status=400)
    if body.stdin_b64 is not None:
        try:
            return base64.b64decode(body.stdin_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ServiceError(
                f"stdin_b64 is not base64: {exc}", error_code="invalid_request", http_status=400
            ) from exc
    return body.stdin.encode() if body.stdin is not None else None


def _check_exec(body: ExecRequest) -> None:
    try:
        check_command(body.command)
    except InvalidCommandError as exc:
        raise ServiceError(exc.message, error_code="invalid_request", http_status=400) from None
    _no_nul(body.cwd, "cwd")
    if body.cwd is not None and not body.cwd:
        raise ServiceError(
            "cwd cannot be empty: leave it out for the workdir", error_code="invalid_request", http_status=400
        )


def _exec_call(body: ExecRequest) -> ExecCall:
    """The exec ``body`` asks for, checked."""
    _check_exec(body)
    return ExecCall(body.command, timeout_s=body.timeout_s, cwd=body.cwd, env=body.env, stdin=_stdin(body))


@router.post("/sandboxes/{sandbox_id}/exec", response_model=ExecResponse, responses=_errors(404, 410, 504))
async def exec_command(sandbox_id: SandboxId, body: ExecRequest, request: Request) -> Response:
    """Run a command to its end. A failing command is a result with its exit code, not an error."""
    return await exec_in(service_of(request), sandbox_id, body)


async def exec_in(svc: SandboxService, sandbox_id: str, body: ExecRequest) -> Response:
    """``POST /sandboxes/{id}/exec``, once the body is valid (also served by :mod:`.hot_routes`)."""
    entry = svc.get(sandbox_id)
    result = await svc.exec(entry, _exec_call(body))
    return _json(ExecResponse.of(result))


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


@router.post(
    "/sandboxes/{sandbox_id}/exec/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-sent events: started, stdout, stderr, then exit or error.",
            "content": {SSE_MEDIA_TYPE: {"schema": {"type": "string"}}},
        },
        **_errors(404, 410),
    },
)
async def exec_stream(sandbox_id: SandboxId, body: ExecRequest, request: Request) -> StreamingResponse:
    """Run a command, streaming its output as server-sent events (for long commands)."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    call = _exec_call(body)
    sandbox = svc.streaming(entry)
    if sandbox is None:
        result = await svc.exec(entry, call)

        async def whole() -> AsyncIterator[bytes]:
            for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
                if text:
                    yield _event(stream, {"text": text})
            yield _event("exit", ExecResponse.of(result).model_copy(update={"stdout": "", "stderr": ""}).model_dump())

        return StreamingResponse(whole(), media_type=SSE_MEDIA_TYPE)
    started = time.perf_counter()
    proc = await sandbox.spawn(
        call.command, timeout_s=call.timeout_s, cwd=call.cwd, env=call.env, stdin=call.stdin is not None
    )
    return StreamingResponse(
        _stream_events(svc, entry, proc, call.stdin, call.timeout_s, started),
        media_type=SSE_MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream_events(
    svc: SandboxService, entry: Entry, proc: SandboxProcess, stdin: bytes | None, timeout_s: float, started: float
) -> AsyncIterator[bytes]:
    decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
    finished = False
    chunks = proc.output()
    # One chunk is fetched at a time, the next only once this one is sent: a client that does not
    # read holds the command back (see BwrapProcess.output) instead of filling a queue here.
    pending: asyncio.Future[OutputChunk | None] | None = None
    with svc.busy(entry):
        try:
            yield _event("started", {"pid": proc.pid})
            if stdin is not None:
                await proc.write_stdin(stdin)
                await proc.close_stdin()
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(chunks, None))
                done, _ = await asyncio.wait({pending}, timeout=svc.config.keepalive_s)
                if not done:
                    yield b": keepalive\n\n"
                    continue
                item, pending = pending.result(), None
                if item is None:
                    break
                text = decoders[item.stream].decode(item.data)
                if text:
                    yield _event(item.stream, {"text": text})
            for stream, decoder in decoders.items():
                if tail := decoder.decode(b"", final=True):
                    yield _event(stream, {"text": tail})
            result = await svc.within_grace(entry, proc.wait(), timeout_s)
            finished = True
            svc.metrics.exec_seconds.observe(time.perf_counter() - started)
            yield _event("exit", ExecResponse.of(result).model_dump())
        except SandrlError as exc:
            finished = True
            svc.metrics.failures.labels(exc.error_code).inc()
            yield _event("error", {"code": exc.http_status, "error_code": exc.error_code, "message": exc.message})
        finally:
            if pending is not None:
                pending.cancel()
            if not finished:  # the client went away: the command must not run on unseen
                with contextlib.suppress(Exception):
                    await proc.signal(signal.SIGKILL)


def _mode(mode: str) -> int:
    return int(mode, 8)


ModeQuery = Annotated[str, Query(pattern=r"^[0-7]{3,4}$", description="Octal permission bits, e.g. 644 or 0755.")]


def _upload_body(svc: SandboxService, entry: Entry, request: Request, what: str) -> BoundedBody:
    """The request body, refused now (before it is read) if it says it will not fit, cut once it does not."""
    limit = svc.upload_limit(entry)
    try:
        declared = content_length(request.headers.get("content-length"))
    except ValueError as exc:
        raise ServiceError(str(exc), error_code="invalid_request", http_status=400) from None
    if declared is not None and declared > limit:
        raise svc.too_big(entry, what)
    return BoundedBody(request.stream(), limit)


_BINARY_BODY = {"required": True, "content": {OCTET_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}
_TAR_BODY = {"required": True, "content": {TAR_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}


@router.put(
    "/sandboxes/{sandbox_id}/files",
    response_model=FileWritten,
    responses=_errors(404, 410, 413, 507),
    openapi_extra={"requestBody": _BINARY_BODY},
)
async def put_file(sandbox_id: SandboxId, path: FilePath, request: Request, mode: ModeQuery = "644") -> FileWritten:
    """Write the request body to ``path`` (parents made), streamed."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    _no_nul(path, "path")
    body = _upload_body(svc, entry, request, "the file")
    with svc.busy(entry):
        sandbox = svc.streaming(entry)
        try:
            if sandbox is not None:
                size = await sandbox.write_file_stream(path, aiter(body), _mode(mode))
            else:
                data = b"".join([c async for c in body])
                if not body.over:
                    await entry.sandbox.write_file(path, data, _mode(mode))
                size = len(data)
        except SandboxFileError as exc:
            if body.over:  # the disk filled because the upload was too big: say that
                raise svc.too_big(entry, "the file") from exc
            raise
    if body.over:
        raise svc.too_big(entry, "the file")
    return FileWritten(path=path, size=size)


@router.get(
    "/sandboxes/{sandbox_id}/files",
    response_class=StreamingResponse,
    responses={
        200: {"content": {OCTET_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **_errors(404, 410),
    },
)
async def get_file(sandbox_id: SandboxId, path: FilePath, request: Request) -> StreamingResponse:
    """The bytes of the file at ``path``, streamed."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    _no_nul(path, "path")
    sandbox = svc.streaming(entry)
    if sandbox is None:
        data = await entry.sandbox.read_file(path)
        return StreamingResponse(iter([data]), media_type=OCTET_MEDIA_TYPE)
    return StreamingResponse(await svc.file_stream(entry, sandbox, path), media_type=OCTET_MEDIA_TYPE)


def _tar_sandbox(svc: SandboxService, entry: Entry) -> StreamingSandbox:
    sandbox = svc.streaming(entry)
    if sandbox is None:
        raise ServiceError(
            "this server's sandbox backend cannot stream processes, so it has no tar transfers: use /files",
            error_code="unsupported",
            http_status=400,
        )
    return sandbox


TAR_TIMEOUT_S = 3600.0


@router.put(
    "/sandboxes/{sandbox_id}/tar",
    response_model=FileWritten,
    responses=_errors(404, 410, 413, 507),
    openapi_extra={"requestBody": _TAR_BODY},
)
async def put_tar(sandbox_id: SandboxId, path: FilePath, request: Request) -> FileWritten:
    """Unpack the tar archive in the body into the directory ``path`` (made if missing), streamed."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    _no_nul(path, "path")
    sandbox = _tar_sandbox(svc, entry)
    body = _upload_body(svc, entry, request, "the archive")
    q = shlex.quote(path)
    with svc.busy(entry):
        proc = await sandbox.spawn(f"mkdir -p -- {q} && exec tar -x -f - -C {q}", timeout_s=TAR_TIMEOUT_S, stdin=True)
        size = 0
        try:
            async for chunk in body:
                size += len(chunk)
                await proc.write_stdin(chunk)
            if body.over:
                raise svc.too_big(entry, "the archive")
        except BaseException:
            await proc.signal(signal.SIGKILL)
            raise
        finally:
            await proc.close_stdin()
        result = await proc.wait()
    if result.exit_code != 0:
        detail = result.stderr.strip()[-500:] or "tar failed"
        full = "No space left on device" in detail or "Disk quota exceeded" in detail
        raise SandboxFileError(f"cannot unpack the archive into {path}: {detail}", errno=errno.ENOSPC if full else 0)
    return FileWritten(path=path, size=size)


@router.get(
    "/sandboxes/{sandbox_id}/tar",
    response_class=StreamingResponse,
    responses={
        200: {"content": {TAR_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **_errors(404, 410),
    },
)
async def get_tar(sandbox_id: SandboxId, path: FilePath, request: Request) -> StreamingResponse:
    """The directory ``path`` as a tar archive, streamed (paths in it are relative to ``path``)."""
    svc = service_of(request)
    entry = svc.get(sandbox_id)
    _no_nul(path, "path")
    sandbox = _tar_sandbox(svc, entry)
    q = shlex.quote(path)
    check = await entry.sandbox.exec(f"test -d {q}", timeout_s=30)
    if check.exit_code != 0:
        raise SandboxFileError(f"{path} is not a directory in sandbox {entry.id}", errno=2)
    proc = await sandbox.spawn(f"exec tar -c -f - -C {q} .", timeout_s=TAR_TIMEOUT_S, output_cap=0xFFFFFFFF)

    async def body() -> AsyncIterator[bytes]:
        done = False
        with svc.busy(entry):
            try:
                async for chunk in proc.output():
                    if chunk.stream == "stdout":
                        yield chunk.data
                result = await proc.wait()
                done = True
                if result.exit_code != 0:
                    # Too late for an error status: break the stream so the client cannot take it for whole.
                    raise SandboxError(f"tar of {path} failed: {result.stderr.strip()[-500:]}")
            finally:
                if not done:
                    with contextlib.suppress(Exception):
                        await proc.signal(signal.SIGKILL)

    return StreamingResponse(body(), media_type=TAR_MEDIA_TYPE)
