"""A colocated trainer's share of memory: the embedded engine really lets go of its weights and KV cache
(``/release_memory_occupation``) and takes them back (``/resume_memory_occupation``) as they were."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine

from .conftest import Served

pytestmark = pytest.mark.timeout(120)
PROMPT = [5, 6, 7, 8, 9]
SEEDED = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)


def _param_bytes(engine: Engine) -> int:
    return sum(p.numel() * p.element_size() for p in engine.model.parameters())


async def test_released_weights_are_freed_and_come_back_bit_for_bit(other_checkpoint: Path) -> None:
    engine = Engine.load("tiny")
    try:
        before = await engine.generate(PROMPT, SEEDED)
        held = _param_bytes(engine)
        freed = await engine.release_memory_occupation()
        assert freed == held > 0 and _param_bytes(engine) == 0
        assert engine.memory_released == {"kv_cache", "weights"}
        waiting = asyncio.ensure_future(engine.generate(PROMPT, SEEDED))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # generation waits for the memory to come back
        with pytest.raises(ConfigError, match="resume them first"):
            await engine.update_weights(str(other_checkpoint))
        await engine.resume_memory_occupation(["weights"])
        assert _param_bytes(engine) == held and engine.memory_released == {"kv_cache"}
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the KV cache is not back yet
        await engine.resume_memory_occupation(["kv_cache"])
        after = await asyncio.wait_for(waiting, 30)
        assert after.output_ids == before.output_ids and after.output_logprobs == before.output_logprobs
    finally:
        engine.close()


async def test_a_request_in_flight_when_the_kv_cache_goes_resumes_where_it_was() -> None:
    engine = Engine.load("tiny")
    try:
        long = SamplingParams(max_new_tokens=200, temperature=1.0, seed=3, ignore_eos=True)
        alone = await engine.generate(PROMPT, long)
        running = asyncio.ensure_future(engine.generate(PROMPT, long))
        while engine.running == 0:
            await asyncio.sleep(0.005)
        held = (await engine.kv_capacity()).used_tokens
        assert held and held > 0 and engine.prefix_cache.tokens > 0  # the running request's KV, the first's cached
        assert await engine.release_memory_occupation(["kv_cache"]) == 0
        after = await engine.kv_capacity()
        assert (after.used_tokens, after.running, engine.prefix_cache.tokens) == (0, 0, 0)  # all of it let go
        await engine.resume_memory_occupation(["kv_cache"])
        again = await asyncio.wait_for(running, 60)
        assert again.output_ids == alone.output_ids
    finally:
        engine.close()


async def test_the_routes_release_and_resume_behind_the_token(fresh_served: Served) -> None:
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=60) as http:
        assert (await http.post("/release_memory_occupation", json={})).status_code in (401, 403)
        headers = fresh_served.headers
        r = await http.post("/release_memory_occupation", json={"tags": ["weights", "kv_cache"]}, headers=headers)
        assert r.status_code == 200 and r.json()["freed_weight_bytes"] > 0
        assert _param_bytes(fresh_served.engine) == 0
        r = await http.post("/release_memory_occupation", json={"tags": ["gpu0"]}, headers=headers)
        assert r.status_code == 400 and "gpu0" in r.json()["message"]
        assert (await http.post("/resume_memory_occupation", json={}, headers=headers)).status_code == 200
        assert _param_bytes(fresh_served.engine) > 0 and fresh_served.engine.memory_released == set()
