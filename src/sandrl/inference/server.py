"""The inference server: the embedded engine behind SGLang's native routes and OpenAI's.

SGLang's API as training clients (slime, Miles, :class:`~sandrl.inference.sglang.SGLangClient`)
use it, checked against SGLang's source on main in late 2025 (0.5.x: ``entrypoints/http_server.py``
at 0025436e, ``managers/io_struct.py`` at 001067ff). Status: **served** (SGLang's meaning),
**no-op** (accepted; the stated reason why nothing needs doing), **400** (refused with the reason).

Routes:

- ``POST|PUT /generate``: served (:mod:`~sandrl.inference.sglang_generate`); fields below.
- ``POST /update_weights_from_disk``: served. ``model_path``, ``weight_version`` (an integer in a
  string: sandrl's versions are the trainer's steps), ``abort_all_requests`` (in-flight requests
  end with finish_reason abort, then the swap), ``keep_pause`` (stays paused, in place, after),
  ``load_format`` (``auto``/``safetensors``, else 400), ``token_step`` (recorded, shown by
  ``/get_server_info``) served; ``flush_cache`` always (the prefix cache never outlives the weights that
  computed it: every swap empties it, whatever the field says), ``is_async`` no-op (the
  checkpoint is always read off the decode thread and the answer always comes after the swap),
  ``torch_empty_cache``/``recapture_cuda_graph`` no-op (no CUDA); ``manifest`` 400. sandrl's
  ``update_policy`` (``in_place``/``pause``/``abort_and_resume``) picks what the update does to
  requests in flight; default: the server's (``create_app(update_policy=...)``, ``sandrl serve
  inference --update-policy``), ``pause`` unless set: like SGLang's, the update waits for the
  requests in flight (see :mod:`sandrl.inference.engine`). SGLang clients get the other two with
  ``/pause_generation`` ``in_place`` or ``retract``, the update, then ``/continue_generation``.
  sandrl's: a ``model_path`` that holds a LoRA adapter (``adapter_config.json``, no ``config.json``)
  is served over the base weights to requests naming no adapter, with the same version and policy.
- ``POST /load_lora_adapter``: served (``lora_name``, ``lora_path``; ``pinned`` no-op: every loaded
  adapter stays resident). The adapter is checked against the served model (names, shapes, sizes,
  safetensors only, and sandrl's base marker): 400 with the reason otherwise, also for a name in use
  or more than ``max_loaded_loras`` adapters. ``POST /unload_lora_adapter``: served (``lora_name``);
  requests running with it finish with it. Both answer SGLang's ``{success, error_message,
  loaded_adapters}`` (400 on failure).
- ``POST /update_weight_version``: served (``new_version``, ``abort_all_requests`` default true).
- ``POST /pause_generation``: served, ``mode`` ``abort`` (default) / ``retract`` / ``in_place``;
  an empty body (SGLang before 0.5.6) is ``abort``. ``POST /continue_generation``: served.
- ``POST /abort_request``: served (``rid``, ``abort_all``); the request ends with finish_reason
  abort and the tokens it has.
- ``GET|POST /flush_cache``: served: empties the prefix cache (:mod:`~sandrl.inference.prefix_cache`); unlike
  SGLang's it is not refused while requests run (each holds its own KV, not the cache's).
- ``GET|POST /release_memory_occupation``, ``/resume_memory_occupation``: served (``tags``: ``weights``,
  ``kv_cache``; ``cuda_graph`` accepted): the weights are written aside and freed, the KV cache dropped
  and generation paused until both are back (:mod:`~sandrl.inference.engine_memory`).
- ``POST /init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/destroy_weights_update_group``: served over gloo, and over sandrl's ``shm`` backend for a trainer
  on this host (:mod:`~sandrl.inference.sglang_weight_sync`, :mod:`~sandrl.inference.weight_shm`):
  buckets are staged and the weights swapped whole once they cover the model.
- ``POST /update_weights_from_tensor``, ``/update_weights_from_ipc``: 400 (they pass CUDA IPC
  handles or pickles; broadcast, or save a checkpoint and use ``/update_weights_from_disk``).
- ``GET /get_server_info`` (``/server_info``), ``/get_model_info``, ``/get_weight_version``,
  ``/health``, ``/health_generate``: served (server info holds sandrl's settings, not SGLang's
  ``ServerArgs``, and ``max_total_num_tokens``, the KV bound).
- ``GET /v1/loads``, ``/get_load``: served, in SGLang's shapes (running and queued requests, KV tokens
  used and free: :mod:`~sandrl.inference.kv_capacity`), what ``[inference] kv_admission`` reads.
- Not served (404): ``/load_lora_adapter_from_tensors`` (serialized tensors), SGLang's sessions,
  ``/encode``, ``/classify``, profiling.

``/generate`` fields: ``text`` / ``input_ids`` (one or a batch), ``rid`` (a batch's string rid
becomes ``rid_0``, ``rid_1``...; a list must match the batch), ``sampling_params`` /
``return_logprob`` / ``top_logprobs_num`` / ``logprob_start_len`` (a value or one per prompt),
``return_text_in_logprobs``, ``stream`` (``data: {json}`` per token, cumulative, then
``data: [DONE]``), ``lora_path`` (a loaded adapter's name, or one per prompt: served unmerged, each
request with its own, :mod:`sandrl.inference.lora_rows`): served; ``logprob_start_len >= 0`` (prompt
log-probs), ``token_ids_logprob``, images/audio/video, ``return_hidden_states`` and any other set field: 400 by name;
routing labels (``priority``, ``routing_key``, ``custom_labels``...): no-op. ``sampling_params``:
``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` (only 1 = greedy, or off), ``stop``,
``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``, ``no_stop_trim``, ``n`` (prompt-major,
fresh rids), ``logit_bias``, ``sampling_seed``, ``stream_interval``: served; ``spaces_between_special_tokens``:
false (what RL clients send) served, true decodes the same (no tokenizer here spaces them); penalties, ``min_p``,
``min_new_tokens``, grammars (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``),
``stop_regex``, ``custom_params``: 400 unless off. Answers: ``text``, ``output_ids``, ``meta_info``
with ``id``, ``finish_reason`` (``{"type": "stop", "matched"}``, ``length``, ``abort``),
``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (the prompt's tokens taken from the prefix cache),
``weight_version`` (a string), ``output_token_logprobs``
(``[logprob, id, text or null]``; at the sampling temperature unless the server runs with
``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, as SGLang's, or the request sends sandrl's
``return_original_logprob``), ``output_top_logprobs``, and sandrl's ``start_weight_version``
and ``output_token_weight_versions`` (the version of each output token).

OpenAI's routes are in :mod:`sandrl.inference.openai_routes`; sandrl's session gateway
(``/v1/sessions``, token-exact OpenAI sessions for agent harnesses) in :mod:`sandrl.inference.gateway`. Errors are
``{"code", "error_code", "message"}`` everywhere.

Who may call what (:mod:`sandrl.inference.auth`): with a token (``--token-file``, or
``$SANDRL_INFERENCE_TOKEN``) every route but ``/health`` and ``/health_generate`` needs
``Authorization: Bearer <token>``, as SGLang's ``--api-key``; without one the server binds
loopback only, answers only requests addressed to a loopback name and from no web page, and
refuses the control routes (weights, pause, continue, abort, flush, memory) with 403
``token_required``. A session's routes take that session's key. Bodies over ``max_body_bytes``
(16 MiB) are refused with 413 before they are read.

:func:`serve` runs it with uvicorn (``sandrl serve inference``); :class:`BackgroundServer`
runs it in a thread on a free port, for tests and for embedding in one process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request

from sandrl.background_server import BackgroundServer as BackgroundServer
from sandrl.errors import ConfigError
from sandrl.inference.auth import MAX_BODY_BYTES, bind_host, install_guards, load_token
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.gateway.gateway import Gateway, harness_router
from sandrl.inference.gateway.gateway import router as gateway_router
from sandrl.inference.http_errors import install_error_handlers
from sandrl.inference.openai_routes import router as openai_router
from sandrl.inference.routes_shared import engine_of
from sandrl.inference.sglang_control import router as control_router
from sandrl.inference.sglang_generate import router as generate_router
from sandrl.inference.sglang_weight_sync import router as weight_sync_router
from sandrl.inference.tokenizer import TINY

log = logging.getLogger(__name__)

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


def create_app(
    engine: Engine,
    *,
    served_model_name: str | None = None,
    owns_engine: bool = False,
    return_original_logprob: bool | None = None,
    tool_parser: str | None = None,
    update_policy: UpdatePolicy = "pause",
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI app serving ``engine``; with ``owns_engine`` the app's shutdown closes the engine.

    ``token``: the bearer token every route but health needs; None: loopback callers only, and the
    control routes refused (see the module docstring). ``max_body_bytes``: the largest request body.

    ``return_original_logprob``: whether ``/generate`` log-probs are at temperature 1 (true) or at
    the sampling temperature (false) when a request does not say; None reads SGLang's switch,
    the environment variable ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (unset: at the temperature, as SGLang).
    ``tool_parser``: the session gateway's tool-call parser; None: detected from the chat template.
    ``update_policy``: what ``/update_weights_from_disk`` does to requests in flight when the request
    does not say (``pause``: it waits for them, as SGLang's).
    """
    if update_policy not in UPDATE_POLICIES:
        raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {update_policy!r}")

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
    if return_original_logprob is None:
        flag = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").strip().lower()
        return_original_logprob = flag in ("1", "true", "yes", "on")
    app.state.return_original_logprob = return_original_logprob
    app.state.update_policy = update_policy
    app.include_router(sglang_router)
    app.include_router(generate_router)
    app.include_router(control_router)
    app.include_router(weight_sync_router)
    app.include_router(openai_router)
    app.include_router(gateway_router)
    app.include_router(harness_router)
    gateway = (
        Gateway(engine, model_name=app.state.served_model_name, tool_parser=tool_parser)
        if engine.tokenizer is not None
        else None
    )
    app.state.gateway = gateway

    install_error_handlers(
        app, not_found_hint="not an SGLang route sandrl serves: see sandrl.inference.server for the list"
    )
    install_guards(
        app,
        token=token,
        key_of=gateway.key_of if gateway is not None else lambda _id: None,
        max_body_bytes=max_body_bytes,
        advice="this server has no token: start it with --token-file FILE (or $SANDRL_INFERENCE_TOKEN) to serve "
        "other names",
    )
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
    update_policy: UpdatePolicy = "pause",
    tool_parser: str | None = None,
    token_file: Path | str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Load ``model`` (``tiny`` or a local checkpoint directory) and serve it until interrupted.

    ``update_policy`` is the weight updates' default, for the engine and the update route alike;
    ``tool_parser`` the session gateway's (None: detected from the chat template). The token is read
    from ``token_file``, else ``$SANDRL_INFERENCE_TOKEN``; without one only loopback is served."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = load_token(token_file)
    host, warning = bind_host(host, token)
    if warning:
        log.warning(warning)
    config = replace(engine_config or EngineConfig(), update_policy=update_policy)
    engine = Engine.load(model, config)
    app = create_app(
        engine,
        served_model_name=served_model_name,
        owns_engine=True,
        update_policy=update_policy,
        tool_parser=tool_parser,
        token=token,
        max_body_bytes=max_body_bytes,
    )
    log.info("serving %s on http://%s:%d (%s)", model, host, port, "bearer token" if token else "no token: loopback")
    try:
        # proxy_headers off: a relayed client (a sandbox's forward) must not name its own address in X-Forwarded-For.
        uvicorn.run(app, host=host, port=port, log_level=log_level, ws="none", proxy_headers=False)
    finally:
        engine.close()
