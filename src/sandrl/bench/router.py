"""``sandrl bench inference --router``: what the fleet's router adds to one inference call.

Two embedded engines are launched as a run launches them (``[inference] launch = "embedded"``,
engines = 2, each its own process), with the router on this event loop as in a run. The same
call (a short prompt, ``max_new_tokens`` tokens, greedy) is sent alternately through the router,
as an episode's turn (its routing key bound: ``episodes`` keys of ``turns`` calls each), and
directly to the engine the router chose for it, so the engine's work is the same on both paths.
The overhead is the p50 of the routed calls minus the p50 of the direct ones (target: <= 1 ms),
with the p50 of the pairwise differences beside it; and the routed calls of each key must all
have reached one engine.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sandrl.inference.base import SamplingParams
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.serve import Fleet, open_fleet
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.transport import HTTPConfig
from sandrl.stats import quantile

TARGET_OVERHEAD_MS = 1.0
PROMPT = list(range(32, 96))


async def _measure(model: str, episodes: int, turns: int, max_new_tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-router-") as logs:
        config = FleetConfig(launch="embedded", engines=2, startup_timeout_s=300)
        async with open_fleet(config, model=model, log_dir=Path(logs)) as fleet:
            return await measure(fleet, model, episodes=episodes, turns=turns, max_new_tokens=max_new_tokens)


async def measure(fleet: Fleet, model: str, *, episodes: int, turns: int, max_new_tokens: int) -> dict[str, Any]:
    """The module docstring's measurement on ``fleet`` (its router keeping keys: ``affinity`` on); ``model``
    names its engines' model in the result."""
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
    http = HTTPConfig(api_key=fleet.token, retries=0)
    routed = SGLangClient(fleet.url, http=http)
    direct = [SGLangClient(url, http=http) for url in fleet.engine_urls]
    before = [e.calls for e in fleet.router.engines]
    try:
        for client in (routed, *direct):  # connections open and the engines warm
            for _ in range(3):
                await client.generate(PROMPT, params)
        routed_s: list[float] = []
        direct_s: list[float] = []
        split = 0
        for episode in range(episodes):
            key = f"bench/{episode}"
            seen: set[int] = set()
            for _ in range(turns):
                with affinity.bound(key):
                    start = time.perf_counter()
                    await routed.generate(PROMPT, params)
                    routed_s.append(time.perf_counter() - start)
                engine = fleet.router.pinned(key)
                assert engine is not None
                seen.add(engine.index)
                start = time.perf_counter()
                await direct[engine.index].generate(PROMPT, params)
                direct_s.append(time.perf_counter() - start)
            split += len(seen) > 1
        calls = [e.calls - b for e, b in zip(fleet.router.engines, before, strict=True)]
    finally:
        for client in (routed, *direct):
            await client.aclose()
    routed_p50 = quantile(routed_s, 0.5) * 1000
    direct_p50 = quantile(direct_s, 0.5) * 1000
    overhead = routed_p50 - direct_p50
    paired = statistics.median(r - d for r, d in zip(routed_s, direct_s, strict=True)) * 1000
    return {
        "bench": "inference_router",
        "model": model,
        "engines": len(fleet.engine_urls),
        "calls": len(routed_s),
        "episodes": episodes,
        "turns": turns,
        "max_new_tokens": max_new_tokens,
        "routed_ms_p50": round(routed_p50, 3),
        "direct_ms_p50": round(direct_p50, 3),
        "routed_ms_p99": round(quantile(routed_s, 0.99) * 1000, 3),
        "direct_ms_p99": round(quantile(direct_s, 0.99) * 1000, 3),
        "router_overhead_ms_p50": round(overhead, 3),
        "router_overhead_ms_paired_p50": round(paired, 3),
        "episodes_split": split,
        "calls_per_engine": calls,
        "target_overhead_ms": TARGET_OVERHEAD_MS,
        "meets_target": overhead <= TARGET_OVERHEAD_MS and split == 0,
    }


def bench_router(
    model: str = "tiny", *, episodes: int = 100, turns: int = 4, max_new_tokens: int = 1
) -> dict[str, Any]:
    """Run the benchmark of the module docstring; the result as one JSON-ready dict."""
    return asyncio.run(_measure(model, episodes, turns, max_new_tokens))


def render_card(result: dict[str, Any]) -> str:
    verdict = "meets" if result["meets_target"] else "MISSES"
    return "\n".join(
        [
            f"inference router: {result['engines']} embedded engines, {result['calls']} calls each way "
            f"({result['episodes']} episodes x {result['turns']} turns, {result['max_new_tokens']} token(s) each)",
            f"  routed  p50 {result['routed_ms_p50']:.3f} ms   p99 {result['routed_ms_p99']:.3f} ms",
            f"  direct  p50 {result['direct_ms_p50']:.3f} ms   p99 {result['direct_ms_p99']:.3f} ms",
            f"  router overhead per call p50 {result['router_overhead_ms_p50']:.3f} ms "
            f"(paired {result['router_overhead_ms_paired_p50']:.3f} ms; {verdict} the "
            f"{result['target_overhead_ms']:g} ms target)",
            f"  episodes split over engines {result['episodes_split']}   calls per engine {result['calls_per_engine']}",
        ]
    )
