"""Engines' load readings over real HTTP: sandrl's server in SGLang's shapes, vLLM's ``/metrics``, the fleet
router's sum, and answers that are not readings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.serve import open_fleet
from sandrl.inference.kv_capacity import (
    MAX_ENTRIES,
    CapacityProbe,
    KVCapacity,
    from_loads,
    from_vllm_metrics,
    parse,
)
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.transport import HTTPConfig
from sandrl.inference.vllm import VLLMClient

from .conftest import TOKEN
from .vllm_dev_server import create_vllm_app

SLOW = SamplingParams(max_new_tokens=400, ignore_eos=True)


@pytest.fixture
def bounded() -> Iterator[tuple[Engine, str]]:
    """An engine of 600 KV tokens and a batch of 2, served with a token."""
    engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=600, max_batch_size=2))
    with BackgroundServer(create_app(engine, token=TOKEN)) as server:
        yield engine, server.url
    engine.close()


async def busy(engine: Engine, n: int) -> list[asyncio.Future[object]]:
    """``n`` long generations, once the engine runs two and queues the rest."""
    calls: list[asyncio.Future[object]] = [asyncio.ensure_future(engine.generate([i + 1] * 30, SLOW)) for i in range(n)]
    for _ in range(400):
        reading = await engine.kv_capacity()
        if reading.running == min(n, 2) and reading.queued == max(0, n - 2):
            break
        await asyncio.sleep(0.005)
    return calls


async def test_the_server_answers_sglangs_load_routes(bounded: tuple[Engine, str]) -> None:
    engine, url = bounded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    calls = await busy(engine, 3)
    async with httpx.AsyncClient(base_url=url, headers=auth) as http:
        (load,) = (await http.get("/v1/loads")).json()["loads"]
        (old,) = (await http.get("/get_load")).json()
        info = (await http.get("/get_server_info")).json()
        assert (await http.get("/v1/loads")).status_code == 200
    async with httpx.AsyncClient(base_url=url) as anonymous:
        assert (await anonymous.get("/v1/loads")).status_code == 401  # the token's, as every route
    assert load["num_running_reqs"] == 2 and load["num_waiting_reqs"] == 1
    assert load["max_total_num_tokens"] == 600 and load["max_running_requests"] == 2
    assert 60 <= load["num_used_tokens"] <= 600 and load["token_usage"] == pytest.approx(
        load["num_used_tokens"] / 600, abs=1e-5
    )
    assert load["kv_retractions"] == engine.stats.kv_retractions
    assert old["num_reqs"] == 3 and old["num_waiting_reqs"] == 1 and old["num_tokens"] >= 60
    assert info["max_total_num_tokens"] == 600 and info["max_running_requests"] == 2
    async with SGLangClient(url, http=HTTPConfig(api_key=TOKEN)) as client:
        reading = await client.kv_capacity()
    assert reading is not None and (reading.running, reading.queued, reading.total_tokens) == (2, 1, 600)
    engine.abort()
    await asyncio.gather(*calls)


async def test_the_vllm_client_reads_vllms_metrics() -> None:
    engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=800, max_batch_size=2))
    try:
        with BackgroundServer(create_vllm_app(engine)) as server:
            calls = await busy(engine, 3)
            async with VLLMClient(f"vllm://127.0.0.1:{server.port}") as client:
                reading = await client.kv_capacity()
                again = await client.kv_capacity()
            assert reading is not None and again is not None
            assert (reading.running, reading.queued, reading.total_tokens) == (2, 1, 800)  # 50 blocks of 16
            assert reading.used_tokens is not None and 60 <= reading.used_tokens <= 800
            engine.abort()
            await asyncio.gather(*calls)
    finally:
        engine.close()


def test_vllms_text_with_two_engines_sums_each_engines_pool() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0',
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5',
            'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25',
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",swap_space="4"} 1.0',
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="200",swap_space="4"} 1.0',
            "# TYPE vllm:num_preemptions_total counter",
            'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0',
        ]
    )
    reading = from_vllm_metrics(text + "\n")
    assert reading == KVCapacity(running=4, queued=2, used_tokens=800 + 800, total_tokens=4800, engines=2)


def test_answers_that_are_not_readings_read_as_nothing() -> None:
    good = {"num_running_reqs": 1, "num_waiting_reqs": 0, "num_used_tokens": 10, "max_total_num_tokens": 100}
    assert from_loads({"loads": [good]}) == [KVCapacity(1, 0, 10, 100)]
    for bad in ({"loads": []}, {"loads": "x"}, [good], {"loads": [good, 3]}):
        assert from_loads(bad) is None
    for entry in ({"num_running_reqs": -1}, {"num_running_reqs": True}, {"num_waiting_reqs": 2.5}, {}):
        assert from_loads({"loads": [{**good, **entry}]} if entry else {"loads": [entry]}) is None
    assert from_loads({"loads": [{**good, "max_total_num_tokens": 0}]}) == [KVCapacity(1, 0, 10, None)]
    assert from_loads({"loads": [{**good, "num_used_tokens": -5}]}) == [KVCapacity(1, 0, None, 100)]
    many = from_loads({"loads": [good] * (MAX_ENTRIES + 50)})
    assert many is not None and len(many) == MAX_ENTRIES
    assert parse("/v1/loads", "not json") is None
    assert parse("/v1/loads", json.dumps({"loads": [good, good]})) == KVCapacity(2, 0, 20, 200, engines=2)
    assert from_vllm_metrics("vllm:num_requests_running{ 1\n") is None  # not Prometheus text
    assert from_vllm_metrics("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n") is None
    huge = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="' + "9" * 5000 + '"} 1\n'
    running = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
    assert from_vllm_metrics(running + huge) == KVCapacity(1, 0)  # a label that is no count is no pool


async def test_a_server_that_reports_nothing_is_asked_twice_then_never_again() -> None:
    asked: list[str] = []

    async def fetch(route: str) -> tuple[int, str]:
        asked.append(route)
        return 404, "Not Found"

    probe = CapacityProbe()
    assert await probe.read(fetch, "http://x") is None
    assert await probe.read(fetch, "http://x") is None
    assert asked == ["/v1/loads", "/metrics"] and not probe.reports


async def test_the_router_sums_the_loads_of_its_engines_and_skips_a_dead_one(tmp_path: Path) -> None:
    sglang_like = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=300, max_batch_size=2))
    vllm_like = Engine.load("tiny", EngineConfig(seed=1, kv_cache_tokens=512, max_batch_size=2))
    first = BackgroundServer(create_app(sglang_like, token=TOKEN)).start()
    second = BackgroundServer(create_vllm_app(vllm_like)).start()
    try:
        urls = [first.url, second.url]
        async with open_fleet(FleetConfig(), model="tiny", log_dir=tmp_path, attach=urls, token=TOKEN) as fleet:
            calls = await busy(vllm_like, 1)
            async with SGLangClient(fleet.url, http=HTTPConfig(api_key=fleet.token, retries=0)) as client:
                both = await client.kv_capacity()
                assert both is not None and both.engines == 2
                # vLLM does not say its batch size, so the fleet's is not known.
                assert (both.running, both.total_tokens, both.max_running) == (1, 300 + 512, None)
                second.stop()
                alone = await client.kv_capacity()
                assert alone is not None and (alone.engines, alone.total_tokens, alone.running) == (1, 300, 0)
            vllm_like.abort()
            await asyncio.gather(*calls)
    finally:
        first.stop()
        second.stop()
        sglang_like.close()
        vllm_like.close()
