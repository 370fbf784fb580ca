"""OpenAI's routes on the inference server: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

What the official ``openai`` package and OpenAI-compatible clients send, answered in
OpenAI's shapes, plus the vLLM extensions that keep a client token-exact:
``prompt`` as token ids, ``return_token_ids`` (``choices[i].token_ids``),
``return_tokens_as_token_ids`` (logprobs tokens spelled ``token_id:N``), ``stop_token_ids``,
``ignore_eos``, ``skip_special_tokens``, ``include_stop_str_in_output``, ``return_weight_versions``
(vLLM 0.34's per-choice ``weight_versions`` spans; not with ``stream``). Each answer also
carries ``weight_version``, which OpenAI's API lacks and RL needs. A ``model`` that names a LoRA
adapter loaded on the server (``/load_lora_adapter``) samples with it, as vLLM's does; ``/v1/models``
lists the loaded adapters after the served model, with it as their ``parent``.

Served as OpenAI defines them: ``n`` (sample i of a seeded request uses seed + i), ``stream``
(server-sent chunks, see :mod:`sandrl.inference.openai_stream`; ``stream_options.include_usage``),
``logprobs`` / ``top_logprobs`` (completions: ``logprobs`` = how many top entries, 0-20; chat:
``logprobs`` true and ``top_logprobs``), ``stop`` (a string or a list; cut from the text unless
``include_stop_str_in_output``), ``seed``, ``logit_bias`` (token id -> bias added to the logits),
``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``. Log-probs are at
temperature 1 whatever the sampling temperature (vLLM's default ``raw_logprobs``; the trainer's
scale). Labels without effect (``user``, ``metadata``, ``store``, ``service_tier``) are accepted.

Chat completions take ``tools`` (rendered by the model's chat template) and ``tool_choice``
``auto`` / ``none``; the reply's calls come back as ``tool_calls`` (finish reason ``tool_calls``),
parsed in the model family's format (:mod:`sandrl.inference.toolcalls`), and an assistant
message's ``tool_calls`` and a tool message's ``tool_call_id`` in the history are rendered, not
dropped. Each call re-renders the whole history; for token-exact multi-turn use the session
gateway (``/v1/sessions``, :mod:`sandrl.inference.gateway`).

Not served: ``echo``, ``suffix``, ``best_of`` > 1, penalties, ``tool_choice`` ``required`` or a
named function, tools with ``stream``, response
formats, audio, reasoning effort, vLLM's ``top_k`` / ``min_p`` / ``repetition_penalty``; asking
for one is a 400 that says so rather than an answer that quietly ignores it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.chat import ChatFormat
from sandrl.inference.engine import Engine
from sandrl.inference.gateway.session import plain, reply_message
from sandrl.inference.openai_stream import StreamSpec, chat_logprobs, completion_logprobs, openai_stream
from sandrl.inference.routes_shared import (
    cached_tokens,
    engine_of,
    openai_sampling,
    output_text,
    reject_unsupported,
    require_tokenizer,
    served_name,
)
from sandrl.inference.toolcalls import ToolCallParser
from sandrl.inference.version_spans import to_spans

_UNSUPPORTED: dict[str, Any] = {
    "echo": False,
    "suffix": None,
    "best_of": (None, 1),
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "reasoning_effort": None,
    "audio": None,
    "prediction": None,
    "modalities": (None, ["text"]),
    "top_k": (None, -1, 0),
    "min_p": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "min_tokens": (None, 0),
}
_STREAM_OPTIONS = frozenset({"include_usage"})


class _Common(BaseModel):
    # Clients send many optional fields (user, metadata...); unknown ones are ignored.
    model_config = ConfigDict(extra="allow")

    model: str
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    return_weight_versions: bool = False
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


router = APIRouter(prefix="/v1")


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    card = {"object": "model", "created": 0, "owned_by": "sandrl", "max_model_len": engine.max_context}
    adapters = [
        {"id": name, **card, "root": path, "parent": served_name(request)}
        for name, path in engine.lora_adapters.items()
    ]
    return {"object": "list", "data": [{"id": served_name(request), **card, "root": engine.model_path}, *adapters]}


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    engine = _checked(body, request, "/v1/completions")
    params = _params(body, body.max_tokens if body.max_tokens is not None else 16, body.logprobs or 0)
    prompts = _completion_prompts(engine, body.prompt)
    if body.stream:
        spec = _spec(body, request, chat=False, logprobs=body.logprobs is not None)
        return _streaming(engine, _jobs(engine, prompts, params, body.n), spec)
    generations = await _run(engine, prompts, params, body.n, spec_lora(body, request))
    choices = []
    for index, (g, prompt) in enumerate(generations):
        choice: dict[str, Any] = {
            "index": index,
            "text": _text(engine, g, body),
            "logprobs": (
                completion_logprobs(engine, g, body.return_tokens_as_token_ids) if body.logprobs is not None else None
            ),
            "finish_reason": g.finish_reason,
            "stop_reason": g.matched_stop,
        }
        if body.return_token_ids:
            choice["token_ids"], choice["prompt_token_ids"] = g.output_ids, prompt
        if body.return_weight_versions:
            choice["weight_versions"] = _spans(g)
        choices.append(choice)
    return _envelope("cmpl", "text_completion", request, generations, choices)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    engine = _checked(body, request, "/v1/chat/completions")
    tokenizer = require_tokenizer(engine, "/v1/chat/completions")
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    top = (body.top_logprobs or 0) if body.logprobs else 0
    params = _params(body, limit if limit is not None else engine.max_context, top)
    if body.tool_choice not in (None, "auto", "none"):
        raise ConfigError(
            f"tool_choice={body.tool_choice!r} is not served (it needs constrained decoding); use 'auto' or 'none'"
        )
    if body.tools and body.stream:
        raise ConfigError("tools with stream=true are not served: send stream=false to get parsed tool_calls")
    messages = [plain(m.model_dump(exclude_none=True)) for m in body.messages]
    prompt = tokenizer.encode_messages(messages, add_generation_prompt=True, tools=body.tools)
    parser = tool_parser_of(request) if body.tools and body.tool_choice != "none" else None
    if body.stream:
        spec = _spec(body, request, chat=True, logprobs=body.logprobs)
        return _streaming(engine, _jobs(engine, [prompt], params, body.n), spec)
    generations = await _run(engine, [prompt], params, body.n, spec_lora(body, request))
    choices = []
    chat = ChatFormat(tokenizer)
    for index, (g, _) in enumerate(generations):
        message: dict[str, Any] = {"role": "assistant", "content": _text(engine, g, body)}
        finish: str = g.finish_reason
        if parser is not None:
            message, finish = reply_message(chat, parser, g, body.tools or ())
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(engine, g, body.return_tokens_as_token_ids) if body.logprobs else None,
            "finish_reason": finish,
            "stop_reason": g.matched_stop,
        }
        if body.return_token_ids:
            choice["token_ids"] = g.output_ids
        if body.return_weight_versions:
            choice["weight_versions"] = _spans(g)
        choices.append(choice)
    answer = _envelope("chatcmpl", "chat.completion", request, generations, choices)
    if body.return_token_ids:
        answer["prompt_token_ids"] = prompt
    return answer


def tool_parser_of(request: Request) -> ToolCallParser:
    """The served model's tool-call parser (the session gateway's: named at start, or detected from the template)."""
    gateway = getattr(request.app.state, "gateway", None)
    parser = getattr(gateway, "parser", None)
    if parser is None:
        raise ConfigError(
            "this model's chat template shows no tool-call format, so tool calls cannot be parsed; start the "
            "server with --tool-parser hermes, glm45 or llama3_json"
        )
    return cast(ToolCallParser, parser)


def _checked(body: _Common, request: Request, where: str) -> Engine:
    name = served_name(request)
    if body.model != name and spec_lora(body, request) is None:
        error = ConfigError(
            f"{where}: this server serves the model {name!r}, not {body.model!r} (see /v1/models)",
            error_code="model_not_found",
        )
        error.http_status = 404  # what OpenAI answers, so the openai package raises NotFoundError
        raise error
    reject_unsupported(body.model_dump(), _UNSUPPORTED, where)
    if not 1 <= body.n <= 16:
        raise ConfigError(f"{where}: n must be between 1 and 16, got {body.n}")
    options = body.stream_options or {}
    if options and not body.stream:
        raise ConfigError(f"{where}: stream_options needs stream=true")
    if body.stream and body.return_weight_versions:
        raise ConfigError(f"{where}: return_weight_versions is served without stream only; ask without stream")
    unknown = sorted(k for k, v in options.items() if k not in _STREAM_OPTIONS and v)
    if unknown:
        raise ConfigError(f"{where}: stream_options {unknown} are not supported (only include_usage)")
    return engine_of(request)


def _spec(body: _Common, request: Request, *, chat: bool, logprobs: bool) -> StreamSpec:
    return StreamSpec(
        chat=chat,
        model=served_name(request),
        logprobs=logprobs,
        as_ids=body.return_tokens_as_token_ids,
        skip_special_tokens=body.skip_special_tokens,
        include_stop=body.include_stop_str_in_output,
        include_usage=bool((body.stream_options or {}).get("include_usage")),
        return_token_ids=body.return_token_ids,
        lora=spec_lora(body, request),
    )


def spec_lora(body: _Common, request: Request) -> str | None:
    """The LoRA adapter the request's ``model`` names (vLLM's way of choosing one), or None for the served model."""
    return body.model if body.model in engine_of(request).lora_adapters else None


def _streaming(engine: Engine, jobs: list[tuple[list[int], SamplingParams, str | None]], spec: StreamSpec) -> Any:
    for prompt, params, _ in jobs:  # a bad prompt is a 400 before the stream starts
        engine.check_prompt(prompt, params)
    return StreamingResponse(openai_stream(engine, jobs, spec), media_type="text/event-stream")


def _params(body: _Common, max_new_tokens: int, top_logprobs: int) -> SamplingParams:
    bias = _logit_bias(body.logit_bias)
    return openai_sampling(body, max_new_tokens, top_logprobs=top_logprobs, ignore_eos=body.ignore_eos, logit_bias=bias)


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    try:
        return tuple((int(t), float(b)) for t, b in (bias or {}).items())
    except ValueError:
        raise ConfigError(f"logit_bias keys must be token ids (as strings), got {sorted(bias or {})[:5]}") from None


def _jobs(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, n: int
) -> list[tuple[list[int], SamplingParams, str | None]]:
    """Each prompt n times, prompt-major; sample i of a seeded request uses seed + i."""
    jobs: list[tuple[list[int], SamplingParams, str | None]] = []
    for prompt in prompts:
        for i in range(n):
            p = params if params.seed is None or i == 0 else replace(params, seed=params.seed + i)
            jobs.append((prompt, p, None))
    return jobs


async def _run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, n: int, lora: str | None
) -> list[tuple[Generation, list[int]]]:
    """All prompts times n samples at once (they batch), with the LoRA adapter ``lora`` when not None."""
    jobs = _jobs(engine, prompts, params, n)
    results = await asyncio.gather(*(engine.generate(prompt, p, lora=lora) for prompt, p, _ in jobs))
    return [(g, prompt) for g, (prompt, _, _) in zip(results, jobs, strict=True)]


def _completion_prompts(engine: Engine, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompt, str):
        return [require_tokenizer(engine, "a text prompt").encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [[int(t) for t in prompt if isinstance(t, int)]]
    out: list[list[int]] = []
    for item in prompt:
        if isinstance(item, str):
            out.append(require_tokenizer(engine, "a text prompt").encode(item))
        elif isinstance(item, list):
            out.append([int(t) for t in item])
    if not out:
        raise ConfigError("/v1/completions: prompt is empty")
    return out


def _spans(g: Generation) -> list[dict[str, Any]]:
    return to_spans(g.output_weight_versions or [g.weight_version] * len(g.output_ids))


def _text(engine: Engine, g: Generation, body: _Common) -> str:
    return output_text(
        engine, g, skip_special_tokens=body.skip_special_tokens, keep_stop=body.include_stop_str_in_output
    )


def _envelope(
    prefix: str, kind: str, request: Request, generations: list[tuple[Generation, list[int]]], choices: list[Any]
) -> dict[str, Any]:
    prompt_tokens = sum(len(p) for p in {tuple(p) for _, p in generations})
    completion_tokens = sum(g.completion_tokens for g, _ in generations)
    cached = cached_tokens((p, g) for g, p in generations)
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": served_name(request),
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
        "weight_version": min(g.weight_version for g, _ in generations),
    }
