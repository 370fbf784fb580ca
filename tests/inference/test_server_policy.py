"""The server's weight-update policy: ``sandrl serve inference --update-policy`` reaches the engine and
the app, and a plain SGLang update (no ``update_policy`` in the request) follows it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sandrl.cli import app as cli
from sandrl.inference import server
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tokenizer import ByteTokenizer

from .conftest import TOKEN


def test_serve_inference_takes_the_update_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run(app: Any, **kwargs: Any) -> None:  # uvicorn's edge: the app is built, nothing is bound
        seen["app"], seen["engine"] = app, app.state.engine

    monkeypatch.setattr(server.uvicorn, "run", run)
    result = CliRunner().invoke(cli, ["serve", "inference", "--update-policy", "abort_and_resume", "--port", "1"])
    assert result.exit_code == 0, result.output
    assert seen["app"].state.update_policy == "abort_and_resume"
    assert seen["engine"].config.update_policy == "abort_and_resume"
    bad = CliRunner().invoke(cli, ["serve", "inference", "--update-policy", "later"])
    assert bad.exit_code != 0 and "in_place, pause, abort_and_resume" in str(bad.exception or bad.output)


async def test_a_plain_update_follows_the_servers_policy(tokenizer: ByteTokenizer, other_checkpoint: Path) -> None:
    engine = Engine.load("tiny")
    prompts = [tokenizer.encode_messages([{"role": "user", "content": f"t{i}"}]) for i in range(4)]
    params = SamplingParams(max_new_tokens=200, ignore_eos=True, seed=3)
    try:
        with BackgroundServer(create_app(engine, update_policy="in_place", token=TOKEN)) as srv:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, headers=auth) as http:
                assert (await http.get("/get_server_info")).json()["update_policy"] == "in_place"
                steps = engine.stats.steps
                flights = [asyncio.ensure_future(engine.generate(p, params)) for p in prompts]
                while engine.running < len(prompts) or engine.stats.steps < steps + 5:
                    await asyncio.sleep(0.005)
                answer = await http.post("/update_weights_from_disk", json={"model_path": str(other_checkpoint)})
                assert answer.json()["success"]
            results = await asyncio.gather(*flights)
    finally:
        engine.close()
    # in_place, not SGLang's default pause: the generations in flight went on with the new weights.
    for g in results:
        assert g.output_weight_versions is not None and g.output_weight_versions[0] == 0
        assert g.output_weight_versions[-1] == 1
