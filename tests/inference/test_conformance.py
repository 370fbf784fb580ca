"""Conformance: sandrl's server driven the way RL frameworks drive SGLang.

``RolloutClient`` is written from SGLang's documented HTTP API (``/generate``'s
``GenerateReqInput`` and the weight-sync routes), the way slime and Miles use it: token ids
in, ``meta_info.output_token_logprobs`` out; weights synced by pausing generation, loading a
checkpoint, naming its version and continuing; the tail of an over-sampled rollout aborted
and its partial samples continued from their tokens; memory released and resumed around
training when colocated. The ``openai`` package's side is in test_openai_package.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest


@dataclass
class Sample:
    """One rollout sample as an RL framework keeps it."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    status: str
    """completed, truncated or aborted (from ``finish_reason.type``)."""
    weight_version: str


class RolloutClient:
    """What an RL framework does with an SGLang server, and nothing sandrl-specific."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def wait_ready(self) -> dict[str, Any]:
        for _ in range(100):
            if (await self.http.get("/health_generate")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        info = (await self.http.get("/get_model_info")).json()
        assert info["is_generation"] is True
        return dict((await self.http.get("/get_server_info")).json())

    async def generate(
        self, prompt: list[int], max_new_tokens: int, rid: str | None = None, *, to_budget: bool = False
    ) -> Sample:
        """Sample ``prompt``; ``to_budget`` runs to ``max_new_tokens`` (no stop tokens), as benchmarks do."""
        payload: dict[str, Any] = {
            "input_ids": prompt,
            "sampling_params": {
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "max_new_tokens": max_new_tokens,
                "stop_token_ids": [2],
                "skip_special_tokens": False,
                "no_stop_trim": True,
                "spaces_between_special_tokens": False,
            },
            "return_logprob": True,
        }
        if rid is not None:
            payload["rid"] = rid
        if to_budget:
            payload["sampling_params"].update(ignore_eos=True, stop_token_ids=[])
        r = await self.http.post("/generate", json=payload)
        r.raise_for_status()
        out = r.json()
        meta = out["meta_info"]
        entries = meta["output_token_logprobs"]
        tokens = [int(e[1]) for e in entries]
        assert tokens == out["output_ids"]
        kind = meta["finish_reason"]["type"]
        status = {"stop": "completed", "length": "truncated", "abort": "aborted"}[kind]
        return Sample(prompt, tokens, [float(e[0]) for e in entries], status, meta["weight_version"])

    async def continue_partial(self, sample: Sample, max_new_tokens: int) -> Sample:
        """slime's partial rollout: an aborted sample goes on from its prompt and the tokens it has."""
        more = await self.generate(sample.prompt + sample.tokens, max_new_tokens - len(sample.tokens))
        return Sample(
            sample.prompt,
            sample.tokens + more.tokens,
            sample.logprobs + more.logprobs,
            more.status,
            more.weight_version,
        )

    async def until_running(self, count: int) -> None:
        for _ in range(1000):
            if (await self.http.get("/get_server_info")).json()["internal_states"][0]["#running_req"] >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} requests never ran at once")

    async def abort_all(self) -> None:
        (await self.http.post("/abort_request", json={"abort_all": True})).raise_for_status()

    async def sync_weights(self, path: str, version: int) -> None:
        for route, body in [
            ("/pause_generation", {"mode": "retract"}),
            ("/flush_cache", None),
            ("/update_weights_from_disk", {"model_path": path, "weight_version": str(version), "flush_cache": True}),
            ("/update_weight_version", {"new_version": str(version), "abort_all_requests": False}),
            ("/continue_generation", {}),
        ]:
            r = await self.http.post(route, json=body) if body is not None else await self.http.post(route)
            assert r.status_code == 200, (route, r.text)
            if route == "/update_weights_from_disk":
                assert r.json()["success"] is True

    async def stream(self, prompt: list[int], max_new_tokens: int) -> list[dict[str, Any]]:
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_new_tokens}, "stream": True}
        chunks = []
        async with self.http.stream("POST", "/generate", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
        return chunks


@pytest.fixture
async def client(fresh_served: Any) -> AsyncIterator[RolloutClient]:
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=120, headers=fresh_served.headers) as http:
        yield RolloutClient(http)


async def test_a_training_loop_as_slime_drives_sglang(client: RolloutClient, other_checkpoint: Path) -> None:
    info = await client.wait_ready()
    assert info["weight_version"] == "0"
    prompts = [[1, 72 + i, 105, 3] for i in range(8)]
    # Step 0: a group of samples; every sample is token-exact (ids = the logprob entries' ids).
    group = await asyncio.gather(*(client.generate(p, 24) for p in prompts))
    assert all(s.status in ("completed", "truncated") and s.weight_version == "0" for s in group)
    assert all(len(s.tokens) == len(s.logprobs) > 0 and all(lp <= 0 for lp in s.logprobs) for s in group)

    # Over-sampling: the tail still running when enough samples are in is aborted, and kept as partials.
    tail = [
        asyncio.ensure_future(client.generate(p, 400, rid=f"tail-{i}", to_budget=True))
        for i, p in enumerate(prompts[:4])
    ]
    await client.until_running(4)
    await client.abort_all()
    partials = await asyncio.gather(*tail)
    assert all(s.status == "aborted" and len(s.tokens) < 400 for s in partials)

    # Colocated training frees the server's memory, then the new weights are synced.
    assert (await client.http.post("/release_memory_occupation", json={"tags": ["kv_cache", "weights"]})).is_success
    assert (await client.http.post("/resume_memory_occupation", json={"tags": ["weights"]})).is_success
    await client.sync_weights(str(other_checkpoint), version=1)
    assert (await client.http.get("/get_weight_version")).json() == {"weight_version": "1"}

    # Step 1: the partials are continued from their tokens on the new weights; new samples are version 1.
    resumed = await asyncio.gather(*(client.continue_partial(s, len(s.tokens) + 16) for s in partials))
    for before, after in zip(partials, resumed, strict=True):
        assert after.tokens[: len(before.tokens)] == before.tokens and len(after.tokens) <= len(before.tokens) + 16
        assert len(after.tokens) > len(before.tokens) and len(after.tokens) == len(after.logprobs)
        assert after.weight_version == "1"
    fresh = await client.generate(prompts[0], 8)
    assert fresh.weight_version == "1"


async def test_weight_sync_while_a_rollout_runs_keeps_it(client: RolloutClient, other_checkpoint: Path) -> None:
    """pause_generation(retract) + update + continue: the requests in flight finish, none is lost."""
    await client.wait_ready()
    flights = [asyncio.ensure_future(client.generate([1, 65 + i], 200, to_budget=True)) for i in range(4)]
    await client.until_running(4)
    await client.sync_weights(str(other_checkpoint), version=7)
    samples = await asyncio.gather(*flights)
    assert all(s.status == "truncated" and len(s.tokens) == 200 and s.weight_version == "7" for s in samples)


async def test_streaming_as_sglangs_documentation_reads_it(client: RolloutClient) -> None:
    await client.wait_ready()
    chunks = await client.stream([1, 2, 3], 6)
    assert chunks and chunks[-1]["meta_info"]["finish_reason"] is not None
    text = chunks[-1]["text"]
    assert all(text.startswith(c["text"].rstrip("\ufffd")) for c in chunks)  # cumulative text, as SGLang streams
