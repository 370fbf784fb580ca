"""What the SGLang and OpenAI routes of the inference server share.

The engine behind a request, the error body, sampling parameters the engine cannot honour
(rejected, never silently ignored), and the output text each API expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from fastapi import Request
from fastapi.responses import JSONResponse

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation
from sandrl.inference.engine import Engine
from sandrl.inference.tokenizer import Tokenizer


def engine_of(request: Request) -> Engine:
    return cast(Engine, request.app.state.engine)


def served_name(request: Request) -> str:
    return cast(str, request.app.state.served_model_name)


def error_body(status: int, error_code: str, message: str, *, openai: bool) -> JSONResponse:
    """sandrl's error body ``{code, error_code, message}``; on OpenAI routes also the ``error`` object
    the official ``openai`` package reads its message from."""
    body: dict[str, Any] = {"code": status, "error_code": error_code, "message": message}
    if openai:
        body["error"] = {"message": message, "type": error_code, "param": None, "code": error_code}
    return JSONResponse(body, status_code=status)


def reject_unsupported(values: Mapping[str, Any], defaults: Mapping[str, Any], where: str) -> None:
    """Refuse parameters the engine does not implement unless they hold their no-op value."""
    for name, default in defaults.items():
        value = values.get(name)
        if value is not None and value != default and not (isinstance(default, tuple) and value in default):
            raise ConfigError(
                f"{where}: {name}={value!r} is not supported by sandrl's engine; leave it out "
                "(or serve the model with SGLang or vLLM)"
            )


def require_tokenizer(engine: Engine, what: str) -> Tokenizer:
    if engine.tokenizer is None:
        raise ConfigError(
            f"{what} needs a tokenizer, and the served checkpoint has none: send token ids "
            "(SGLang /generate input_ids, or /v1/completions with a list of ids as the prompt)"
        )
    return engine.tokenizer


def output_text(engine: Engine, generation: Generation, *, skip_special_tokens: bool, keep_stop: bool) -> str:
    """The output as text; a matched stop string (and what follows it in its token) is cut unless ``keep_stop``."""
    if engine.tokenizer is None:
        return ""
    text = engine.tokenizer.decode(generation.output_ids, skip_special_tokens=skip_special_tokens)
    stop = generation.matched_stop
    if isinstance(stop, str):
        at = text.find(stop)
        if at >= 0:
            text = text[: at + len(stop)] if keep_stop else text[:at]
    return text


def token_text(engine: Engine, token_id: int, *, as_id: bool) -> str:
    """A token as the OpenAI logprobs show it: ``token_id:N`` (vLLM's return_tokens_as_token_ids) or its text."""
    if as_id or engine.tokenizer is None:
        return f"token_id:{token_id}"
    return engine.tokenizer.decode([token_id])


def token_bytes(engine: Engine, token_id: int) -> list[int]:
    if engine.tokenizer is None:
        return []
    return list(engine.tokenizer.token_bytes(token_id))
