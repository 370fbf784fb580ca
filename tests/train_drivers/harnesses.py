"""A harness for the driver tests (``tests.train_drivers.harnesses:parity_harness``): through a real
gateway session it asks the policy twice, the second time with a rewritten history (a new segment),
and solves the task when the first reply's first token is even, so rewards vary and depend on the policy."""

from __future__ import annotations

from typing import Any

import openai

from sandrl.rollout.agents.harness import HarnessContext
from sandrl.tasks.verify import run_solution


async def parity_harness(ctx: HarnessContext) -> str:
    async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as client:
        body: dict[str, Any] = {"max_tokens": 3, "extra_body": {"return_token_ids": True}}
        first: Any = await client.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": "pick"}], **body
        )
        if first.choices[0].token_ids[0] % 2 == 0:
            await run_solution(ctx.task, ctx.sandbox)
        rewritten = [
            {"role": "user", "content": "pick (again)"},
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "and?"},
        ]
        await client.chat.completions.create(model=ctx.model, messages=rewritten, **body)  # type: ignore[arg-type]
    return "submitted"
