"""The policy of a :class:`~sandrl.wiring.config.ModelConfig`: the embedded engine or a client of a server.

Whichever it is, it carries the tokenizer of the model it serves
(:attr:`~sandrl.inference.base.InferenceClient.tokenizer`): the engine loads its own with the
weights; a client is given the one of ``[model] name``
(:func:`~sandrl.inference.tokenizer.model_tokenizer`, the one place a model name becomes a
tokenizer), so the agent renders prompts in the ids the server samples in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sandrl.inference.base import InferenceClient
from sandrl.inference.tokenizer import model_tokenizer
from sandrl.wiring.config import ModelConfig


@contextlib.asynccontextmanager
async def open_policy(model: ModelConfig, *, seed: int = 0) -> AsyncIterator[InferenceClient]:
    """The policy of ``model``, started (or checked to answer) on entry and closed on exit.

    ``seed`` seeds the embedded engine's samplers (a server seeds its own)."""
    if model.embedded:
        from sandrl.inference.engine import Engine, EngineConfig

        engine = Engine.load(model.name, EngineConfig(update_policy=model.update_policy, seed=seed))
        try:
            yield engine
        finally:
            await engine.aclose()
        return
    tokenizer = model_tokenizer(model.name)
    http = model.http()
    client: InferenceClient
    if model.api == "vllm":
        from sandrl.inference.vllm import VLLMClient

        async with VLLMClient(
            model.inference, http=http, tokenizer=tokenizer, update_policy=model.update_policy
        ) as client:
            await client.health()
            yield client
    elif model.api == "openai":
        from sandrl.inference.openai import OpenAIClient

        async with OpenAIClient(model.inference, http=http, tokenizer=tokenizer) as client:
            await client.health()
            yield client
    else:
        from sandrl.inference.sglang import SGLangClient

        async with SGLangClient(
            model.inference, http=http, tokenizer=tokenizer, update_policy=model.update_policy
        ) as client:
            await client.health()
            yield client
