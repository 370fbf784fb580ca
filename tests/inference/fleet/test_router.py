"""The router: each key pinned to one engine, new keys to the fewest outstanding tokens, a dead engine's
keys moved (and the move counted on the episode), control routes broadcast and replayed into an engine
that comes back. Real HTTP on loopback to stand-in engines (:mod:`.standins`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.forward import EngineGone, EnginePool
from sandrl.inference.fleet.proxy import estimate_tokens
from sandrl.inference.fleet.router import NoEngineError, Router
from sandrl.inference.fleet.serve import Fleet, open_fleet
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.transport import HTTPConfig

from .standins import StandIn

GREEDY = SamplingParams(temperature=0, max_new_tokens=4)
TOKEN = "router-test-token-0123456789abcdef"


def test_a_key_stays_on_its_engine_and_new_keys_go_to_the_fewest_outstanding_tokens() -> None:
    router = Router(["http://a", "http://b", "http://c"])
    a, _ = router.pick("episode-1")
    router.begin(a, 5000)  # a long prompt in flight on a
    b, _ = router.pick("episode-2")
    router.begin(b, 100)
    c, moved = router.pick("episode-3")
    assert (a.index, b.index, c.index) == (0, 1, 2) and not moved
    router.begin(c, 200)
    assert router.pick("episode-4")[0] is b  # 100 outstanding tokens: the least
    assert router.pick("episode-1")[0] is a  # pinned, however loaded
    router.end(a, 5000, answered=True)
    assert router.pick("episode-5")[0] is a


def test_a_dead_engines_keys_move_once_and_pins_are_bounded() -> None:
    router = Router(["http://a", "http://b"], max_keys=2)
    a, _ = router.pick("episode-1")
    router.lost(a, stale=True)
    moved_to, moved = router.pick("episode-1")
    assert moved_to.index == 1 and moved and router.moves == 1
    assert router.pick("episode-1") == (moved_to, False)  # pinned to its new engine now
    router.pick("episode-2")
    router.pick("episode-3")
    assert router.pinned("episode-1") is None  # the least recently used pin went
    router.lost(moved_to, stale=True)
    with pytest.raises(NoEngineError, match="no inference engine is up"):
        router.pick("episode-2")


def test_without_affinity_calls_go_round_the_live_engines_and_only_explicit_pins_hold() -> None:
    router = Router(["http://a", "http://b", "http://c"], affinity=False)
    heavy, _ = router.pick("episode-1")
    router.begin(heavy, 5000)  # load does not matter either: the next engine in turn takes the call
    picked = [router.pick("episode-1")[0].index for _ in range(5)]
    assert [heavy.index, *picked] == [0, 1, 2, 0, 1, 2]
    assert router.pinned("episode-1") is None and router.stats()["affinity"] is False
    router.pin("session/s1", router.engines[1])  # a session lives on the engine that opened it
    assert [router.pick("session/s1")[0].index for _ in range(3)] == [1, 1, 1]
    router.lost(router.engines[1], stale=True)
    moved_to, moved = router.pick("session/s1")
    assert moved and moved_to.index != 1 and router.pick("session/s1") == (moved_to, False)
    assert {router.pick(None)[0].index for _ in range(4)} == {0, 2}


def test_a_request_weighs_its_prompt_and_its_budget() -> None:
    assert estimate_tokens(b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 10}}') == 13
    assert estimate_tokens(b'{"prompt": [5, 6], "max_tokens": 4}') == 6
    assert estimate_tokens(b'{"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 1}') == 4
    assert estimate_tokens(b"not json") == 128


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Fleet, list[StandIn]]]:
    engines = [StandIn(0).start(), StandIn(1).start()]
    try:
        urls = [e.url for e in engines]
        async with open_fleet(FleetConfig(), model="tiny", log_dir=Path("."), attach=urls, token=TOKEN) as f:
            yield f, engines
    finally:
        for engine in engines:
            engine.stop()


def client(fleet: Fleet) -> SGLangClient:
    return SGLangClient(fleet.url, http=HTTPConfig(api_key=fleet.token, retries=0))


async def test_an_episodes_calls_reach_one_engine_until_it_dies_then_move_once(
    fleet: tuple[Fleet, list[StandIn]],
) -> None:
    served, engines = fleet
    async with client(served) as policy:
        with affinity.bound("run/echo-1#0/0") as route:
            first = [(await policy.generate([1, 2, 3], GREEDY)).output_ids[0] for _ in range(4)]
        with affinity.bound("run/echo-1#0/1"):
            other = (await policy.generate([1, 2, 3], GREEDY)).output_ids[0]
        assert len(set(first)) == 1 and other != first[0]  # the second episode went to the idle engine
        home = engines[first[0]]
        assert [r.key for r in home.requests if r.path == "/generate"] == ["run/echo-1#0/0"] * 4
        home.stop()
        with affinity.bound(route):
            moved = (await policy.generate([1, 2, 3], GREEDY)).output_ids[0]
            again = (await policy.generate([1, 2, 3], GREEDY)).output_ids[0]
        assert moved == again == 1 - first[0]
        assert route.moves == 1  # counted once: the call that left the dead engine
        async with httpx.AsyncClient() as http:
            stats = (await http.get(served.url + "/sandrl/fleet", headers=auth(served))).json()
        assert stats["moves"] == 1 and [e["up"] for e in stats["engines"]][first[0]] is False


async def test_weights_go_to_every_engine_and_are_replayed_into_one_that_comes_back(
    fleet: tuple[Fleet, list[StandIn]],
) -> None:
    served, engines = fleet
    async with client(served) as policy:
        assert await policy.update_weights("/ckpt/weights-v5", version=5) == 5
        await policy.load_lora_adapter("sandrl-v5", "/ckpt/adapter-v5")
        for engine in engines:
            assert "/update_weights_from_disk" in engine.paths() and "/load_lora_adapter" in engine.paths()
        engines[0].stop()
        with affinity.bound("episode"):
            for _ in range(2):  # the first call finds engine 0 dead; then every new key goes to engine 1
                await policy.generate([1], GREEDY)
        engines[0].requests.clear()
        engines[0].start()  # restarted on its port, with none of the updates
        async with asyncio.timeout(10):
            while not served.router.engines[0].up:
                await asyncio.sleep(0.05)
        replayed = [r for r in engines[0].requests if r.path != "/health"]
        assert [r.path for r in replayed] == ["/update_weights_from_disk", "/load_lora_adapter"]
        assert replayed[0].body["model_path"] == "/ckpt/weights-v5" and replayed[0].body["weight_version"] == "5"
        assert {r.content_type for r in replayed} == {"application/json"}  # a JSON body, said so (FastAPI needs it)
        with affinity.bound("a new episode"):
            await policy.generate([1], GREEDY)
        assert engines[0].paths()[-1] == "/generate"  # serving again: the least loaded takes new keys


async def test_the_router_wants_its_token_and_says_when_no_engine_is_up(fleet: tuple[Fleet, list[StandIn]]) -> None:
    served, engines = fleet
    async with httpx.AsyncClient(base_url=served.url) as http:
        assert (await http.post("/generate", json={"input_ids": [1]})).status_code == 401
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/get_model_info", headers=auth(served))).json()["model_path"] == "stand-in-0"
        for engine in engines:
            engine.stop()
        served.proxy.wait_s = 0.2
        answer = await http.post("/generate", json={"input_ids": [1]}, headers=auth(served))
        assert answer.status_code == 503 and "no inference engine is up" in answer.json()["message"]
        assert (await http.get("/health")).status_code == 503


async def test_an_unreachable_url_in_the_list_is_named() -> None:
    live = StandIn(0).start()
    try:
        with pytest.raises(ConfigError) as caught:
            urls = [live.url, "http://127.0.0.1:9"]
            async with open_fleet(FleetConfig(), model="tiny", log_dir=Path("."), attach=urls):
                pass
    finally:
        live.stop()
    message = caught.value.message
    assert "http://127.0.0.1:9 (number 2 of 2" in message and "start it, or drop it from the list" in message
    assert "\n" not in message


async def test_generation_calls_share_kept_alive_connections_and_survive_one_closed_while_idle() -> None:
    engine = StandIn(0).start()
    pool = EnginePool(engine.url)
    try:
        for _ in range(3):
            answer = await pool.request("POST", "/generate", [(b"content-type", b"application/json")], b"{}")
            assert answer.status == 200 and b"output_token_logprobs" in await answer.read()
        assert len({r.client_port for r in engine.requests}) == 1  # one connection, kept alive
        engine.stop()  # the pooled connection is closed under the pool, as an engine's keep-alive timeout does
        engine.start()
        answer = await pool.request("POST", "/generate", [], b"{}")
        assert answer.status == 200 and b"output_token_logprobs" in await answer.read()
        assert len(engine.requests) == 4
        engine.stop()
        with pytest.raises(EngineGone, match="cannot be reached"):
            await pool.request("POST", "/generate", [], b"{}")
    finally:
        pool.close()
        engine.stop()


def auth(fleet: Fleet) -> dict[str, str]:
    return {"Authorization": f"Bearer {fleet.token}"}
