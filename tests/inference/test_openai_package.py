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
    with pytest.raises(openai.BadRequestError, match=r"reasoning_effort='high' is not supported"):
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], reasoning_effort="high"
        )
    with pytest.raises(openai.BadRequestError, match=r"stream_options \['continuous_usage_stats'\]"):
        await client.completions.create(
            model="tiny",
            prompt="x",
            stream=True,
            stream_options={"continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )


async def test_streamed_completion_equals_the_whole_answer(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "tiny", "prompt": ["Hi", "Yo"], "max_tokens": 12, "seed": 5, "n": 2}
    whole = await client.completions.create(**kwargs, logprobs=1)
    stream = await client.completions.create(**kwargs, logprobs=1, stream=True, stream_options={"include_usage": True})
    texts: dict[int, str] = {}
    logprobs: dict[int, list[float]] = {}
    finish: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            logprobs.setdefault(c.index, []).extend(c.logprobs.token_logprobs or [] if c.logprobs else [])
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert sorted(texts) == [0, 1, 2, 3]
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert [finish[i] for i in range(4)] == [c.finish_reason for c in whole.choices]
    for i, c in enumerate(whole.choices):
        assert c.logprobs is not None and logprobs[i] == pytest.approx(c.logprobs.token_logprobs, abs=1e-6)
    assert usage is not None and whole.usage is not None and usage.total_tokens == whole.usage.total_tokens


async def test_streamed_chat_holds_back_a_stop_string(client: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    free = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, seed=2)
    text = free.choices[0].message.content or ""
    assert len(text) > 4
    stop = text[3:5]  # a two-character stop string from the middle of the free answer
    whole = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, seed=2, stop=[stop])
    assert whole.choices[0].finish_reason == "stop" and stop not in (whole.choices[0].message.content or "")
    stream = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=30, seed=2, stop=[stop], stream=True, logprobs=True
    )
    roles, parts, tokens = [], [], 0
    async for chunk in stream:
        for c in chunk.choices:
            roles.append(c.delta.role)
            parts.append(c.delta.content or "")
            tokens += len(c.logprobs.content or []) if c.logprobs else 0
    assert roles[0] == "assistant" and "".join(parts) == whole.choices[0].message.content
    assert tokens == (whole.usage.completion_tokens if whole.usage else -1)


async def test_n_seed_and_logit_bias(client: openai.AsyncOpenAI) -> None:
    r = await client.completions.create(model="tiny", prompt="x", max_tokens=8, n=3, seed=1)
    again = await client.completions.create(model="tiny", prompt="x", max_tokens=8, n=3, seed=1)
    assert [c.text for c in r.choices] == [c.text for c in again.choices]
    assert len({c.text for c in r.choices}) > 1
    forced = ord("K")
    r = await client.completions.create(
        model="tiny", prompt="x", max_tokens=4, temperature=0, logit_bias={str(forced): 100}
    )
    assert r.choices[0].text == "KKKK"


async def test_chat_renders_tools_and_the_tool_calls_of_the_history(
    client: openai.AsyncOpenAI, tokenizer: ByteTokenizer
) -> None:
    """Tools reach the template and an assistant's tool calls in the history are rendered, never dropped."""
    tool = {
        "type": "function",
        "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    messages: Any = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    r: Any = await client.chat.completions.create(
        model="tiny", messages=messages, tools=[tool], max_tokens=4, seed=1, extra_body={"return_token_ids": True}
    )
    prompt = tokenizer.decode(r.prompt_token_ids)
    assert "bash(command?: string)" in prompt  # the tool, as the byte template offers it
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\na.txt<|im_end|>" in prompt
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        await client.chat.completions.create(model="tiny", messages=messages, tools=[tool], tool_choice="required")  # type: ignore[arg-type]
