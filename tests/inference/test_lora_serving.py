"""Serving LoRA adapters: the embedded engine behind SGLang's routes (``/load_lora_adapter``, ``lora_path``) and
vLLM's (a request's ``model``), the SGLang and vLLM clients through them, adapter files read as hostile input,
and an adapter of another base refused. The adapter is a tiny Qwen3's, trained a few steps with peft."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from sandrl.errors import ConfigError
from sandrl.inference.base import LoraClient, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.lora_adapter import BASE_FILE, read_adapter
from sandrl.inference.lora_rows import AdapterRows
from sandrl.inference.model import build_tiny_model
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.transport import HTTPConfig
from sandrl.inference.vllm import VLLMClient
from tests.inference.conftest import TOKEN, Served
from tests.inference.lora_support import Trained, policy_logprobs, train_and_export
from tests.inference.vllm_dev_server import create_vllm_app

PARAMS = SamplingParams(max_new_tokens=12, seed=9, ignore_eos=True)
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train_and_export(tmp_path_factory.mktemp("lora"))


@pytest.fixture
def qwen3_server(trained: Trained) -> Iterator[Served]:
    """The base the adapter was trained on, served with a token (as a trainer's server is)."""
    engine = Engine(copy.deepcopy(trained.base), trained.tokenizer)
    with BackgroundServer(create_app(engine, token=TOKEN)) as server:
        yield Served(engine, server.url, None, TOKEN)
    engine.close()


async def test_the_sglang_client_loads_an_adapter_through_the_route_and_samples_with_it(
    trained: Trained, qwen3_server: Served
) -> None:
    prompt = trained.tokenizer.encode("through the route")
    async with SGLangClient(qwen3_server.url, http=HTTPConfig(api_key=TOKEN)) as client:
        assert isinstance(client, LoraClient)
        assert await client.update_lora_adapter(str(trained.adapter), version=3) == 3
        assert client.lora_adapter == "sandrl-v3"
        g = await client.generate(prompt, PARAMS)
        async with SGLangClient(qwen3_server.url, http=HTTPConfig(api_key=TOKEN)) as plain:
            base = await plain.generate(prompt, PARAMS)
        # update_weights takes an adapter directory as update_lora_adapter does (the trainer's adapter export).
        assert await client.update_weights(str(trained.adapter), version=4) == 4
        await client.update_lora_adapter(str(trained.adapter), version=5)
        again = await client.generate(prompt, PARAMS)
    assert g.output_logprobs == pytest.approx(policy_logprobs(trained.policy, prompt, g.output_ids), abs=1e-5)
    assert base.output_logprobs == pytest.approx(policy_logprobs(trained.base, prompt, base.output_ids), abs=1e-5)
    assert g.output_ids != base.output_ids
    # Every token is the adapter's version; the one before the newest stays loaded for requests still on it.
    assert g.output_weight_versions == [3] * 12 and (g.start_weight_version, g.weight_version) == (3, 3)
    assert again.output_ids == g.output_ids and again.output_weight_versions == [5] * 12
    assert set(qwen3_server.engine.lora_adapters) == {"sandrl-v4", "sandrl-v5"}
    # SGLang's own shapes: lora_path per prompt of a batch, and the route's answer.
    async with httpx.AsyncClient(base_url=qwen3_server.url, headers=qwen3_server.headers, timeout=60) as http:
        sp = {"max_new_tokens": 12, "ignore_eos": True, "sampling_seed": 9}
        body = {"input_ids": [prompt, prompt], "sampling_params": sp, "return_logprob": True}
        answers = (await http.post("/generate", json={**body, "lora_path": ["sandrl-v5", None]})).json()
        assert [a["output_ids"] for a in answers] == [g.output_ids, base.output_ids]
        streamed = await http.post(
            "/generate", json={**body, "input_ids": prompt, "lora_path": "sandrl-v5", "stream": True}
        )
        last = json.loads(streamed.text.split("\n\n")[-3].removeprefix("data: "))
        assert last["output_ids"] == g.output_ids
        # OpenAI's routes take the adapter's name as the model, streamed or not (vLLM's way).
        completion = {"model": "sandrl-v5", "prompt": prompt, "max_tokens": 12, "seed": 9, "ignore_eos": True}
        answer = (await http.post("/v1/completions", json={**completion, "return_token_ids": True})).json()
        assert answer["choices"][0]["token_ids"] == g.output_ids
        chunks = (await http.post("/v1/completions", json={**completion, "stream": True})).text
        assert (
            "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks.split("\n\n")[:-2])
            == answer["choices"][0]["text"]
        )
        r = await http.post("/unload_lora_adapter", json={"lora_name": "sandrl-v4"})
        assert r.status_code == 200 and r.json()["success"] is True
        assert list(r.json()["loaded_adapters"]) == ["sandrl-v5"]
        info = (await http.get("/get_server_info")).json()
        assert (info["loaded_lora_adapters"], info["max_loaded_loras"], info["max_lora_rank"]) == (
            ["sandrl-v5"],
            8,
            256,
        )
        r = await http.post("/unload_lora_adapter", json={"lora_name": "sandrl-v4"})
        assert r.status_code == 400 and r.json()["success"] is False and "no LoRA adapter" in r.json()["error_message"]


async def test_the_vllm_client_loads_an_adapter_and_names_it_as_the_model(trained: Trained) -> None:
    prompt = trained.tokenizer.encode("vllm names the adapter")
    engine = Engine(copy.deepcopy(trained.base), trained.tokenizer)
    app = create_vllm_app(engine, lora_updating=True)
    try:
        with BackgroundServer(app) as server:
            async with VLLMClient("vllm://" + server.url.removeprefix("http://"), "tiny") as client:
                assert isinstance(client, LoraClient)
                assert await client.update_weights(str(trained.adapter)) == 1
                g = await client.generate(prompt, PARAMS)
                with pytest.raises(ConfigError, match="'sandrl-v1' has already been loaded"):
                    await client.load_lora_adapter("sandrl-v1", str(trained.adapter))
                async with httpx.AsyncClient(base_url=server.url) as http:
                    models = (await http.get("/v1/models")).json()["data"]
    finally:
        engine.close()
    assert g.output_logprobs == pytest.approx(policy_logprobs(trained.policy, prompt, g.output_ids), abs=1e-5)
    assert g.output_weight_versions == [1] * 12
    assert app.state.log == ["load:sandrl-v1"]  # the leftover check found no sandrl-v1 to unload
    assert [m["id"] for m in models] == ["tiny", "sandrl-v1"] and models[1]["parent"] == "tiny"


async def test_a_vllm_without_runtime_lora_updating_says_how_to_start_it(trained: Trained) -> None:
    engine = Engine(copy.deepcopy(trained.base), trained.tokenizer)
    try:
        with BackgroundServer(create_vllm_app(engine)) as server:
            async with VLLMClient(server.url, "tiny") as client:
                with pytest.raises(ConfigError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as caught:
                    await client.update_lora_adapter(str(trained.adapter))
    finally:
        engine.close()
    assert "--enable-lora" in str(caught.value) and "\n" not in str(caught.value)


async def test_an_adapter_of_another_base_is_refused_in_one_line(trained: Trained, fresh_served: Served) -> None:
    # The served model is the tiny Llama: its linear layers even have the adapter's shapes, but the base marker
    # says the adapter is a Qwen3's.
    async with httpx.AsyncClient(base_url=fresh_served.url, headers=fresh_served.headers, timeout=60) as http:
        r = await http.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": str(trained.adapter)})
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and body["error_message"] == body["message"]
    message = body["message"]
    assert "\n" not in message and "another base model" in message and "'qwen3'" in message and "'llama'" in message
    assert "serve the model the adapter was trained on" in message and 'export = "merged"' in message
    assert fresh_served.engine.lora_adapters == {}
    # A Qwen3 of the same shape with other weights (another seed): refused by the fingerprint.
    other, tokenizer = build_tiny_model(TinyModelConfig(architecture="qwen3", seed=1))
    engine = Engine(other, tokenizer)
    try:
        with pytest.raises(ConfigError, match="same shape but other weights") as caught:
            await engine.load_lora_adapter("a", str(trained.adapter))
        assert "\n" not in str(caught.value)
        with pytest.raises(ConfigError, match="other weights"):
            await engine.update_weights(str(trained.adapter))
    finally:
        engine.close()


async def test_loading_an_adapter_needs_the_servers_token(served: Served, trained: Trained) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as http:
        for route in ("/load_lora_adapter", "/unload_lora_adapter"):
            r = await http.post(route, json={"lora_name": "a", "lora_path": str(trained.adapter)})
            assert r.status_code == 403 and r.json()["error_code"] == "token_required", route


def _mutate_config(**changes: Any) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        path = directory / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return change


def _mutate_tensors(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        tensors = load_file(str(directory / WEIGHTS))
        change(tensors)
        save_file(tensors, str(directory / WEIGHTS))

    return apply


def _as_pickle(directory: Path) -> None:
    (directory / WEIGHTS).rename(directory / "adapter_model.bin")


def _oversized(directory: Path) -> None:
    with (directory / WEIGHTS).open("r+b") as f:
        f.truncate(4 << 20)  # sparse: a size no rank-8 adapter of the tiny model reaches


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"
BAD_FILES: list[tuple[str, Callable[[Path], None], str]] = [
    ("pickle", _as_pickle, "adapter_model.bin is a pickle"),
    ("oversized", _oversized, "more than any rank-8 adapter"),
    ("garbage", lambda d: (d / WEIGHTS).write_bytes(b"\xff" * 64), "not a readable safetensors file"),
    ("no config", lambda d: (d / "adapter_config.json").unlink(), "has no adapter_config.json"),
    ("config not JSON", lambda d: (d / "adapter_config.json").write_text("{"), "is not JSON"),
    ("DoRA", _mutate_config(use_dora=True), "DoRA"),
    ("bias", _mutate_config(bias="all"), "bias='none'"),
    ("rank over the bound", _mutate_config(r=300), "max_lora_rank"),
    ("alpha", _mutate_config(lora_alpha=float("nan")), "lora_alpha"),
    ("other shape", _mutate_tensors(lambda t: t.update({f"{Q0}.lora_A.weight": torch.zeros(4, 63)})), "[4, 64]"),
    ("not LoRA", _mutate_tensors(lambda t: t.update({f"{Q0}.lora_magnitude_vector": torch.zeros(64)})), "A/B"),
    (
        "no such layer",
        _mutate_tensors(lambda t: t.update({f"{Q0[:-6]}x_proj.lora_A.weight": torch.zeros(4, 64)})),
        "no linear layer",
    ),
    ("half a pair", _mutate_tensors(lambda t: t.pop(f"{Q0}.lora_B.weight")), "only one of lora_A/lora_B"),
    (
        "integers",
        _mutate_tensors(lambda t: t.update({f"{Q0}.lora_A.weight": torch.zeros(4, 64, dtype=torch.int32)})),
        "float",
    ),
]


@pytest.mark.parametrize(("change", "refusal"), [pytest.param(c, r, id=i) for i, c, r in BAD_FILES])
def test_adapter_files_are_read_as_hostile_input(
    trained: Trained, tmp_path: Path, change: Callable[[Path], None], refusal: str
) -> None:
    directory = tmp_path / "adapter"
    shutil.copytree(trained.adapter, directory)
    read_adapter(directory, trained.base, name="ok", max_rank=8)  # the copy as exported loads
    change(directory)
    with pytest.raises(ConfigError) as caught:
        read_adapter(directory, trained.base, name="bad", max_rank=8)
    assert refusal in str(caught.value) and "\n" not in str(caught.value)


async def test_names_and_the_cap_on_loaded_adapters(trained: Trained, tmp_path: Path) -> None:
    engine = Engine(copy.deepcopy(trained.base), trained.tokenizer, config=EngineConfig(max_loras=1))
    path = str(trained.adapter)
    try:
        with pytest.raises(ConfigError, match="no such directory"):
            await engine.load_lora_adapter("a", str(tmp_path / "nowhere"))
        with pytest.raises(ConfigError, match="printable"):
            await engine.load_lora_adapter("a\nb", path)
        await engine.load_lora_adapter("a", path)
        with pytest.raises(ConfigError, match="already loaded"):
            await engine.load_lora_adapter("a", path)
        with pytest.raises(ConfigError, match=r"max_loras = 1"):
            await engine.load_lora_adapter("b", path)
        # An unloaded adapter still used by a running request counts until the request ends.
        long = SamplingParams(max_new_tokens=400, ignore_eos=True)
        running = asyncio.ensure_future(engine.generate([1, 2, 3], long, lora="a", rid="long"))
        while not engine.running:
            await asyncio.sleep(0.005)
        await engine.unload_lora_adapter("a")
        with pytest.raises(ConfigError, match=r"max_loras = 1"):
            await engine.load_lora_adapter("b", path)
        with pytest.raises(ConfigError, match="no LoRA adapter named 'a'"):
            await engine.generate([1, 2, 3], PARAMS, lora="a")
        engine.abort("long")
        assert len((await running).output_ids) < 400
        await engine.load_lora_adapter("b", path)
        with pytest.raises(ConfigError, match="no LoRA adapter named 'a' is loaded"):
            await engine.unload_lora_adapter("a")
    finally:
        engine.close()


def test_rows_without_an_adapter_are_untouched_bit_for_bit(trained: Trained) -> None:
    model = copy.deepcopy(trained.base)
    adapter = read_adapter(trained.adapter, model, name="a", max_rank=8)
    rows = AdapterRows(model)
    ids = torch.tensor([trained.tokenizer.encode("three rows, one per x")] * 3)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with rows.applied([adapter, None, adapter]):
            mixed = model(input_ids=ids).logits
        with rows.applied([adapter, adapter, adapter]):
            adapted = model(input_ids=ids).logits
            # A forward another thread runs meanwhile on the same model (a reference log-prob) sees no adapter.
            with ThreadPoolExecutor(1) as pool:
                elsewhere = pool.submit(lambda: model(input_ids=ids).logits).result()
        after = model(input_ids=ids).logits
        reference = trained.policy(input_ids=ids[:1]).logits[0]
    assert torch.equal(mixed[1], plain[1]) and torch.equal(elsewhere, plain)
    assert torch.allclose(mixed[0], reference, atol=1e-5) and torch.allclose(adapted[2], reference, atol=1e-5)
    assert torch.equal(after, plain), "outside the block the hooks add nothing"


def test_the_base_marker_is_checked_before_any_tensor_is_read(trained: Trained, tmp_path: Path) -> None:
    directory = tmp_path / "adapter"
    shutil.copytree(trained.adapter, directory)
    (directory / WEIGHTS).write_bytes(b"never read")
    marker = json.loads((directory / BASE_FILE).read_text())
    (directory / BASE_FILE).write_text(json.dumps({**marker, "shapes_sha256": "0" * 64}))
    with pytest.raises(ConfigError, match="another base model"):
        read_adapter(directory, trained.base, name="a", max_rank=8)
