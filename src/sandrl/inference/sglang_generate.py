"""SGLang's ``POST /generate`` on the embedded engine, field for field (see :mod:`sandrl.inference.server`).

A request is normalised as SGLang's ``GenerateReqInput`` does: one prompt or a batch;
``sampling_params``, ``return_logprob``, ``top_logprobs_num`` and ``logprob_start_len`` one
value for all or a list with one per prompt; ``n`` parallel samples per prompt, prompt-major
(prompt 0's samples first), each with a fresh rid; a string ``rid`` on a batch becomes
``rid_0``, ``rid_1``, ...; a list of rids must match the batch and hold no duplicates.
With ``stream`` the answer is server-sent events, ``data: {json}`` per token (cumulative,
as SGLang sends by default; ``index`` tells a batch's items apart) and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.batch import Partial
from sandrl.inference.engine import Engine
from sandrl.inference.routes_shared import (
    engine_of,
    output_text,
    reject_unsupported,
    require_tokenizer,
    sse,
    stream_all,
)

# SGLang sampling parameters the engine does not implement, with the values that mean "off".
_UNSUPPORTED_SAMPLING: dict[str, Any] = {
    "top_k": (-1, 1 << 30),
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": (None, [], ""),
    "custom_params": None,
}
_SAMPLING_FIELDS = frozenset(_UNSUPPORTED_SAMPLING) | {
    "max_new_tokens",
    "temperature",
    "top_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "n",
    "logit_bias",
    "sampling_seed",
    "seed",
    "stream_interval",
    # Text only: sandrl's tokenizers never put spaces between special tokens, which is what the
    # false RL clients send asks for; the default true decodes the same way.
    "spaces_between_special_tokens",
}
# GenerateReqInput fields that only label or route a request; one CPU engine has nothing to route.
_METADATA = frozenset(
    {
        "log_metrics",
        "custom_labels",
        "no_logs",
        "priority",
        "received_time",
        "routing_key",
        "conversation_id",
        "session_id",
        "extra_key",
        "cache_salt",
        "routed_dp_rank",
        "data_parallel_rank",
        "external_trace_header",
        "modalities",
    }
)

router = APIRouter()


class GenerateRequest(BaseModel):
    """SGLang's ``GenerateReqInput``: the fields served; any other one that is set is refused by name."""

    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    top_logprobs_num: int | list[int] | None = None
    logprob_start_len: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    return_original_logprob: bool | None = None
    """sandrl's: temperature-1 log-probs (true) or at the sampling temperature (false); default: the
    server's setting, which like SGLang's is SGLANG_RETURN_ORIGINAL_LOGPROB (unset: at the temperature)."""
    stream: bool = False
    rid: str | list[str] | None = None
    lora_path: str | list[str | None] | None = None
    """The name of a loaded LoRA adapter (``/load_lora_adapter``) to sample with, or one per prompt."""


@dataclass(frozen=True)
class _Item:
    """One sequence to generate after normalisation."""

    prompt: list[int]
    rid: str
    index: int
    params: SamplingParams
    raw: dict[str, Any]
    return_logprob: bool
    lora: str | None


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(body: GenerateRequest, request: Request) -> Any:
    engine = engine_of(request)
    _reject_extra_fields(body)
    original = body.return_original_logprob
    items, batched = _normalise(
        engine, body, request.app.state.return_original_logprob if original is None else original
    )
    started = time.perf_counter()
    if body.stream:
        for item in items:  # a bad prompt is a 400 before the stream starts, not an error event inside it
            engine.check_prompt(item.prompt, item.params)
        return StreamingResponse(
            _stream(engine, items, batched, body.return_text_in_logprobs, started), media_type="text/event-stream"
        )
    results = await asyncio.gather(*(engine.generate(i.prompt, i.params, rid=i.rid, lora=i.lora) for i in items))
    latency = time.perf_counter() - started
    with_text = body.return_text_in_logprobs
    answers = [_answer(engine, item, g, with_text, latency) for item, g in zip(items, results, strict=True)]
    return answers if batched else answers[0]


async def _stream(
    engine: Engine, items: list[_Item], batched: bool, with_text: bool, started: float
) -> AsyncIterator[bytes]:
    jobs: list[tuple[list[int], SamplingParams, str | None]] = [(i.prompt, i.params, i.rid) for i in items]
    sent = [0] * len(items)
    try:
        async for index, out in stream_all(engine, jobs, [i.lora for i in items]):
            item = items[index]
            interval = max(1, int(item.raw.get("stream_interval") or 1))
            if isinstance(out, Partial) and len(out.output_ids) - sent[index] < interval:
                continue
            sent[index] = len(out.output_ids)
            answer = _answer(engine, item, out, with_text, time.perf_counter() - started)
            if batched:
                answer["index"] = item.index
            yield sse(answer)
    except Exception as exc:  # reported in the stream, as SGLang does: the status line is already sent
        yield sse({"error": {"message": str(exc)}})
    yield b"data: [DONE]\n\n"


def _reject_extra_fields(body: GenerateRequest) -> None:
    for name, value in (body.model_extra or {}).items():
        if name in _METADATA or value in (None, False, 0, "", [], {}):
            continue
        raise ConfigError(
            f"/generate: {name}={str(value)[:80]} is not supported by sandrl's engine ({name} is not served); leave "
            "it out, or serve the model with SGLang"
        )


def _per_item(value: Any, count: int, name: str, default: Any) -> list[Any]:
    """One value for each of ``count`` prompts: a scalar applies to all, a list must have one per prompt."""
    if value is None:
        return [default] * count
    if isinstance(value, list):
        if len(value) != count:
            raise ConfigError(f"/generate: {name} has {len(value)} entries for a batch of {count} prompts")
        return [default if v is None else v for v in value]
    return [value] * count


def _normalise(engine: Engine, body: GenerateRequest, original_logprob: bool) -> tuple[list[_Item], bool]:
    prompts, batched = _prompts(engine, body)
    count = len(prompts)
    sampling = _per_item(body.sampling_params, count, "sampling_params", {})
    logprob = _per_item(body.return_logprob, count, "return_logprob", False)
    top = _per_item(body.top_logprobs_num, count, "top_logprobs_num", 0)
    start = _per_item(body.logprob_start_len, count, "logprob_start_len", -1)
    n = {int(sp.get("n") or 1) for sp in sampling}
    if len(n) > 1:
        raise ConfigError("/generate: sampling_params.n must be the same for every prompt of a batch (as SGLang's)")
    samples = n.pop()
    if samples < 1:
        raise ConfigError(f"/generate: sampling_params.n must be >= 1, got {samples}")
    if any(s != -1 and lp for s, lp in zip(start, logprob, strict=True)):
        raise ConfigError(
            "/generate: logprob_start_len >= 0 (log-probs of prompt tokens, input_token_logprobs) is not supported "
            "by sandrl's engine; send -1 (output tokens only)"
        )
    rids = _rids(body.rid, count, samples, batched)
    loras = _per_item(body.lora_path, count, "lora_path", None)
    loaded = engine.lora_adapters
    unknown_lora = next((name for name in loras if name is not None and name not in loaded), None)
    if unknown_lora is not None:
        raise ConfigError(
            f"/generate: lora_path {str(unknown_lora)[:80]!r} names no loaded LoRA adapter (loaded: "
            f"{', '.join(loaded) or 'none'}): load it with /load_lora_adapter first"
        )
    items = []
    for i in range(count):
        reject_unsupported(sampling[i], _UNSUPPORTED_SAMPLING, "/generate sampling_params")
        unknown = sorted(set(sampling[i]) - _SAMPLING_FIELDS)
        if unknown:
            raise ConfigError(f"/generate: sampling_params has fields SGLang does not define either: {unknown}")
        params = _params(sampling[i], int(top[i]) if logprob[i] else 0, scaled=not original_logprob)
        for j in range(samples):
            at = i * samples + j
            items.append(_Item(prompts[i], rids[at], at, params, sampling[i], bool(logprob[i]), loras[i]))
    return items, batched or samples > 1


def _rids(rid: str | list[str] | None, count: int, samples: int, batched: bool) -> list[str]:
    if samples > 1:
        return [uuid.uuid4().hex for _ in range(count * samples)]  # SGLang regenerates them for parallel samples
    if isinstance(rid, list):
        if len(rid) != count:
            raise ConfigError(f"/generate: rid has {len(rid)} entries for a batch of {count} prompts")
        if len(set(rid)) != len(rid):
            raise ConfigError(f"/generate: duplicate rids in the batch: {sorted({r for r in rid if rid.count(r) > 1})}")
        return list(rid)
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    return [f"{rid}_{i}" for i in range(count)] if batched else [rid]


def _params(sp: dict[str, Any], top_logprobs: int, *, scaled: bool) -> SamplingParams:
    def value(name: str, default: Any) -> Any:
        # SGLang treats an explicit null as "use the default".
        found = sp.get(name)
        return default if found is None else found

    temperature = float(value("temperature", 1.0))
    if sp.get("top_k") == 1:
        temperature = 0.0  # SGLang's other spelling of greedy
    stop = sp.get("stop") or ()
    seed = value("sampling_seed", sp.get("seed"))
    bias = value("logit_bias", {})
    try:
        logit_bias = tuple((int(t), float(b)) for t, b in bias.items())
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(f"/generate: logit_bias must map token ids to numbers, got {bias!r}") from None
    return SamplingParams(
        temperature=temperature,
        top_p=float(value("top_p", 1.0)),
        max_new_tokens=int(value("max_new_tokens", 128)),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
        seed=int(seed) if seed is not None else None,
        ignore_eos=bool(sp.get("ignore_eos", False)),
        top_logprobs=int(top_logprobs),
        logit_bias=logit_bias,
        scaled_logprobs=scaled,
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


def _answer(engine: Engine, item: _Item, out: Partial | Generation, with_text: bool, latency: float) -> dict[str, Any]:
    finish: dict[str, Any] | None = None
    if isinstance(out, Generation):
        if out.finish_reason == "stop":
            finish = {"type": "stop", "matched": out.matched_stop}
        elif out.finish_reason == "length":
            finish = {"type": "length", "length": out.completion_tokens}
        else:
            finish = {"type": "abort", "message": "aborted (abort_request, pause_generation or shutdown)"}
    final = out if isinstance(out, Generation) else None
    meta: dict[str, Any] = {
        "id": item.rid,
        "finish_reason": finish,
        "prompt_tokens": len(item.prompt),
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
        "weight_version": str(final.weight_version if final else engine.weight_version),
        "start_weight_version": None if final is None else _str(final.start_weight_version),
        "e2e_latency": latency,
    }
    if item.return_logprob:
        texts = [_token_text(engine, t) if with_text else None for t in out.output_ids]
        meta["output_token_logprobs"] = [
            [lp, t, s] for lp, t, s in zip(out.output_logprobs, out.output_ids, texts, strict=True)
        ]
        if out.output_top_logprobs is not None:
            meta["output_top_logprobs"] = [
                [[lp, t, _token_text(engine, t) if with_text else None] for t, lp in row]
                for row in out.output_top_logprobs
            ]
        meta["output_token_weight_versions"] = out.output_weight_versions
    generation = final or Generation(out.output_ids, out.output_logprobs, "length", engine.weight_version, 0)
    text = output_text(
        engine,
        generation,
        skip_special_tokens=bool(item.raw.get("skip_special_tokens", True)),
        keep_stop=bool(item.raw.get("no_stop_trim", False)),
    )
    return {"text": text, "output_ids": list(out.output_ids), "meta_info": meta}


def _token_text(engine: Engine, token: int) -> str | None:
    return engine.tokenizer.decode([token]) if engine.tokenizer is not None else None


def _str(version: int | None) -> str | None:
    return None if version is None else str(version)
