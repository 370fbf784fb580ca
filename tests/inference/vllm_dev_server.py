"""A real HTTP server in vLLM's shape, for the VLLMClient's weight-reload tests: sandrl's engine and
OpenAI routes behind vLLM's dev-mode control routes.

The control routes follow vLLM v0.34.0 (commit 62d4bc3c7, the PyPI sdist), route for route:
``POST /pause`` (query ``mode`` = ``abort`` | ``wait`` | ``keep``; in ``abort`` and ``wait`` modes new
requests get 503 until ``/resume``: ``vllm/entrypoints/rl/online/api_router.py``), ``POST /resume``,
``POST /collective_rpc`` (``{"method", "args", "kwargs", "timeout"}`` -> ``{"results": [...]}``;
``serve/dev/rpc/api_router.py``), ``reload_weights`` with ``weights_path`` (``v1/worker/gpu_worker.py``:
the label is not changed), ``POST /reset_prefix_cache`` (query ``reset_running_requests``: running
requests preempted, recomputed later; ``{"success": bool}``; ``serve/dev/cache/api_router.py`` and
``v1/core/sched/scheduler.py``), ``POST /update_weight_version`` (``{"new_version"}``) and
``GET /weight_info``, ``GET /health``, and ``GET /metrics`` with the load gauges of vLLM's Prometheus text
(``vllm/v1/metrics/loggers.py``: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:cache_config_info`` with ``block_size`` and ``num_gpu_blocks``), the
engine's own reading in 16-token blocks. vLLM's modes map onto the engine's pause modes: ``keep`` is ``in_place``,
a preempting prefix-cache reset is ``retract``, ``wait`` drains before pausing.

With ``lora_updating`` (vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) it also has vLLM's
``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (``vllm/entrypoints/openai/serving_models.py``):
200 with a plain-text ``Success: ...`` line; a missing field or a name already loaded is a 400, an unknown
name to unload a 404, a load that fails a 400, each an OpenAI error object. A request names a loaded
adapter as its ``model`` (sandrl's OpenAI routes do the same).

This is the edge of the test, not the code under test: only the routes' shapes are vLLM's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from sandrl.errors import SandrlError
from sandrl.inference.engine import Engine
from sandrl.inference.http_errors import error_body
from sandrl.inference.openai_routes import router as openai_router
from sandrl.inference.routes_shared import engine_of

router = APIRouter()


@router.post("/pause")
async def pause(request: Request, mode: str = "abort", clear_cache: bool = True) -> dict[str, str]:
    engine = engine_of(request)
    if mode not in ("abort", "wait", "keep"):
        raise HTTPException(400, f"Invalid pause mode: {mode}")
    request.app.state.rejecting = mode != "keep"
    if mode == "abort":
        await engine.pause("abort")
    elif mode == "wait":
        while engine.running:
            await asyncio.sleep(0.005)
        await engine.pause("in_place")
    else:
        await engine.pause("in_place")
    request.app.state.log.append(f"pause:{mode}")
    return {"status": "paused"}


@router.post("/resume")
async def resume(request: Request) -> dict[str, str]:
    await engine_of(request).continue_generation()
    request.app.state.rejecting = False
    request.app.state.log.append("resume")
    return {"status": "resumed"}


@router.post("/collective_rpc")
async def collective_rpc(request: Request) -> dict[str, Any]:
    body = await request.json()
    if body.get("method") != "reload_weights":
        raise HTTPException(400, f"this test server runs only reload_weights, not {body.get('method')!r}")
    engine = engine_of(request)
    path = body.get("kwargs", {}).get("weights_path")
    await engine.update_weights(path, version=engine.weight_version)  # a reload keeps the label
    request.app.state.log.append("reload_weights")
    return {"results": [None]}


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request, reset_running_requests: bool = False) -> dict[str, bool]:
    engine = engine_of(request)
    request.app.state.log.append(f"reset_prefix_cache:{reset_running_requests}")
    if reset_running_requests:
        paused = engine.paused
        await engine.pause("retract")
        if not paused:
            await engine.continue_generation()
        return {"success": True}
    return {"success": engine.running == 0}


@router.post("/update_weight_version")
async def update_weight_version(request: Request) -> dict[str, Any]:
    new = (await request.json())["new_version"]
    await engine_of(request).set_weight_version(int(new))
    request.app.state.log.append(f"version:{new}")
    return {"success": True, "new_version": new}


@router.get("/weight_info")
async def weight_info(request: Request) -> dict[str, str]:
    return {"weight_version": str(engine_of(request).weight_version)}


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)  # vLLM's: an empty 200 while the engine runs


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    reading = await engine_of(request).kv_capacity()
    blocks = (reading.total_tokens or 0) // 16
    usage = (reading.used_tokens or 0) / reading.total_tokens if reading.total_tokens else 0.0
    labels = 'engine="0",model_name="tiny"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(reading.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(reading.queued)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="{blocks}"}} 1.0',
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {float(engine_of(request).stats.kv_retractions)}",
    ]
    return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")


lora_router = APIRouter()


def _vllm_error(message: str, kind: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


@lora_router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    body = await request.json()
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
        return _vllm_error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
    engine = engine_of(request)
    if name in engine.lora_adapters:
        return _vllm_error(f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400)
    try:
        await engine.load_lora_adapter(name, path)
    except SandrlError as exc:
        return _vllm_error(exc.message, "BadRequestError", 400)
    request.app.state.log.append(f"load:{name}")
    return Response(f"Success: LoRA adapter '{name}' added successfully.", 200)


@lora_router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    name = (await request.json()).get("lora_name")
    engine = engine_of(request)
    if name not in engine.lora_adapters:
        return _vllm_error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
    await engine.unload_lora_adapter(name)
    request.app.state.log.append(f"unload:{name}")
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200)


def create_vllm_app(engine: Engine, served_model_name: str = "tiny", *, lora_updating: bool = False) -> FastAPI:
    """The app: vLLM's control routes above, sandrl's ``/v1`` routes, 503 on ``/v1`` while pausing."""
    app = FastAPI()
    app.state.engine = engine
    app.state.served_model_name = served_model_name
    app.state.rejecting = False
    app.state.log = []
    app.include_router(router)
    if lora_updating:
        app.include_router(lora_router)
    app.include_router(openai_router)

    @app.middleware("http")
    async def reject_while_paused(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1/completions") and app.state.rejecting:
            app.state.log.append("503")
            return JSONResponse({"error": "paused"}, status_code=503)
        return await call_next(request)

    @app.exception_handler(SandrlError)
    async def sandrl_error(request: Request, exc: SandrlError) -> JSONResponse:
        return error_body(exc.http_status, exc.error_code, exc.message, openai=True)

    return app
