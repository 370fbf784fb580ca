"""The policy on several inference servers: one InferenceClient over N URLs with SGLang's routes.

Each generate goes to the server with the fewest requests of this client in flight (the first on
a tie, then round the list); :meth:`EndpointsClient.update_weights` loads the new weights on every
server, tagged with the trainer's version, so every sample says which weights produced it
whichever server answered. The servers are ``sandrl serve inference`` or SGLang itself.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from types import TracebackType

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.transport import HTTPConfig


class EndpointsClient:
    """An :class:`~sandrl.inference.base.InferenceClient` over several servers; see the module docstring."""

    def __init__(
        self, urls: Sequence[str], *, http: HTTPConfig | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        if not urls:
            raise ConfigError("give at least one inference server URL")
        self.urls = list(urls)
        self.tokenizer = tokenizer
        """The served checkpoint's tokenizer, when the caller has it (the servers work in ids only)."""
        self.max_context: int | None = None
        self.clients = [SGLangClient(url, http=http) for url in urls]
        self._in_flight = [0] * len(urls)
        self._turn = itertools.count()

    def _pick(self) -> int:
        start = next(self._turn) % len(self.clients)
        order = [(start + i) % len(self.clients) for i in range(len(self.clients))]
        return min(order, key=lambda i: self._in_flight[i])

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        i = self._pick()
        self._in_flight[i] += 1
        try:
            return await self.clients[i].generate(input_ids, params)
        finally:
            self._in_flight[i] -= 1

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load ``path`` on every server (as ``version`` when given); the version they now serve."""
        versions = await asyncio.gather(*(c.update_weights(path, version=version) for c in self.clients))
        if len(set(versions)) > 1:
            raise InferenceError(
                f"the inference servers disagree on the weight version after loading {path}: "
                + ", ".join(f"{u} v{v}" for u, v in zip(self.urls, versions, strict=True))
            )
        return versions[0]

    async def health(self) -> None:
        await asyncio.gather(*(c.health() for c in self.clients))

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))

    async def __aenter__(self) -> EndpointsClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
