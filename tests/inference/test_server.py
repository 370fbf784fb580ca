"""The inference server's SGLang routes and error bodies, over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from sandrl.inference.tokenizer import ByteTokenizer


async def test_generate_answers_in_sglang_shape(http: httpx.AsyncClient, tokenizer: ByteTokenizer) -> None:
    prompt = tokenizer.encode_messages([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    r = await http.post(
        "/generate",
        json={
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.7, "ignore_eos": True, "sampling_seed": 2},
            "return_logprob": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (len(prompt), 6, "0")
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == body["output_ids"] and len(entries) == 6
    assert all(isinstance(e[0], float) and e[0] <= 0 and e[2] is None for e in entries)
    assert body["text"] == tokenizer.decode(body["output_ids"], skip_special_tokens=True)


async def test_generate_takes_text_and_batches(http: httpx.AsyncClient) -> None:
    r = await http.post("/generate", json={"text": ["a", "bb"], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert [a["meta_info"]["prompt_tokens"] for a in answers] == [1, 2]
    assert all("output_token_logprobs" not in a["meta_info"] for a in answers)
    r = await http.post("/generate", json={"input_ids": [[1, 2, 3], [4]], "sampling_params": {"max_new_tokens": 2}})
    assert [a["meta_info"]["prompt_tokens"] for a in r.json()] == [3, 1]


async def test_stop_string_is_trimmed_from_text_unless_asked(http: httpx.AsyncClient) -> None:
    base = {"text": "x", "sampling_params": {"max_new_tokens": 40, "sampling_seed": 9, "ignore_eos": True}}
    free = (await http.post("/generate", json=base)).json()
    ascii_ids = [t for t in free["output_ids"] if 32 <= t < 127]
    needle = chr(ascii_ids[1])
    for no_trim in (False, True):
        sp = {**base["sampling_params"], "stop": [needle], "no_stop_trim": no_trim}
        answer = (await http.post("/generate", json={**base, "sampling_params": sp})).json()
        assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": needle}
        assert answer["text"].endswith(needle) is no_trim
        assert needle not in answer["text"][:-1]


async def test_unsupported_sampling_params_are_refused(http: httpx.AsyncClient) -> None:
    r = await http.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.3}})
    assert r.status_code == 400
    body = r.json()
    assert body["error_code"] == "invalid_config" and body["code"] == 400
    assert "repetition_penalty=1.3 is not supported" in body["message"]


async def test_errors_are_json_with_code_error_code_message(http: httpx.AsyncClient) -> None:
    r = await http.post("/generate", json={"input_ids": "not ids"})
    assert r.status_code == 400 and r.json()["error_code"] == "invalid_request"
    assert "input_ids" in r.json()["message"]
    r = await http.post("/generate", json={"input_ids": [], "sampling_params": {}})
    assert (r.status_code, r.json()["error_code"]) == (400, "invalid_config")
    assert "input_ids is empty" in r.json()["message"]
    r = await http.get("/no/such/route")
    assert (r.status_code, r.json()["error_code"]) == (404, "not_found")
    assert set(r.json()) == {"code", "error_code", "message"}


async def test_model_info_health_and_version(http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    info = (await http.get("/get_model_info")).json()
    assert info["is_generation"] is True and info["model_path"] == "tiny" and info["weight_version"] == "0"
    assert info["vocab_size"] == ByteTokenizer().vocab_size
    assert (await http.get("/get_weight_version")).json() == {"weight_version": "0"}


async def test_update_weights_from_disk_route(fresh_served: Any, other_checkpoint: Path) -> None:
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=30, headers=fresh_served.headers) as http:
        r = await http.post("/update_weights_from_disk", json={"model_path": str(other_checkpoint)})
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True and r.json()["weight_version"] == "1"
        body = {"model_path": str(other_checkpoint), "weight_version": "5"}
        r = await http.post("/update_weights_from_disk", json=body)
        assert r.json()["weight_version"] == "5"
        r = await http.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
        assert r.json()["meta_info"]["weight_version"] == "5"

        r = await http.post("/update_weights_from_disk", json={"model_path": "/no/such/dir"})
        assert r.status_code == 400
        assert r.json()["success"] is False and "does not exist" in r.json()["message"]
        assert (await http.get("/get_weight_version")).json() == {"weight_version": "5"}
