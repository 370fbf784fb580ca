"""The inference server: the embedded engine behind SGLang's native routes and OpenAI's.

SGLang's routes (what :class:`~sandrl.inference.sglang.SGLangClient` and RL frameworks built
on SGLang, such as slime, call):

- ``POST /generate``: ``input_ids`` or ``text`` (one prompt or a batch), ``sampling_params``,
  ``return_logprob``; answers ``text``, ``output_ids`` and ``meta_info`` with
  ``output_token_logprobs`` as ``[logprob, token_id, null]``, ``finish_reason`` as
  ``{"type": ..., "matched": ...}`` and ``weight_version`` (a string, as SGLang's).
- ``POST /update_weights_from_disk``: ``model_path`` (+ optional ``weight_version``); answers
  ``{"success", "message", "num_paused_requests"}``.
- ``GET /health``, ``/health_generate``, ``/get_model_info``, ``/get_weight_version``.

OpenAI's routes are in :mod:`sandrl.inference.openai_routes`. Errors are
``{"code", "error_code", "message"}`` everywhere.

:func:`serve` runs it with uvicorn (``sandrl serve inference``); :class:`BackgroundServer`
runs it in a thread on a free port, for tests and for embedding in one process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandrl.background_server import BackgroundServer as BackgroundServer
from sandrl.errors import ConfigError, SandrlError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.openai_routes import router as openai_router
from sandrl.inference.serving import (
    engine_of,
    error_body,
    output_text,
    reject_unsupported,
    require_tokenizer,
)
from sandrl.inference.tokenizer import TINY

# SGLang sampling parameters the engine does not implement, with the values that mean "off".
_SGLANG_UNSUPPORTED: dict[str, Any] = {
    "top_k": (-1, 1 << 30),
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "stop_regex": None,
}


class GenerateRequest(BaseModel):
    """The subset of SGLang's ``GenerateReqInput`` the engine serves; other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    stream: bool = False
    rid: str | list[str] | None = None


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_path: str
    weight_version: str | int | None = None
    load_format: str | None = None
    abort_all_requests: bool = False


sglang_router = APIRouter()


@sglang_router.get("/health")
@sglang_router.get("/health_generate")
async def health(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.health()
    return {"status": "ok", "weight_version": str(engine.weight_version)}


@sglang_router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    config = engine.hf_config
    return {
        "model_path": engine.model_path,
        "tokenizer_path": engine.model_path if engine.tokenizer is not None else None,
        "is_generation": True,
        "weight_version": str(engine.weight_version),
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        "vocab_size": engine.vocab_size,
        "max_context": engine.max_context,
    }


@sglang_router.get("/get_weight_version")
async def weight_version(request: Request) -> dict[str, str]:
    return {"weight_version": str(engine_of(request).weight_version)}


@sglang_router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Any:
    engine = engine_of(request)
    if body.stream:
        raise ConfigError("/generate: stream=true is not supported by sandrl's engine; send stream=false")
    sp = dict(body.sampling_params or {})
    reject_unsupported(sp, _SGLANG_UNSUPPORTED, "/generate sampling_params")
    params = _sglang_params(sp, body.top_logprobs_num if body.return_logprob else 0)
    prompts, batched = _prompts(engine, body)
    rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(prompts)
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    latency = time.perf_counter() - started
    answers = [
        _generate_answer(engine, g, rid or uuid.uuid4().hex, body.return_logprob, sp, latency)
        for g, rid in zip(results, rids, strict=False)
    ]
    return answers if batched else answers[0]


@sglang_router.post("/update_weights_from_disk")
async def update_weights_from_disk(body: UpdateWeightsRequest, request: Request) -> JSONResponse:
    engine = engine_of(request)
    try:
        if body.abort_all_requests:
            raise ConfigError(
                "abort_all_requests=true is not supported: requests in flight continue with the new weights"
            )
        version = await engine.update_weights(body.model_path, version=_int_version(body.weight_version))
    except SandrlError as exc:
        status = exc.http_status if exc.http_status < 500 else 500
        content = {"success": False, "message": exc.message, "num_paused_requests": 0}
        return JSONResponse({**content, "code": status, "error_code": exc.error_code}, status_code=status)
    return JSONResponse(
        {
            "success": True,
            "message": f"Succeeded to update model weights from {body.model_path}; weight version {version}.",
            "num_paused_requests": 0,
            "weight_version": str(version),
        }
    )


def create_app(engine: Engine, *, served_model_name: str | None = None, owns_engine: bool = False) -> FastAPI:
    """The FastAPI app serving ``engine``; with ``owns_engine`` the app's shutdown closes the engine."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owns_engine:
                await engine.aclose()

    app = FastAPI(title="sandrl inference", lifespan=lifespan)
    app.state.engine = engine
    app.state.served_model_name = served_model_name or default_served_name(engine.model_path)
    app.include_router(sglang_router)
    app.include_router(openai_router)

    def is_openai(request: Request) -> bool:
        return request.url.path.startswith("/v1/")

    @app.exception_handler(SandrlError)
    async def sandrl_error(request: Request, exc: SandrlError) -> JSONResponse:
        return error_body(exc.http_status, exc.error_code, exc.message, openai=is_openai(request))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in exc.errors()
        )
        return error_body(400, "invalid_request", f"invalid request: {problems}", openai=is_openai(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "http_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += " (routes: /generate, /update_weights_from_disk, /health, /v1/completions, /v1/chat/completions)"
        return error_body(exc.status_code, code, message, openai=is_openai(request))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_body(500, "internal_error", f"internal error: {exc!r}", openai=is_openai(request))

    return app


def default_served_name(model_path: str) -> str:
    return TINY if model_path == TINY else Path(model_path).name or model_path


def serve(
    model: str = TINY,
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    served_model_name: str | None = None,
    engine_config: EngineConfig | None = None,
    log_level: str = "info",
) -> None:
    """Load ``model`` (``tiny`` or a local checkpoint directory) and serve it until interrupted."""
    engine = Engine.load(model, engine_config)
    app = create_app(engine, served_model_name=served_model_name, owns_engine=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, ws="none")
    finally:
        engine.close()


def _sglang_params(sp: dict[str, Any], top_logprobs: int) -> SamplingParams:
    def value(name: str, default: Any) -> Any:
        # SGLang treats an explicit null as "use the default".
        found = sp.get(name)
        return default if found is None else found

    temperature = float(value("temperature", 1.0))
    if sp.get("top_k") == 1:
        temperature = 0.0  # SGLang's other spelling of greedy
    stop = sp.get("stop") or ()
    seed = value("sampling_seed", sp.get("seed"))
    return SamplingParams(
        temperature=temperature,
        top_p=float(value("top_p", 1.0)),
        max_new_tokens=int(value("max_new_tokens", 128)),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
        seed=int(seed) if seed is not None else None,
        ignore_eos=bool(sp.get("ignore_eos", False)),
        top_logprobs=int(top_logprobs),
    )


def _prompts(engine: Engine, body: GenerateRequest) -> tuple[list[list[int]], bool]:
    if body.input_ids is not None:
        ids = body.input_ids
        if ids and isinstance(ids[0], list):
            return [list(map(int, p)) for p in ids if isinstance(p, list)], True
        return [[int(t) for t in ids if isinstance(t, int)]], False
    if body.text is not None:
        tokenizer = require_tokenizer(engine, "/generate with text")
        if isinstance(body.text, list):
            return [tokenizer.encode(t) for t in body.text], True
        return [tokenizer.encode(body.text)], False
    raise ConfigError("/generate needs input_ids (token ids) or text")


def _generate_answer(
    engine: Engine, g: Generation, rid: str, return_logprob: bool, sp: dict[str, Any], latency: float
) -> dict[str, Any]:
    if g.finish_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": g.matched_stop}
    elif g.finish_reason == "length":
        finish = {"type": "length", "length": g.completion_tokens}
    else:
        finish = {"type": "abort", "message": "the engine shut down before this request finished"}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "cached_tokens": 0,
        "weight_version": str(g.weight_version),
        "start_weight_version": None if g.start_weight_version is None else str(g.start_weight_version),
        "e2e_latency": latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(g.output_logprobs, g.output_ids, strict=True)]
        if g.output_top_logprobs is not None:
            meta["output_top_logprobs"] = [[[lp, t, None] for t, lp in row] for row in g.output_top_logprobs]
    text = output_text(
        engine,
        g,
        skip_special_tokens=bool(sp.get("skip_special_tokens", True)),
        keep_stop=bool(sp.get("no_stop_trim", False)),
    )
    return {"text": text, "output_ids": g.output_ids, "meta_info": meta}


def _int_version(value: str | int | None) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
