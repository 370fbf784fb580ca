"""The E2B control plane over the sandbox service: create, get, list, kill, timeout, connect, pause.

Mounted on the service's app next to the native ``/v1`` router, behind the same auth (E2B's
``X-API-Key`` is the service's token, see :mod:`.gateway`), body limits and error handlers:
errors are ``{"code", "error_code", "message"}``, which is E2B's own error shape.

- **Templates** map to sandrl images: ``base`` to the default image ``host``, any other name
  (``name`` or ``name:latest``) to the image of that name in the server's store.
- ``timeout`` is the sandbox's TTL in seconds; ``metadata`` its labels (the list filter);
  ``envVars`` the environment of every command; ``allow_internet_access=true`` gives egress
  through NAT (never to the host or its private network), as sandrl's ``network=True`` does; by
  default a sandbox has loopback only.
- **Pause** freezes the sandbox's processes (memory kept) and stops its TTL; ``connect`` (and the
  older ``resume``) thaws it, and its TTL goes on. A sandbox running a command is not paused (409).
  With ``autoPause`` (the SDK's ``lifecycle={"on_timeout": "pause"}``) a sandbox is paused at its
  timeout instead of killed, once what runs in it has finished (within 30 s, else it is killed);
  ``connect`` resumes it with the connect's ``timeout``, or E2B's 15 s. A sandbox stays paused at
  most the server's ``max_paused_s``.
- ``get_info`` adds to the listing's fields the envd token, the network setting, the template's
  name (``alias``), the ``lifecycle`` (``onTimeout`` kill or pause) and, paused, ``pauseMode``
  ``full`` (memory kept). ``endAt`` of a paused sandbox is when it would end if resumed now.
- **Snapshots and forks** are in :mod:`.snapshots`, **metrics** in :mod:`.metrics`; what is not
  supported (``autoResume``, templates built through the SDK, network rules, volumes, MCP, IAM,
  logs) answers 400 ``not_supported`` saying so (:mod:`.unsupported`).
"""

from __future__ import annotations

import datetime
import math
import time
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandrl.errors import ImageNotFoundError, InvalidSpecError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap.images import HOST_IMAGE
from sandrl.sandbox.remote.wire import MetadataDict
from sandrl.sandbox.service.e2b.state import CLIENT_ID, DEFAULT_TEMPLATE, ENVD_VERSION, E2BRegistry
from sandrl.sandbox.service.errors import ServiceError
from sandrl.sandbox.service.routes import ERRORS
from sandrl.sandbox.service.state import Entry, SandboxService

router = APIRouter(tags=["e2b"])
SandboxId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,128}$", description="A sandbox id.")]
DEFAULT_TIMEOUT_S = 15
"""E2B's API default when a create names no timeout (the SDK itself sends 300)."""
LIST_LIMIT = 100


def paged(items: list[Any], next_token: str | None, limit: int) -> tuple[list[Any], dict[str, str]]:
    """One page of ``items`` from E2B's ``nextToken`` (an offset this server gave), and the header naming the next."""
    try:
        start = int(next_token or 0)
    except ValueError:
        raise ServiceError(
            "nextToken is not one this server gave", error_code="invalid_request", http_status=400
        ) from None
    headers = {"x-next-token": str(start + limit)} if start + limit < len(items) else {}
    return items[start : start + limit], headers


def registry_of(request: Request) -> E2BRegistry:
    registry: E2BRegistry = request.app.state.e2b
    return registry


def not_supported(what: str, hint: str = "") -> ServiceError:
    return ServiceError(
        f"{what} is not supported yet by sandrl's E2B-compatible API" + (f": {hint}" if hint else ""),
        error_code="not_supported",
        http_status=400,
    )


class NewSandbox(BaseModel):
    """``POST /sandboxes`` and ``POST /v2/sandboxes`` (E2B's NewSandbox); unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    templateID: str = Field(min_length=1, max_length=256)
    timeout: int = Field(default=DEFAULT_TIMEOUT_S, ge=0)
    autoPause: bool = False
    autoResume: dict[str, Any] | None = None
    secure: bool | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    metadata: MetadataDict | None = None
    envVars: MetadataDict | None = None
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volumeMounts: list[Any] | None = None


class TimeoutBody(BaseModel):
    timeout: int = Field(ge=0, description="Seconds to live from now.")


class RefreshBody(BaseModel):
    duration: int = Field(default=60, ge=0, description="Seconds to live from now.")


class ConnectBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: int | None = Field(default=None, ge=0)


def image_for(template: str) -> str:
    name, _, tag = template.partition(":")
    if tag not in ("", "latest"):
        raise InvalidSpecError(
            f"template {template!r}: sandrl images have no tags; name the image alone (e.g. {name!r})"
        )
    return HOST_IMAGE if name == DEFAULT_TEMPLATE else name


def _check_supported(body: NewSandbox) -> None:
    if body.autoResume and body.autoResume.get("enabled", True):
        raise not_supported(
            "resuming paused sandboxes on traffic (autoResume)", "resume a paused sandbox with Sandbox.connect"
        )
    if body.network and any(v for v in body.network.values()):
        raise not_supported(
            "network rules (allowOut, denyOut, rules)",
            "use allow_internet_access=True for egress through NAT, or leave it out for loopback only",
        )
    if body.mcp:
        raise not_supported("MCP servers in sandboxes (mcp)")
    if body.iam:
        raise not_supported("workload identity (iam)")
    if body.volumeMounts:
        raise not_supported("volumes (volumeMounts)")


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def sandbox_body(registry: E2BRegistry, entry: Entry) -> dict[str, Any]:
    record = registry.of(entry)
    return {
        "templateID": record.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": record.access_token,
    }


def cpu_count(entry: Entry) -> int:
    """The whole cores E2B's ``cpuCount`` names for the sandbox's CPU quota (at least 1)."""
    return max(1, math.ceil(entry.spec.cpus - 1e-9))


def _state(entry: Entry) -> str:
    return "paused" if entry.paused_ttl_s is not None else "running"


def _listed(registry: E2BRegistry, entry: Entry) -> dict[str, Any]:
    spec = entry.spec
    paused = entry.paused_ttl_s
    return {
        "templateID": registry.template_of(entry),
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "startedAt": _iso(entry.created_at),
        "endAt": _iso(entry.expires_at if paused is None else time.time() + paused),
        "cpuCount": cpu_count(entry),
        "memoryMB": spec.memory_mb,
        "diskSizeMB": spec.disk_mb,
        "state": _state(entry),
        "envdVersion": ENVD_VERSION,
        "metadata": dict(entry.metadata),
    }


@router.post("/sandboxes", status_code=201, responses={k: ERRORS[k] for k in (400, 401, 404, 429, 503)})
@router.post("/v2/sandboxes", status_code=201, responses={k: ERRORS[k] for k in (400, 401, 404, 429, 503)})
async def create(body: NewSandbox, request: Request) -> JSONResponse:
    """Create a sandbox from a template (E2B's ``Sandbox.create``)."""
    _check_supported(body)
    registry = registry_of(request)
    image = image_for(body.templateID)
    spec = SandboxSpec(
        image=image,
        ttl_s=float(body.timeout),
        env=body.envVars or {},
        network=bool(body.allow_internet_access),
    )
    try:
        entry = await registry.service.create(spec, body.metadata or {}, auto_pause=body.autoPause)
    except ImageNotFoundError as exc:
        raise ImageNotFoundError(
            f"template {body.templateID!r} not found: E2B templates map to the sandrl images of the same name "
            f"('{DEFAULT_TEMPLATE}' to '{HOST_IMAGE}'); build one with `sandrl images build` ({exc.message})"
        ) from exc
    registry.add(entry, body.templateID)
    return JSONResponse(sandbox_body(registry, entry), status_code=201)


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """E2B's ``?metadata=``: one url-encoded ``k=v&k2=v2`` string whose keys and values are quoted once more."""
    if not raw:
        return {}
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def _listing(service: SandboxService, metadata: str | None, state: str | None) -> list[Entry]:
    """The sandboxes with every label of ``metadata`` in one of the ``state`` s (default: running and paused)."""
    states = {s.strip() for s in (state or "running,paused").split(",") if s.strip()}
    entries = [e for e in service.list(_metadata_filter(metadata)) if _state(e) in states]
    return sorted(entries, key=lambda e: e.created_at)


@router.get("/v2/sandboxes", responses={k: ERRORS[k] for k in (400, 401)})
async def list_v2(
    request: Request,
    metadata: Annotated[str | None, Query(description="url-encoded k=v&k2=v2")] = None,
    state: Annotated[str | None, Query(description="running,paused")] = None,
    order: Annotated[str | None, Query(pattern="^(asc|desc)$")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT)] = LIST_LIMIT,
    nextToken: Annotated[str | None, Query(max_length=32)] = None,  # E2B's name
) -> JSONResponse:
    """The running sandboxes, with every given metadata label; paged by the ``x-next-token`` header."""
    registry = registry_of(request)
    entries = _listing(registry.service, metadata, state)
    if order == "desc":
        entries.reverse()
    page, headers = paged(entries, nextToken, limit)
    return JSONResponse([_listed(registry, e) for e in page], headers=headers)


@router.get("/sandboxes", responses={k: ERRORS[k] for k in (400, 401)})
async def list_v1(request: Request, metadata: str | None = None) -> JSONResponse:
    """The running sandboxes (E2B's older list route, unpaged)."""
    registry = registry_of(request)
    return JSONResponse([_listed(registry, e) for e in _listing(registry.service, metadata, None)])


@router.get("/sandboxes/{sandbox_id}", responses={k: ERRORS[k] for k in (401, 404)})
async def get(sandbox_id: SandboxId, request: Request) -> JSONResponse:
    registry = registry_of(request)
    entry = registry.service.get(sandbox_id)
    body = _listed(registry, entry)
    body["envdAccessToken"] = registry.of(entry).access_token
    body["allowInternetAccess"] = entry.spec.network
    body["alias"] = body["templateID"]
    body["lifecycle"] = {"onTimeout": "pause" if entry.auto_pause else "kill", "autoResume": False}
    if entry.paused_ttl_s is not None:
        body["pauseMode"] = "full"  # the processes are frozen with their memory
    return JSONResponse(body)


@router.delete("/sandboxes/{sandbox_id}", status_code=204, responses={k: ERRORS[k] for k in (401, 404)})
async def kill(sandbox_id: SandboxId, request: Request) -> Response:
    svc = registry_of(request).service
    await svc.delete(svc.get(sandbox_id))
    registry_of(request).prune()
    return Response(status_code=204)


async def _extend(svc: SandboxService, entry: Entry, seconds: int) -> None:
    if seconds < 1:
        raise InvalidSpecError(f"timeout={seconds} is too short: give at least 1 second")
    await svc.extend(entry, float(seconds))


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def set_timeout(sandbox_id: SandboxId, body: TimeoutBody, request: Request) -> Response:
    """The sandbox lives ``timeout`` seconds from now (shorter or longer than before)."""
    svc = registry_of(request).service
    await _extend(svc, svc.get(sandbox_id), body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def refresh(sandbox_id: SandboxId, body: RefreshBody, request: Request) -> Response:
    svc = registry_of(request).service
    await _extend(svc, svc.get(sandbox_id), body.duration)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/connect", responses={k: ERRORS[k] for k in (400, 401, 404)})
@router.post("/v2/sandboxes/{sandbox_id}/connect", responses={k: ERRORS[k] for k in (400, 401, 404)})
async def connect(sandbox_id: SandboxId, body: ConnectBody, request: Request) -> JSONResponse:
    """Connect to a sandbox (``Sandbox.connect``), resuming it if it is paused; a ``timeout`` only
    ever lengthens its life, or gives one to a sandbox paused at its timeout (else E2B's default).
    Its memory is always kept (a pause freezes the processes)."""
    registry = registry_of(request)
    entry = registry.service.get(sandbox_id)
    resumed = entry.paused_ttl_s is not None
    await registry.service.resume(entry, after_timeout_s=float(body.timeout or DEFAULT_TIMEOUT_S))
    if body.timeout is not None and time.time() + body.timeout > entry.expires_at:
        await _extend(registry.service, entry, body.timeout)
    return JSONResponse(sandbox_body(registry, entry), status_code=201 if resumed else 200)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def pause(sandbox_id: SandboxId, request: Request) -> Response:
    """Pause a sandbox (``Sandbox.pause``): its processes freeze where they are, memory kept, its TTL
    stopped; ``connect`` resumes it. 409 when it is paused already, as E2B's API answers."""
    svc = registry_of(request).service
    if not await svc.pause(svc.get(sandbox_id)):
        raise ServiceError(f"sandbox {sandbox_id} is paused already", error_code="conflict", http_status=409)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def resume(sandbox_id: SandboxId, body: ConnectBody, request: Request) -> JSONResponse:
    """E2B's older resume route: the same as ``connect``."""
    return await connect(sandbox_id, body, request)
