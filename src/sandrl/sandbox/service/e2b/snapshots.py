"""E2B's snapshots and forks over the sandbox service: create, list, delete a snapshot; fork a sandbox.

- ``create_snapshot`` (``POST /sandboxes/{id}/snapshots``) captures the sandbox's files as an image
  of the server's store (:mod:`sandrl.sandbox.bwrap.snapshot`); its id is the image's name and a
  template any create can start from. Processes are not in it: a filesystem snapshot.
- ``list_snapshots`` (``GET /snapshots``, ``?sandboxID=`` for one sandbox's, ``?name=``) lists the
  store's snapshots, oldest first, paged by the ``x-next-token`` header as E2B pages lists; the
  images forks make for themselves are not snapshots and are not listed.
- ``delete_snapshot`` (``DELETE /templates/{id}``) removes a snapshot and the layers only it
  held once no sandbox runs on them; other templates are not deleted through this API.
- ``fork`` (``POST /sandboxes/{id}/fork``) makes ``count`` sandboxes from the sandbox's files as
  they are now, with its limits and labels; it keeps running.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandrl.errors import ImageNotFoundError
from sandrl.sandbox.base import SnapshotProvider
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.snapshot import SnapshotRecord, list_snapshots, snapshot_record
from sandrl.sandbox.service.e2b.control import (
    LIST_LIMIT,
    SandboxId,
    not_supported,
    paged,
    registry_of,
    sandbox_body,
)
from sandrl.sandbox.service.routes import ERRORS

router = APIRouter(tags=["e2b"])


class SnapshotBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str | None = Field(default=None, max_length=128)


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: int | None = Field(default=None, ge=1)
    count: int = Field(default=1, ge=1, le=256)


def _store(request: Request) -> ImageStore:
    images = getattr(registry_of(request).service.provider, "images", None)
    if not isinstance(images, ImageStore):
        raise not_supported("snapshots", "this server's sandbox backend keeps no image store")
    return images


def _info(record: SnapshotRecord) -> dict[str, Any]:
    return {"snapshotID": record.name, "names": [record.name]}


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def create_snapshot(sandbox_id: SandboxId, body: SnapshotBody, request: Request) -> JSONResponse:
    """Snapshot a sandbox's files (``Sandbox.create_snapshot``); the snapshot is a template: create
    from it by its id. Processes are not in it (a filesystem snapshot)."""
    svc = registry_of(request).service
    name = await svc.snapshot(svc.get(sandbox_id), body.name)
    return JSONResponse({"snapshotID": name, "names": [name]}, status_code=201)


def _named(record: SnapshotRecord, name: str) -> bool:
    """E2B's ``name`` filter: a name or id, maybe ``namespace/`` qualified or ``:tag`` qualified."""
    return record.name == name.rpartition("/")[2].partition(":")[0]


@router.get("/snapshots", responses={k: ERRORS[k] for k in (400, 401)})
async def list_all(
    request: Request,
    sandboxID: Annotated[str | None, Query(max_length=128, description="Only this sandbox's snapshots.")] = None,
    name: Annotated[str | None, Query(max_length=256, description="Only the snapshot of this name or id.")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT)] = LIST_LIMIT,
    nextToken: Annotated[str | None, Query(max_length=32)] = None,
) -> JSONResponse:
    """The server's snapshots (``Sandbox.list_snapshots``), oldest first; paged by ``x-next-token``."""
    records = [
        r
        for r in list_snapshots(_store(request))
        if (sandboxID is None or r.source == sandboxID) and (name is None or _named(r, name))
    ]
    page, headers = paged(records, nextToken, limit)
    return JSONResponse([_info(r) for r in page], headers=headers)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201, responses={k: ERRORS[k] for k in (400, 401, 404, 429)})
async def fork(sandbox_id: SandboxId, body: ForkBody, request: Request) -> JSONResponse:
    """Fork a sandbox into ``count`` new ones (``Sandbox.fork``): its files as they are now, its
    limits and labels; it keeps running."""
    registry = registry_of(request)
    entry = registry.service.get(sandbox_id)
    children = await registry.service.fork(entry, body.count, float(body.timeout) if body.timeout else None)
    template = registry.template_of(entry)
    results = []
    for child in children:
        registry.add(child, template)
        results.append({"sandbox": sandbox_body(registry, child)})
    return JSONResponse(results, status_code=201)


@router.delete("/templates/{template_id}", status_code=204, responses={k: ERRORS[k] for k in (400, 401, 404)})
async def delete_snapshot(template_id: str, request: Request) -> Response:
    """Delete a snapshot (``Sandbox.delete_snapshot``) and the layers only it held, once no sandbox
    runs on them (until then `sandrl images prune` leaves them); other templates are not deleted here."""
    provider = registry_of(request).service.provider
    store = _store(request)
    if not isinstance(provider, SnapshotProvider):
        raise not_supported("deleting snapshots", "this server's sandbox backend makes none")
    if snapshot_record(store, template_id) is None:
        if not store.exists(template_id):
            raise ImageNotFoundError(f"no snapshot {template_id!r} on this server (Sandbox.list_snapshots lists them)")
        raise not_supported("deleting templates", "only snapshots can be deleted through this API")
    await provider.remove_image(template_id)
    return Response(status_code=204)
