"""OpenAI's log-prob objects and streamed answers (``stream: true``) for the OpenAI routes.

A stream is server-sent events, ``data: {chunk}`` then ``data: [DONE]``: for completions
``text_completion`` chunks whose choices carry the new ``text``; for chat
``chat.completion.chunk`` chunks whose choices carry a ``delta`` (the role first, then the
new ``content``). Each chunk's ``logprobs`` cover the tokens new in it; the last chunk of a
choice has its ``finish_reason``; with ``stream_options.include_usage`` a last chunk with
no choices holds the usage. Text is held back while it could still be the start of a stop
string (which is cut from the output) or of an unfinished UTF-8 character.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.batch import Partial
from sandrl.inference.engine import Engine
from sandrl.inference.routes_shared import cached_tokens, output_text, sse, stream_all, token_bytes, token_text


@dataclass(frozen=True)
class StreamSpec:
    """How a streamed OpenAI answer looks: what the request asked for."""

    chat: bool
    model: str
    logprobs: bool
    as_ids: bool
    skip_special_tokens: bool
    include_stop: bool
    include_usage: bool
    return_token_ids: bool
    lora: str | None = None
    """The loaded LoRA adapter the request named as its ``model`` (vLLM's way); None: the served model."""


async def openai_stream(
    engine: Engine, jobs: list[tuple[list[int], SamplingParams, str | None]], spec: StreamSpec
) -> AsyncIterator[bytes]:
    ident = f"{'chatcmpl' if spec.chat else 'cmpl'}-{uuid.uuid4().hex}"
    head = {
        "id": ident,
        "object": "chat.completion.chunk" if spec.chat else "text_completion",
        "created": int(time.time()),
        "model": spec.model,
    }
    sent_text = [""] * len(jobs)
    sent_tokens = [0] * len(jobs)
    finals: list[Generation | None] = [None] * len(jobs)
    if spec.chat:
        for i in range(len(jobs)):
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            yield sse({**head, "choices": [role]})
    try:
        async for index, out in stream_all(engine, jobs, [spec.lora] * len(jobs)):
            final = out if isinstance(out, Generation) else None
            text = _visible(engine, out, jobs[index][1], spec)
            delta = text[len(sent_text[index]) :] if text.startswith(sent_text[index]) else ""
            new = _tail(engine, out, sent_tokens[index])
            if not delta and not new.output_ids and final is None:
                continue
            sent_text[index] += delta
            sent_tokens[index] = len(out.output_ids)
            choice: dict[str, Any] = {"index": index}
            if spec.chat:
                choice["delta"] = {"content": delta}
                choice["logprobs"] = chat_logprobs(engine, new, spec.as_ids) if spec.logprobs else None
            else:
                choice["text"] = delta
                choice["logprobs"] = completion_logprobs(engine, new, spec.as_ids) if spec.logprobs else None
            choice["finish_reason"] = final.finish_reason if final else None
            choice["stop_reason"] = final.matched_stop if final else None
            if spec.return_token_ids:
                choice["token_ids"] = new.output_ids
            if final is not None:
                finals[index] = final
            yield sse({**head, "choices": [choice]})
    except Exception as exc:  # the status line is sent: the error is an event (the openai package raises it)
        yield sse({"error": {"message": str(exc), "type": "internal_error", "param": None, "code": 500}})
    if spec.include_usage:
        prompt_tokens = sum(len(p) for p in {tuple(job[0]) for job in jobs})
        completion_tokens = sum(g.completion_tokens for g in finals if g is not None)
        cached = cached_tokens(zip((job[0] for job in jobs), finals, strict=True))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        yield sse({**head, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def _visible(engine: Engine, out: Partial | Generation, params: SamplingParams, spec: StreamSpec) -> str:
    """The text a client may see so far: all of it once finished, else what can no longer change."""
    if isinstance(out, Generation):
        return output_text(engine, out, skip_special_tokens=spec.skip_special_tokens, keep_stop=spec.include_stop)
    g = _tail(engine, out, 0)
    # An unfinished UTF-8 character decodes as U+FFFD until its last byte comes; it is held back
    # first, so the stop-string hold-back counts only characters that are final.
    text = output_text(engine, g, skip_special_tokens=spec.skip_special_tokens, keep_stop=True).rstrip("\ufffd")
    hold = 0 if spec.include_stop or not params.stop else max(len(s) for s in params.stop) - 1
    return text[: len(text) - hold] if hold else text


def _tail(engine: Engine, out: Partial | Generation, start: int) -> Generation:
    """The tokens of ``out`` from ``start`` on, as a Generation the log-prob formatters take."""
    top = out.output_top_logprobs[start:] if out.output_top_logprobs is not None else None
    return Generation(
        output_ids=out.output_ids[start:],
        output_logprobs=out.output_logprobs[start:],
        finish_reason="length",
        weight_version=engine.weight_version,
        prompt_tokens=0,
        output_top_logprobs=top,
    )


def completion_logprobs(engine: Engine, g: Generation, as_ids: bool) -> dict[str, Any]:
    tokens = [token_text(engine, t, as_id=as_ids) for t in g.output_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    if g.output_top_logprobs is not None:
        tops = [{token_text(engine, t, as_id=as_ids): lp for t, lp in row} for row in g.output_top_logprobs]
    else:
        tops = [{tok: lp} for tok, lp in zip(tokens, g.output_logprobs, strict=True)]
    return {"tokens": tokens, "token_logprobs": g.output_logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(engine: InferenceClient, g: Generation, as_ids: bool) -> dict[str, Any]:
    rows = g.output_top_logprobs or [[] for _ in g.output_ids]
    content = [
        {
            "token": token_text(engine, t, as_id=as_ids),
            "logprob": lp,
            "bytes": token_bytes(engine, t),
            "top_logprobs": [
                {"token": token_text(engine, tt, as_id=as_ids), "logprob": tlp, "bytes": token_bytes(engine, tt)}
                for tt, tlp in row
            ],
        }
        for t, lp, row in zip(g.output_ids, g.output_logprobs, rows, strict=True)
    ]
    return {"content": content, "refusal": None}
