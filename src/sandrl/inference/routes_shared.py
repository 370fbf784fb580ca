"""What the SGLang and OpenAI routes of the inference server share (the routes: :mod:`.openai_routes`,
:mod:`.sglang_generate`, :mod:`.sglang_control`).

The engine behind a request, the error body, sampling parameters the engine cannot honour
(rejected, never silently ignored), the output text each API expects, and the merged
progress of several streamed generations.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol, cast

from fastapi import Request

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.batch import Partial
from sandrl.inference.engine import Engine
from sandrl.inference.tokenizer import Tokenizer


class OpenAISampling(Protocol):
    """The sampling fields every OpenAI-shaped request has (chat and text completions, a session's chat)."""

    temperature: float | None
    top_p: float | None
    stop: str | list[str] | None
    stop_token_ids: list[int] | None
    seed: int | None


def openai_sampling(
    body: OpenAISampling,
    max_new_tokens: int,
    *,
    top_logprobs: int = 0,
    ignore_eos: bool = False,
    logit_bias: tuple[tuple[int, float], ...] = (),
) -> SamplingParams:
    """The sampling parameters of an OpenAI-shaped request (OpenAI's defaults where it says nothing)."""
    stop = body.stop or ()
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_new_tokens=max_new_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        seed=body.seed,
        ignore_eos=ignore_eos,
        top_logprobs=top_logprobs,
        logit_bias=logit_bias,
    )


def engine_of(request: Request) -> Engine:
    return cast(Engine, request.app.state.engine)


def served_name(request: Request) -> str:
    return cast(str, request.app.state.served_model_name)


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


def cached_tokens(answers: Iterable[tuple[list[int], Generation | None]]) -> int:
    """The prompt tokens of an answer's generations (prompt, generation) the prefix cache served: as SGLang's usage
    counts them, each distinct prompt once, by its first sample (its others share its prompt)."""
    first: dict[tuple[int, ...], int] = {}
    for prompt, generation in answers:
        first.setdefault(tuple(prompt), generation.cached_tokens if generation is not None else 0)
    return sum(first.values())


def token_text(engine: InferenceClient, token_id: int, *, as_id: bool) -> str:
    """A token as the OpenAI logprobs show it: ``token_id:N`` (vLLM's return_tokens_as_token_ids) or its text."""
    if as_id or engine.tokenizer is None:
        return f"token_id:{token_id}"
    return engine.tokenizer.decode([token_id])


def token_bytes(engine: InferenceClient, token_id: int) -> list[int]:
    if engine.tokenizer is None:
        return []
    return list(engine.tokenizer.token_bytes(token_id))


async def stream_all(
    engine: Engine, jobs: list[tuple[list[int], SamplingParams, str | None]], loras: list[str | None] | None = None
) -> AsyncIterator[tuple[int, Partial | Generation]]:
    """Stream every (prompt, params, rid) job at once, job i with the LoRA adapter ``loras[i]`` (None: the
    served model); yield (job index, progress) as it comes.

    A failure of any job is raised after what was already produced; leaving the loop early
    cancels every job, freeing their batch slots.
    """
    queue: asyncio.Queue[tuple[int, Partial | Generation] | None] = asyncio.Queue()
    errors: list[Exception] = []

    adapters = loras or [None] * len(jobs)

    async def pump(index: int, prompt: list[int], params: SamplingParams, rid: str | None) -> None:
        async for out in engine.stream(prompt, params, rid=rid, lora=adapters[index]):
            queue.put_nowait((index, out))

    async def run_all() -> None:
        try:
            await asyncio.gather(*(pump(i, *job) for i, job in enumerate(jobs)))
        except Exception as exc:
            errors.append(exc)
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(run_all())
    try:
        while (got := await queue.get()) is not None:
            yield got
        if errors:
            raise errors[0]
    finally:
        task.cancel()


def sse(payload: Any) -> bytes:
    """One server-sent event, as SGLang and OpenAI frame them."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
