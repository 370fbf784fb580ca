"""The policy of a :class:`~sandrl.wiring.config.ModelConfig`: the embedded engine or a client of a server.

Whichever it is, it carries the tokenizer of the model it serves
(:attr:`~sandrl.inference.base.InferenceClient.tokenizer`): the engine loads its own with the
weights; a client is given the one of ``[model] name``
(:func:`~sandrl.inference.tokenizer.model_tokenizer`, the one place a model name becomes a
tokenizer), so the agent renders prompts in the ids the server samples in.

Several engines (``[inference] launch``, or ``[model] inference = "URL,URL"``) are one server to the
client: the router of :mod:`sandrl.inference.fleet` in front of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sandrl.errors import ConfigError
from sandrl.http_auth import is_loopback
from sandrl.inference.base import InferenceClient
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.tokenizer import Tokenizer, model_tokenizer
from sandrl.inference.transport import HTTPConfig
from sandrl.wiring.config import ModelConfig

if TYPE_CHECKING:
    from sandrl.inference.fleet.serve import Fleet


@contextlib.asynccontextmanager
async def open_policy(
    model: ModelConfig, *, seed: int = 0, fleet: FleetConfig | None = None, run_dir: Path | None = None
) -> AsyncIterator[InferenceClient]:
    """The policy of ``model``, started (or checked to answer) on entry and closed on exit.

    ``seed`` seeds the embedded engine's samplers (a server seeds its own). ``fleet`` (``[inference]``)
    with ``launch`` starts the engines, logging to ``<run_dir>/engines/``."""
    launched = fleet is not None and fleet.launched
    if model.embedded and not launched:
        from sandrl.inference.engine import Engine, EngineConfig

        cache = fleet.prefix_cache_tokens if fleet is not None else FleetConfig.prefix_cache_tokens
        kv = fleet.kv_cache_tokens if fleet is not None else FleetConfig.kv_cache_tokens
        engine = Engine.load(
            model.name,
            EngineConfig(update_policy=model.update_policy, seed=seed, prefix_cache_tokens=cache, kv_cache_tokens=kv),
        )
        try:
            yield _admitted(engine, fleet, "the in-process engine")
        finally:
            await engine.aclose()
        return
    tokenizer = model_tokenizer(model.name)
    http = model.http()
    if not launched and len(model.urls) == 1:
        async with _client(model.api, model.inference, http, tokenizer, model) as client:
            client = _admitted(client, fleet, model.inference)
            yield broadcasting(client, fleet, model.api, http, model, urls=model.urls)
        return
    from sandrl.inference.fleet.serve import open_fleet

    if launched and not model.embedded:
        raise ConfigError(
            f"[inference] launch starts the engines, and [model] inference = {model.inference!r} names engines started "
            "elsewhere: give one of them (drop [inference] launch, or [model] inference)"
        )
    if run_dir is None and launched:
        raise ConfigError("engines launched from [inference] need a run directory for their logs")
    config = fleet if fleet is not None else FleetConfig()
    async with open_fleet(
        config,
        model=model.name,
        log_dir=(run_dir or Path(".")) / "engines",
        seed=seed,
        update_policy=model.update_policy,
        attach=() if launched else model.urls,
        token=None if launched else http.api_key,
    ) as served:
        api = config.client_api(model.api)
        routed = dataclasses.replace(http, api_key=served.token)
        # A launched SGLang returns temperature-1 log-probs (commands.py sets its switch).
        original = True if config.launch == "sglang" else None
        async with _client(api, served.url, routed, tokenizer, model, original_logprobs=original) as client:
            engines = dataclasses.replace(routed, retries=0)
            client = _admitted(client, fleet, f"the engines behind {served.url}")
            yield broadcasting(client, fleet, api, engines, model, engines=served, own=launched)


def _admitted(client: InferenceClient, fleet: FleetConfig | None, where: str) -> InferenceClient:
    """``client`` behind admission by its engines' KV capacity when ``[inference] kv_admission`` says so
    (:mod:`sandrl.inference.kv_admission`): inside any broadcasting wrapper, which the trainer looks for."""
    if fleet is None or not fleet.kv_admission:
        return client
    from sandrl.inference.kv_admission import admitted

    return admitted(client, fleet.admission_config(), where=where)


def broadcasting(
    client: InferenceClient,
    inference: FleetConfig | None,
    api: str,
    http: HTTPConfig,
    model: ModelConfig,
    *,
    urls: Sequence[str] = (),
    engines: Fleet | None = None,
    own: bool = False,
) -> InferenceClient:
    """``client`` with weight updates over a process group with its engines (those of ``engines``, a fleet, else
    ``urls``) when ``[inference] weight_sync`` allows it; ``client`` itself otherwise (see :class:`FleetConfig`).
    Behind a fleet the group follows its engines (:mod:`~sandrl.inference.broadcast_policy`). ``own``: sandrl
    started the engines (embedded ones then take each push whole, with no pause around it). The group's address
    and backend are chosen where the trainer's rank 0 runs (:class:`~sandrl.inference.weight_push.BroadcastSpec`)."""
    sync = inference.weight_sync if inference is not None else FleetConfig.weight_sync
    bucket_mb = inference.weight_bucket_mb if inference is not None else FleetConfig.weight_bucket_mb
    targets = engines.engine_urls if engines is not None else list(urls)
    if sync == "disk":
        return client
    speaks = api == "sglang"  # sandrl's servers and SGLang's; vLLM's group routes differ, OpenAI has none
    loopback = all(_is_loopback(url) for url in targets)
    if not speaks or (sync == "auto" and not loopback):
        if sync == "broadcast":
            raise ConfigError(
                "[inference] weight_sync = 'broadcast' needs engines with SGLang's group routes (sandrl's or "
                f"SGLang's) on this host; these are {api!r} at {', '.join(targets)}: set weight_sync = 'disk' "
                "(or 'auto')"
            )
        return client
    from sandrl.inference.broadcast_policy import BroadcastingPolicy
    from sandrl.inference.weight_push import BroadcastSpec

    spec = BroadcastSpec(
        tuple(targets),
        api_key=http.api_key,
        master_address="127.0.0.1" if loopback else "",
        backend="",
        bucket_bytes=bucket_mb * 2**20,
        update_policy=model.update_policy,
        sglang=not (own and model.embedded),
    )
    return BroadcastingPolicy(client, spec, engines)


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    return is_loopback(urlsplit(url).hostname or "")


@contextlib.asynccontextmanager
async def _client(
    api: str,
    url: str,
    http: HTTPConfig,
    tokenizer: Tokenizer | None,
    model: ModelConfig,
    *,
    original_logprobs: bool | None = None,
) -> AsyncIterator[InferenceClient]:
    """A client of the server at ``url`` with ``api``'s routes, checked to answer."""
    client: InferenceClient
    if api == "vllm":
        from sandrl.inference.vllm import VLLMClient

        async with VLLMClient(url, http=http, tokenizer=tokenizer, update_policy=model.update_policy) as client:
            await client.health()
            yield client
    elif api == "openai":
        from sandrl.inference.openai import OpenAIClient

        async with OpenAIClient(url, http=http, tokenizer=tokenizer) as client:
            await client.health()
            yield client
    else:
        from sandrl.inference.sglang import SGLangClient

        async with SGLangClient(
            url, http=http, tokenizer=tokenizer, update_policy=model.update_policy, original_logprobs=original_logprobs
        ) as client:
            await client.health()
            yield client
