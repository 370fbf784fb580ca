"""``sandrl bench gateway``: what the session gateway adds to a chat turn, at hundreds of sessions.

One real server (the embedded tiny model behind uvicorn on loopback, with a token of the run's
own) serves both paths, in the same run:

- **gateway**: ``sessions`` conversations at once, each opened with ``POST /v1/sessions`` and
  driven turn by turn through ``{base_url}/chat/completions`` as a harness would (the whole
  history sent every turn, the reply appended, a new user message);
- **direct**: the same turns sent to the engine itself (``/generate`` with the very prompt ids the
  gateway recorded and the same seed), so the model's work is identical.

Two readings of the cost, both reported:

- ``overhead_ms``: the gateway's own time on a call with the model's time taken out (matching the
  history, rendering the new messages, parsing the reply, building the answer), as the gateway
  measures it (``session.gateway_ms``). Target (issue #21): p50 <= 1 ms at 256 sessions, 0 errors.
- ``added_latency_ms_p50``: the client-seen p50 latency of a gateway turn minus a direct one. It
  also holds what OpenAI's API costs by its shape (the whole history sent as JSON and validated
  every turn, against a list of ids) and the scheduling noise of a 2-core box where client,
  server and model share the cores.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from sandrl.background_server import BackgroundServer
from sandrl.bench.gateway_apis import APIS, Conversation
from sandrl.errors import ConfigError
from sandrl.http_auth import new_token
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.server import create_app
from sandrl.inference.tokenizer import TINY
from sandrl.stats import quantile

TARGET_OVERHEAD_MS = 1.0


async def _gateway_session(
    http: httpx.AsyncClient, url: str, index: int, turns: int, max_tokens: int, api: str, stream: bool
) -> tuple[list[float], list[float], list[list[int]], int]:
    """One conversation through the gateway: (overheads ms, latencies s, prompt ids per turn, errors)."""
    overheads: list[float] = []
    latencies: list[float] = []
    errors = 0
    opened = await http.post(f"{url}/v1/sessions")
    if opened.status_code != 200:
        return overheads, latencies, [], turns
    base = opened.json()["base_url"]
    key = {"Authorization": f"Bearer {opened.json()['api_key']}"}  # the session's own key, as a harness sends it
    conversation = Conversation.start(api, stream, index)
    for turn in range(turns):
        started = time.perf_counter()
        r = await http.post(f"{base}{conversation.path()}", json=conversation.body(max_tokens), headers=key)
        raw = await r.aread()
        latencies.append(time.perf_counter() - started)
        if r.status_code != 200:
            errors += 1
            break
        overheads.append(conversation.take(raw, turn))
    record = (await http.delete(f"{url}/v1/sessions/{opened.json()['id']}")).json()
    # The prompt of each turn as the model saw it (what the direct path sends): the context before its output.
    ids = record["ids"]
    prompts = [ids[t["output_start"] - t["context_tokens"] : t["output_start"]] for t in record["turns"]]
    return overheads, latencies, prompts, errors


async def _direct_turn(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> float:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
    started = time.perf_counter()
    r = await http.post(f"{url}/generate", json=body)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:200]}")
    return elapsed


async def _run(
    url: str, token: str, sessions: int, turns: int, max_tokens: int, api: str, stream: bool
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(limits=limits, timeout=600, headers=headers) as http:
        await _gateway_session(http, url, -1, 1, max_tokens, api, stream)  # warm-up: the first request loads lazily
        started = time.perf_counter()
        results = await asyncio.gather(
            *(_gateway_session(http, url, i, turns, max_tokens, api, stream) for i in range(sessions))
        )
        gateway_wall = time.perf_counter() - started
        overheads = [o for r in results for o in r[0]]
        gateway_latency = [x for r in results for x in r[1]]
        errors = sum(r[3] for r in results)

        # The same turns, each conversation's in order and the conversations at once, as the sessions ran.
        async def direct(prompts: list[list[int]]) -> list[float]:
            return [await _direct_turn(http, url, prompt, max_tokens) for prompt in prompts]

        started = time.perf_counter()
        direct_latency = [x for r in await asyncio.gather(*(direct(r[2]) for r in results)) for x in r]
        direct_wall = time.perf_counter() - started
    p50_gateway = quantile(gateway_latency, 0.5)
    p50_direct = quantile(direct_latency, 0.5)
    added_ms = (p50_gateway - p50_direct) * 1000
    return {
        "bench": "gateway",
        "api": api,
        "stream": stream,
        "sessions": sessions,
        "turns_per_session": turns,
        "max_tokens": max_tokens,
        "turns": len(overheads),
        "errors": errors,
        "overhead_ms_p50": round(quantile(overheads, 0.5), 3),
        "overhead_ms_p99": round(quantile(overheads, 0.99), 3),
        "added_latency_ms_p50": round(added_ms, 2),
        "gateway_latency_ms_p50": round(p50_gateway * 1000, 2),
        "direct_latency_ms_p50": round(p50_direct * 1000, 2),
        "latency_ratio_p50": round(p50_gateway / p50_direct, 3) if p50_direct else None,
        "gateway_wall_s": round(gateway_wall, 2),
        "direct_wall_s": round(direct_wall, 2),
        "target_overhead_ms": TARGET_OVERHEAD_MS,
        "meets_target": bool(overheads) and errors == 0 and quantile(overheads, 0.5) <= TARGET_OVERHEAD_MS,
    }


def bench_gateway(
    model: str = TINY,
    *,
    sessions: int = 256,
    turns: int = 4,
    max_tokens: int = 4,
    seed: int = 0,
    api: str = "chat",
    stream: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON line of ``sandrl bench gateway``."""
    if min(sessions, turns, max_tokens) < 1:
        raise ConfigError("bench gateway: sessions, turns and max_tokens must be >= 1")
    if api not in APIS:
        raise ConfigError(f"bench gateway: --api must be one of {', '.join(APIS)}, got {api!r}")
    engine = Engine.load(model, EngineConfig(seed=seed))
    try:
        token = new_token()
        with BackgroundServer(create_app(engine, token=token), name="inference server") as server:
            result = asyncio.run(_run(server.url, token, sessions, turns, max_tokens, api, stream))
    finally:
        engine.close()
    return {**result, "model": model}


def render_card(result: dict[str, Any]) -> str:
    verdict = "meets" if result["meets_target"] else "MISSES"
    return "\n".join(
        [
            f"session gateway ({result['api']}{', streamed' if result['stream'] else ''}): "
            f"{result['sessions']} sessions x {result['turns_per_session']} turns "
            f"({result['max_tokens']} tokens each), {result['turns']} turns served, {result['errors']} errors",
            f"  gateway overhead per turn   p50 {result['overhead_ms_p50']:.3f} ms"
            f"   p99 {result['overhead_ms_p99']:.3f} ms"
            f"   ({verdict} the {result['target_overhead_ms']:g} ms target)",
            f"  turn latency p50            gateway {result['gateway_latency_ms_p50']:.1f} ms"
            f"   direct {result['direct_latency_ms_p50']:.1f} ms   (+{result['added_latency_ms_p50']:.1f} ms,"
            f" x{result['latency_ratio_p50']})",
        ]
    )
