"""SGLang's routes for weights over a process group, on the embedded engine (gloo on CPU; sandrl's ``shm``, the
bucket through this host's shared memory, for a trainer on this host: :mod:`~sandrl.inference.weight_shm`).

- ``POST /init_weights_update_group`` (``master_address``, ``master_port``, ``rank_offset``,
  ``world_size``, ``group_name``, ``backend``): join the trainer's group as rank ``rank_offset``;
  answers once every rank has joined (the trainer joins as rank 0 at the same time).
- ``POST /update_weights_from_distributed`` (``names``, ``dtypes``, ``shapes``, ``group_name``,
  ``weight_version``, ``flush_cache``, ``abort_all_requests``; sandrl's ``update_policy``): receive
  the bucket the trainer broadcasts now. The engine stages buckets and swaps the new weights in
  whole once they cover every weight (:mod:`~sandrl.inference.weight_receiver`): the answer says
  ``staged`` until then, and the new ``weight_version`` with the bucket that completes them.
- ``POST /destroy_weights_update_group`` (``group_name``): leave it.

All three are control routes (:data:`~sandrl.inference.auth.CONTROL_PATHS`): the server's token only.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from sandrl.errors import SandrlError
from sandrl.inference.base import UpdatePolicy
from sandrl.inference.routes_shared import engine_of
from sandrl.inference.sglang_control import int_version, server_policy
from sandrl.inference.weight_group import GroupAddress

router = APIRouter()
DEFAULT_GROUP = "weight_update_group"
"""SGLang's default ``group_name``."""


class InitGroupRequest(BaseModel):
    """SGLang's ``InitWeightsUpdateGroupReqInput``."""

    model_config = ConfigDict(extra="forbid")

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP
    backend: str = "nccl"
    timeout_s: float = 300.0
    """sandrl's: how long to wait for every rank to join."""


class DistributedUpdateRequest(BaseModel):
    """SGLang's ``UpdateWeightsFromDistributedReqInput``, plus sandrl's ``update_policy``."""

    model_config = ConfigDict(extra="forbid")

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | int | None = None
    load_format: str | None = None
    update_policy: UpdatePolicy | None = None


class DestroyGroupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_name: str = DEFAULT_GROUP


@router.post("/init_weights_update_group")
async def init_weights_update_group(body: InitGroupRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        address = GroupAddress(body.master_address, body.master_port, body.world_size, body.group_name, body.backend)
        await engine.init_weights_update_group(address, body.rank_offset, timeout_s=body.timeout_s)
    except SandrlError as exc:
        return _failed(exc)
    return JSONResponse({"success": True, "message": f"Succeeded to initialize group {body.group_name}."})


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(body: DistributedUpdateRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        version = int_version(body.weight_version, "weight_version")
        if body.abort_all_requests:
            engine.abort()
        new = await engine.update_weights_from_distributed(
            body.group_name,
            body.names,
            body.dtypes,
            body.shapes,
            version=version,
            policy=body.update_policy or server_policy(request),
        )
    except SandrlError as exc:
        return _failed(exc)
    if new is None:
        missing = engine.weights_not_staged()
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        message = f"Staged {len(body.names)} tensors; the update still lacks {shown}."
        return JSONResponse({"success": True, "staged": True, "message": message, "missing": len(missing)})
    return JSONResponse(
        {
            "success": True,
            "staged": False,
            "message": f"Succeeded to update model weights. Weight version updated to {new}.",
            "weight_version": str(new),
        }
    )


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(body: DestroyGroupRequest, request: Request) -> JSONResponse:
    try:
        await engine_of(request).destroy_weights_update_group(body.group_name)
    except SandrlError as exc:
        return _failed(exc)
    return JSONResponse({"success": True, "message": f"Succeeded to destroy group {body.group_name}."})


def _failed(exc: SandrlError) -> JSONResponse:
    status = exc.http_status if exc.http_status < 500 else 500
    return JSONResponse(
        {"success": False, "message": exc.message, "code": status, "error_code": exc.error_code}, status_code=status
    )
