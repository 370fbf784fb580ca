"""The official ``openai`` package against the server: completions and chat completions with logprobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from sandrl.inference.tokenizer import ByteTokenizer


@pytest.fixture
async def client(served: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


async def test_models_lists_the_served_model(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_completion_with_logprobs(client: openai.AsyncOpenAI, tokenizer: ByteTokenizer) -> None:
    r = await client.completions.create(model="tiny", prompt="Hello", max_tokens=8, logprobs=3, seed=4)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    n = len(choice.logprobs.token_logprobs)
    assert 1 <= n <= 8 and r.usage is not None and r.usage.completion_tokens == n
    assert r.usage.prompt_tokens == len(tokenizer.encode("Hello"))
    assert choice.logprobs.top_logprobs is not None and all(1 <= len(t) <= 3 for t in choice.logprobs.top_logprobs)
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)


async def test_completion_with_token_ids_prompt_and_extensions(
    client: openai.AsyncOpenAI, served: Any, tokenizer: ByteTokenizer
) -> None:
    from sandrl.inference.base import SamplingParams

    prompt = tokenizer.encode("Hello")
    r = await client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=6,
        logprobs=0,
        seed=8,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    direct = await served.engine.generate(prompt, SamplingParams(max_new_tokens=6, seed=8, ignore_eos=True))
    choice: Any = r.choices[0]
    assert choice.token_ids == direct.output_ids
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in direct.output_ids]
    assert choice.logprobs.token_logprobs == pytest.approx(direct.output_logprobs, abs=1e-6)


async def test_chat_completion_with_logprobs(client: openai.AsyncOpenAI, tokenizer: ByteTokenizer) -> None:
    r = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=10,
        logprobs=True,
        top_logprobs=2,
        seed=3,
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert 1 <= len(content) <= 10
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    # The visible text is the output with special tokens (the closing <|im_end|>) left out.
    ids = [c.bytes[0] for c in content if c.bytes is not None and len(c.bytes) == 1]
    assert choice.message.content == tokenizer.decode(ids)


async def test_errors_reach_the_openai_package_typed(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="serves the model 'tiny'"):
        await client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match=r"presence_penalty=0\.5 is not supported"):
        await client.completions.create(model="tiny", prompt="x", presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match=r"stream=True is not supported"):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True)
