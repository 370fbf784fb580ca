"""The runner's session gateway in a process of its own, for the tests that measure its memory.

``python -m tests.inference.gateway_process``: serves :func:`create_gateway_app` on a free
loopback port in front of a scripted policy, opens one session in-process (as the runner does),
prints ``{"url", "base_url", "api_key"}`` as one JSON line, then serves until killed. Only the
policy is a fake (the edge); the gateway, uvicorn and the sockets are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass

from sandrl.background_server import serve_on_loop
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.tokenizer import ByteTokenizer


@dataclass
class Replies:
    """Answers every call with one short reply."""

    tokenizer: ByteTokenizer
    max_context: int = 4096

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        ids = [*self.tokenizer.encode("ok"), self.tokenizer.im_end_id]
        return Generation(ids, [-0.5] * len(ids), "stop", 0, len(input_ids))

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        raise NotImplementedError

    async def health(self) -> None:
        return None


async def main() -> None:
    gateway = Gateway(Replies(ByteTokenizer()), model_name="scripted")  # type: ignore[arg-type]
    async with serve_on_loop(create_gateway_app(gateway), name="session gateway") as url:
        session = gateway.open()
        base_url = f"{url}/v1/sessions/{session.id}"
        print(json.dumps({"url": url, "base_url": base_url, "api_key": getattr(session, "key", "")}), flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
