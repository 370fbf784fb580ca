"""SGLang's control routes on the embedded engine: weights, versions, pause / continue, abort, server info, load.

Each route takes SGLang's request fields (``io_struct.py``) and answers SGLang's shapes; what
the engine cannot do is a 400 that says why, and what is meaningless on a CPU engine is an
accepted no-op whose meaning the table in :mod:`sandrl.inference.server` states.
"""

from __future__ import annotations

import json
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from sandrl import __version__
from sandrl.errors import ConfigError, SandrlError
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.batch import PAUSE_MODES, PauseMode
from sandrl.inference.kv_capacity import loads_answer
from sandrl.inference.routes_shared import engine_of, served_name

# What release/resume_memory_occupation may name (SGLang's GPU memory tags).
_MEMORY_TAGS = frozenset({"weights", "kv_cache", "cuda_graph"})

router = APIRouter()


class UpdateWeightsRequest(BaseModel):
    """SGLang's ``UpdateWeightFromDiskReqInput``, plus sandrl's ``update_policy``."""

    model_config = ConfigDict(extra="forbid")

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | int | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: dict[str, Any] | None = None
    rid: str | None = None
    update_policy: UpdatePolicy | None = None
    """sandrl's: what this update does to requests in flight; default: the server's (``sandrl serve inference
    --update-policy``; ``pause``, SGLang's behaviour, unless told otherwise)."""


class UpdateWeightVersionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    new_version: str | int
    abort_all_requests: bool = True
    rid: str | None = None


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rid: str | None = ""
    abort_all: bool = False
    finished_reason: dict[str, Any] | None = None
    abort_message: str | None = None


class LoadLoraAdapterRequest(BaseModel):
    """SGLang's ``LoadLoRAAdapterReqInput``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None
    rid: str | None = None


class UnloadLoraAdapterRequest(BaseModel):
    """SGLang's ``UnloadLoRAAdapterReqInput``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_id: str | None = None
    rid: str | None = None


class MemoryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tags: list[str] | None = None
    rid: str | None = None


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(body: UpdateWeightsRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        if body.load_format not in (None, "auto", "safetensors"):
            raise ConfigError(
                f"/update_weights_from_disk: load_format={body.load_format!r} is not supported; sandrl loads "
                "Hugging Face safetensors checkpoints (leave load_format out, or send 'auto')"
            )
        if body.manifest is not None:
            raise ConfigError("/update_weights_from_disk: manifest (tensor metadata) is not supported; leave it out")
        version = int_version(body.weight_version, "weight_version")
        if body.abort_all_requests:
            engine.abort()
        # SGLang's update waits for the requests in flight (its writer lock): "pause" unless the server or
        # the request says otherwise.
        policy = body.update_policy or server_policy(request)
        new = await engine.update_weights(body.model_path, version=version, policy=policy)
        if body.keep_pause:
            await engine.pause("in_place")
    except SandrlError as exc:
        status = exc.http_status if exc.http_status < 500 else 500
        content = {"success": False, "message": exc.message, "num_paused_requests": 0}
        return JSONResponse({**content, "code": status, "error_code": exc.error_code}, status_code=status)
    request.app.state.token_step = body.token_step
    return JSONResponse(
        {
            "success": True,
            "message": f"Succeeded to update model weights from {body.model_path}. Weight version updated to {new}.",
            "num_paused_requests": 0,
            "weight_version": str(new),
        }
    )


_NOT_SERVED = (
    "sandrl's CPU engine takes new weights from a checkpoint directory or a gloo process group: {route} hands "
    "over tensors through {how}, which a CPU process serving HTTP cannot open (and unpickling bytes sent over HTTP "
    "would run arbitrary code). Broadcast them (/init_weights_update_group, /update_weights_from_distributed) or "
    "save them (sandrl.inference.model.save_weights) and POST /update_weights_from_disk."
)


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request) -> JSONResponse:
    how = "torch multiprocessing handles (pickled CUDA IPC or shared-memory tensors)"
    return _refused(_NOT_SERVED.format(route="/update_weights_from_tensor", how=how))


@router.post("/update_weights_from_ipc")
async def update_weights_from_collective(request: Request) -> JSONResponse:
    route = request.url.path
    return _refused(_NOT_SERVED.format(route=route, how="CUDA IPC handles"))


@router.post("/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        await engine.load_lora_adapter(body.lora_name, body.lora_path)
    except SandrlError as exc:
        return _lora_failure(exc, engine.lora_adapters)
    return JSONResponse({"success": True, "error_message": None, "loaded_adapters": _adapters(engine.lora_adapters)})


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        await engine.unload_lora_adapter(body.lora_name)
    except SandrlError as exc:
        return _lora_failure(exc, engine.lora_adapters)
    return JSONResponse({"success": True, "error_message": None, "loaded_adapters": _adapters(engine.lora_adapters)})


def _adapters(paths: dict[str, str]) -> dict[str, dict[str, Any]]:
    """SGLang's ``loaded_adapters``: name -> its ``LoRARef`` (sandrl's ids are the names)."""
    return {
        name: {"lora_id": name, "lora_name": name, "lora_path": path, "pinned": False} for name, path in paths.items()
    }


def _lora_failure(exc: SandrlError, paths: dict[str, str]) -> JSONResponse:
    """SGLang's failed ``LoRAUpdateOutput`` (400), with sandrl's error fields beside it."""
    status = exc.http_status if exc.http_status < 500 else 500
    body = {"success": False, "error_message": exc.message, "loaded_adapters": _adapters(paths)}
    return JSONResponse({**body, "code": status, "error_code": exc.error_code, "message": exc.message}, status)


@router.post("/update_weight_version")
async def update_weight_version(body: UpdateWeightVersionRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    version = int_version(body.new_version, "new_version")
    assert version is not None
    if body.abort_all_requests:
        engine.abort()
    await engine.set_weight_version(version)
    return JSONResponse(
        {"success": True, "message": f"Weight version updated to {body.new_version}", "new_version": body.new_version}
    )


@router.post("/pause_generation")
async def pause_generation(request: Request) -> JSONResponse:
    # SGLang before 0.5.6 took no body (and aborted); later ones take {"mode": ...}, default "abort".
    raw = await request.body()
    body = json.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict) or set(body) - {"mode", "rid"}:
        raise ConfigError(f"/pause_generation takes {{'mode': one of {list(PAUSE_MODES)}}}, got {raw[:200]!r}")
    mode = body.get("mode") or "abort"
    if mode not in PAUSE_MODES:
        raise ConfigError(f"/pause_generation: mode={mode!r} is not one of {list(PAUSE_MODES)}")
    await engine_of(request).pause(_pause_mode(mode))
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
async def continue_generation(request: Request) -> JSONResponse:
    await engine_of(request).continue_generation()
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> Response:
    engine = engine_of(request)
    if body.abort_all:
        engine.abort()
    elif body.rid:
        engine.abort(body.rid)
    return Response(status_code=200)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    # SGLang refuses while requests run (its radix tree holds their KV); here each request keeps its own.
    await engine_of(request).flush_cache()
    return Response("Cache flushed.\n", status_code=200)


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def memory_occupation(request: Request) -> Response:
    raw = await request.body()
    body = MemoryRequest.model_validate(json.loads(raw) if raw.strip() else {})
    unknown = sorted(set(body.tags or ()) - _MEMORY_TAGS)
    if unknown:
        raise ConfigError(f"{request.url.path}: unknown tags {unknown}; SGLang's are {sorted(_MEMORY_TAGS)}")
    # Really let go of the memory and take it back (sandrl.inference.engine_memory); SGLang answers 200.
    engine = engine_of(request)
    if request.url.path == "/release_memory_occupation":
        freed = await engine.release_memory_occupation(body.tags)
        return JSONResponse({"success": True, "freed_weight_bytes": freed})
    await engine.resume_memory_occupation(body.tags)
    return JSONResponse({"success": True})


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    return {
        "model_path": engine.model_path,
        "tokenizer_path": engine.model_path if engine.tokenizer is not None else None,
        "served_model_name": served_name(request),
        "weight_version": str(engine.weight_version),
        "context_length": engine.max_context,
        "max_running_requests": engine.config.max_batch_size,
        "max_prefill_tokens": engine.config.max_prefill_tokens,
        "random_seed": engine.config.seed,
        "update_policy": server_policy(request),
        "update_policies": list(UPDATE_POLICIES),
        "token_step": getattr(request.app.state, "token_step", 0),
        "return_original_logprob": request.app.state.return_original_logprob,
        "max_loaded_loras": engine.config.max_loras,
        "max_lora_rank": engine.config.max_lora_rank,
        "disable_radix_cache": not engine.prefix_cache.max_tokens,
        "prefix_cache_tokens": engine.prefix_cache.max_tokens,
        "max_total_num_tokens": engine.kv_budget.max_tokens or None,
        "loaded_lora_adapters": sorted(engine.lora_adapters),
        "internal_states": [{"#running_req": engine.running, "paused": engine.paused}],
        "version": __version__,
        "engine": "sandrl",
    }


@router.get("/v1/loads")
async def loads(request: Request) -> dict[str, Any]:
    """SGLang's load report, one entry (this engine): running and waiting requests, the KV tokens in use and
    the bound (``max_total_num_tokens``: null without ``--kv-cache-tokens``); what admission by capacity reads
    (:mod:`sandrl.inference.kv_admission`). Plus sandrl's ``kv_retractions`` (running requests retracted so far)."""
    engine = engine_of(request)
    answer = loads_answer([await engine.kv_capacity()])
    answer["loads"][0]["kv_retractions"] = engine.stats.kv_retractions
    return answer


@router.get("/get_load")
async def get_load(request: Request) -> list[dict[str, Any]]:
    """SGLang's older load report (``dp_rank``, ``num_reqs``: running and waiting, ``num_waiting_reqs``,
    ``num_tokens``: KV tokens in use)."""
    reading = await engine_of(request).kv_capacity()
    return [
        {
            "dp_rank": 0,
            "num_reqs": reading.running + reading.queued,
            "num_waiting_reqs": reading.queued,
            "num_tokens": reading.used_tokens or 0,
        }
    ]


def server_policy(request: Request) -> UpdatePolicy:
    """The server's default weight-update policy (``create_app(update_policy=...)``)."""
    return cast(UpdatePolicy, getattr(request.app.state, "update_policy", "pause"))


def _refused(message: str) -> JSONResponse:
    return JSONResponse(
        {"success": False, "message": message, "code": 400, "error_code": "not_supported"}, status_code=400
    )


def _pause_mode(mode: str) -> PauseMode:
    return "retract" if mode == "retract" else "in_place" if mode == "in_place" else "abort"


def int_version(value: str | int | None, field: str) -> int | None:
    """sandrl's versions are integers (the trainer's step); SGLang's are strings that hold one here."""
    if value is None or isinstance(value, int):
        return value
    if value.strip().lstrip("-").isdigit():
        return int(value)
    raise ConfigError(f"{field}={value!r}: sandrl's weight versions are integers (the trainer step); send e.g. '12'")
