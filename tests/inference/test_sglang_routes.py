"""SGLang's /generate fields and control routes, over real HTTP against the real engine (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.inference.tokenizer import ByteTokenizer

LONG = {"max_new_tokens": 400, "ignore_eos": True}


@pytest.fixture
async def own(fresh_served: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a server of its own (its weights change, it is paused, its requests aborted)."""
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=60, headers=fresh_served.headers) as client:
        yield client


async def _until_running(http: httpx.AsyncClient, count: int = 1) -> None:
    for _ in range(500):
        info = (await http.get("/get_server_info")).json()
        if info["internal_states"][0]["#running_req"] >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the requests never started")


def _events(body: str) -> list[Any]:
    assert body.endswith("data: [DONE]\n\n")
    chunks = body.split("\n\n")[:-2]
    assert all(c.startswith("data: ") for c in chunks)
    return [json.loads(c.removeprefix("data: ")) for c in chunks]


async def test_n_samples_a_prompt_n_times_prompt_major(http: httpx.AsyncClient) -> None:
    sp = {"max_new_tokens": 8, "ignore_eos": True, "n": 3, "temperature": 1.0}
    r = await http.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": sp})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert isinstance(answers, list) and len(answers) == 3
    assert len({a["meta_info"]["id"] for a in answers}) == 3
    assert len({tuple(a["output_ids"]) for a in answers}) > 1, "three samples of one prompt should differ"
    r = await http.post("/generate", json={"input_ids": [[1, 2], [5, 6, 7]], "sampling_params": {**sp, "n": 2}})
    assert [a["meta_info"]["prompt_tokens"] for a in r.json()] == [2, 2, 3, 3]
    r = await http.post("/generate", json={"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 1}]})
    assert r.status_code == 400 and "sampling_params.n must be the same" in r.json()["message"]


async def test_a_batch_rid_is_split_and_listed_rids_are_checked(http: httpx.AsyncClient) -> None:
    body: dict[str, Any] = {"input_ids": [[1], [2], [3]], "sampling_params": {"max_new_tokens": 1}, "rid": "job"}
    r = await http.post("/generate", json=body)
    assert [a["meta_info"]["id"] for a in r.json()] == ["job_0", "job_1", "job_2"]
    r = await http.post("/generate", json={**body, "rid": ["a", "b", "c"]})
    assert [a["meta_info"]["id"] for a in r.json()] == ["a", "b", "c"]
    r = await http.post("/generate", json={**body, "rid": ["a", "b"]})
    assert r.status_code == 400 and "rid has 2 entries for a batch of 3" in r.json()["message"]
    r = await http.post("/generate", json={**body, "rid": ["a", "a", "c"]})
    assert r.status_code == 400 and "duplicate rids" in r.json()["message"]
    r = await http.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}, "rid": "one"})
    assert r.json()["meta_info"]["id"] == "one"


async def test_list_valued_sampling_params_and_return_logprob(http: httpx.AsyncClient) -> None:
    body = {
        "input_ids": [[1, 2], [3, 4]],
        "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}, {"max_new_tokens": 5, "ignore_eos": True}],
        "return_logprob": [True, False],
        "top_logprobs_num": [2, 0],
    }
    first, second = (await http.post("/generate", json=body)).json()
    assert (first["meta_info"]["completion_tokens"], second["meta_info"]["completion_tokens"]) == (2, 5)
    assert len(first["meta_info"]["output_token_logprobs"]) == 2 and "output_token_logprobs" not in second["meta_info"]
    assert [len(row) for row in first["meta_info"]["output_top_logprobs"]] == [2, 2]
    r = await http.post("/generate", json={**body, "return_logprob": [True]})
    assert r.status_code == 400 and "return_logprob has 1 entries for a batch of 2" in r.json()["message"]


async def test_logit_bias_and_return_text_in_logprobs(http: httpx.AsyncClient, tokenizer: ByteTokenizer) -> None:
    forced = ord("Z")
    sp = {"max_new_tokens": 3, "temperature": 0, "logit_bias": {str(forced): 100.0}}
    body = {"input_ids": [1, 2], "sampling_params": sp, "return_logprob": True, "return_text_in_logprobs": True}
    answer = (await http.post("/generate", json=body)).json()
    assert answer["output_ids"] == [forced] * 3
    assert [e[2] for e in answer["meta_info"]["output_token_logprobs"]] == ["Z", "Z", "Z"]
    plain = (await http.post("/generate", json={**body, "return_text_in_logprobs": False})).json()
    assert [e[2] for e in plain["meta_info"]["output_token_logprobs"]] == [None] * 3
    bad = {"input_ids": [1], "sampling_params": {"logit_bias": {"x": 1}}}
    assert "logit_bias must map token ids" in (await http.post("/generate", json=bad)).json()["message"]


async def test_stream_sends_sglang_server_sent_events(http: httpx.AsyncClient) -> None:
    sp = {"max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 4}
    body = {"input_ids": [1, 2, 3], "sampling_params": sp, "stream": True, "return_logprob": True}
    r = await http.post("/generate", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    # Cumulative events, one per token unless the reader fell behind (then they coalesce, as SGLang's
    # do: on a loaded box all five can come as one, so the count is not asserted).
    lengths = [len(e["output_ids"]) for e in events]
    assert lengths == sorted(set(lengths)) and lengths[-1] == 5
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    final = events[-1]
    assert all(final["output_ids"][: len(e["output_ids"])] == e["output_ids"] for e in events)
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(final["meta_info"]["output_token_logprobs"]) == 5
    same = (await http.post("/generate", json={**body, "stream": False})).json()
    assert same["output_ids"] == final["output_ids"]
    # A batch stream tags each event with its item's index.
    batch = {**body, "input_ids": [[1], [2, 3]], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    events = _events((await http.post("/generate", json=batch)).text)
    assert {e["index"] for e in events} == {0, 1}
    assert sum(e["meta_info"]["finish_reason"] is not None for e in events) == 2
    # A bad prompt is a plain 400, not an event.
    r = await http.post("/generate", json={**body, "input_ids": [10**6]})
    assert r.status_code == 400 and "outside the model's vocabulary" in r.json()["message"]


async def test_fields_sandrl_cannot_honour_are_refused_by_name(http: httpx.AsyncClient) -> None:
    cases = [
        ({"lora_path": "/adapters/a"}, "lora_path '/adapters/a' names no loaded LoRA adapter"),
        ({"return_logprob": True, "logprob_start_len": 0}, "logprob_start_len >= 0"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty=0.5"),
        ({"sampling_params": {"max_new_token": 3}}, "max_new_token"),
    ]
    for extra, named in cases:
        r = await http.post("/generate", json={"input_ids": [1], **extra})
        assert r.status_code == 400 and named in r.json()["message"], (extra, r.text)
    ok = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}, "priority": 3, "lora_path": None}
    assert (await http.post("/generate", json=ok)).status_code == 200


async def test_abort_request_ends_a_running_request_with_its_tokens(own: httpx.AsyncClient) -> None:
    flight = asyncio.ensure_future(own.post("/generate", json={"input_ids": [1], "sampling_params": LONG, "rid": "x"}))
    await _until_running(own)
    assert (await own.post("/abort_request", json={"rid": "x"})).status_code == 200
    meta = (await flight).json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and 0 < meta["completion_tokens"] < 400
    flights = [
        asyncio.ensure_future(own.post("/generate", json={"input_ids": [i + 1], "sampling_params": LONG}))
        for i in range(2)
    ]
    await _until_running(own, 2)
    assert (await own.post("/abort_request", json={"abort_all": True})).status_code == 200
    assert all(r.json()["meta_info"]["finish_reason"]["type"] == "abort" for r in await asyncio.gather(*flights))


async def test_pause_and_continue_generation(own: httpx.AsyncClient) -> None:
    r = await own.post("/pause_generation", json={"mode": "in_place"})
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    short = {"input_ids": [1], "sampling_params": {"max_new_tokens": 3}}
    flight = asyncio.ensure_future(own.post("/generate", json=short))
    await asyncio.sleep(0.2)
    assert not flight.done(), "a paused server must hold new requests"
    assert (await own.post("/continue_generation")).json()["status"] == "ok"
    assert (await flight).json()["meta_info"]["finish_reason"] is not None
    # mode abort (also what an empty body means) ends the requests in flight.
    flight = asyncio.ensure_future(own.post("/generate", json={"input_ids": [1], "sampling_params": LONG}))
    await _until_running(own)
    assert (await own.post("/pause_generation")).status_code == 200
    assert (await flight).json()["meta_info"]["finish_reason"]["type"] == "abort"
    await own.post("/continue_generation")
    r = await own.post("/pause_generation", json={"mode": "sleep"})
    assert r.status_code == 400 and "mode='sleep'" in r.json()["message"]


async def test_weight_update_fields(own: httpx.AsyncClient, other_checkpoint: Path) -> None:
    flight = asyncio.ensure_future(own.post("/generate", json={"input_ids": [1], "sampling_params": LONG}))
    await _until_running(own)
    body = {"model_path": str(other_checkpoint), "weight_version": "3", "abort_all_requests": True}
    r = await own.post("/update_weights_from_disk", json={**body, "flush_cache": True, "is_async": False})
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert (await flight).json()["meta_info"]["finish_reason"]["type"] == "abort"
    # sandrl's update_policy: the request in flight resumes on the new weights, versions per token.
    flight = asyncio.ensure_future(
        own.post("/generate", json={"input_ids": [1], "sampling_params": LONG, "return_logprob": True})
    )
    await _until_running(own)
    body = {"model_path": str(other_checkpoint), "weight_version": "4", "update_policy": "abort_and_resume"}
    assert (await own.post("/update_weights_from_disk", json={**body, "token_step": 4})).status_code == 200
    meta = (await flight).json()["meta_info"]
    versions = meta["output_token_weight_versions"]
    assert meta["finish_reason"]["type"] == "length" and versions[0] == 3 and versions[-1] == 4
    assert (await own.get("/get_server_info")).json()["token_step"] == 4
    for bad, named in [
        ({"manifest": {"a": 1}}, "manifest"),
        ({"load_format": "gguf"}, "load_format='gguf'"),
        ({"weight_version": "v2"}, "weight_version='v2'"),
        ({"update_policy": "later"}, "update_policy"),
        ({"frobnicate": 1}, "frobnicate"),
    ]:
        r = await own.post("/update_weights_from_disk", json={"model_path": str(other_checkpoint), **bad})
        assert r.status_code == 400 and named in r.text, (bad, r.text)
    # keep_pause leaves the server paused after the swap.
    body = {"model_path": str(other_checkpoint), "keep_pause": True}
    assert (await own.post("/update_weights_from_disk", json=body)).status_code == 200
    assert (await own.get("/get_server_info")).json()["internal_states"][0]["paused"] is True
    await own.post("/continue_generation")


async def test_an_update_waits_for_requests_in_flight_by_default(
    own: httpx.AsyncClient, other_checkpoint: Path
) -> None:
    """SGLang's update holds its writer lock until the running requests finish; so does sandrl's (policy pause)."""
    sp = {"max_new_tokens": 150, "ignore_eos": True}
    flight = asyncio.ensure_future(
        own.post("/generate", json={"input_ids": [1], "sampling_params": sp, "return_logprob": True})
    )
    await _until_running(own)
    body = {"model_path": str(other_checkpoint), "weight_version": "2"}
    assert (await own.post("/update_weights_from_disk", json=body)).status_code == 200
    meta = (await flight).json()["meta_info"]
    assert meta["output_token_weight_versions"] == [0] * 150 and meta["weight_version"] == "0"


async def test_update_weight_version(own: httpx.AsyncClient) -> None:
    r = await own.post("/update_weight_version", json={"new_version": "9"})
    assert r.json() == {"success": True, "message": "Weight version updated to 9", "new_version": "9"}
    assert (await own.get("/get_weight_version")).json() == {"weight_version": "9"}
    answer = (await own.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})).json()
    assert answer["meta_info"]["weight_version"] == "9"
    r = await own.post("/update_weight_version", json={"new_version": "final"})
    assert r.status_code == 400 and "integers" in r.json()["message"]


async def test_cache_memory_and_tensor_routes(own: httpx.AsyncClient) -> None:
    http = own  # control routes: the server with a token
    for method in ("GET", "POST"):
        r = await http.request(method, "/flush_cache")
        assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    for route in ("/release_memory_occupation", "/resume_memory_occupation"):
        assert (await http.post(route, json={"tags": ["weights", "kv_cache"]})).status_code == 200
        assert (await http.post(route)).status_code == 200
        r = await http.post(route, json={"tags": ["gpu0"]})
        assert r.status_code == 400 and "unknown tags ['gpu0']" in r.json()["message"]
    r = await http.post("/update_weights_from_tensor", json={"serialized_named_tensors": ["AAAA"]})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "/update_weights_from_disk" in r.json()["message"]
    # the group routes are served (tests/inference/test_weight_broadcast.py): a request without its fields is named
    missing = (("/update_weights_from_distributed", "names"), ("/init_weights_update_group", "master_address"))
    for route, field in missing:
        r = await http.post(route, json={})
        assert r.status_code == 400 and field in r.text


async def test_server_info_under_both_names(http: httpx.AsyncClient) -> None:
    a = (await http.get("/get_server_info")).json()
    b = (await http.get("/server_info")).json()
    assert a["model_path"] == b["model_path"] == "tiny"
    # The policy a plain /update_weights_from_disk follows: the server's, pause unless set (as SGLang).
    assert a["weight_version"] == "0" and a["update_policy"] == "pause" and a["engine"] == "sandrl"
    assert a["internal_states"][0]["paused"] is False
