"""Shared fixtures: the tiny model, a checkpoint of it on disk, and a real server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model, save_weights
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer

TOKEN = "inference-test-token-0123456789"
"""The token of the servers of :func:`fresh_served` (the shared one, :func:`served`, has none)."""


@dataclass
class Served:
    engine: Engine
    url: str
    app: Any = None
    token: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """What a client of this server sends: its token, when it has one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@pytest.fixture(scope="session")
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """One engine for the tests that do not change its weights."""
    eng = Engine.load("tiny", EngineConfig(seed=0))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def served() -> Iterator[Served]:
    """A real uvicorn server on 127.0.0.1 serving the tiny model (its weights are never updated), without a
    token: loopback callers only, the control routes refused."""
    eng = Engine.load("tiny")
    app = create_app(eng)
    with BackgroundServer(app) as server:
        yield Served(eng, server.url, app)
    eng.close()


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the shared server (no credentials)."""
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        yield client


@pytest.fixture
def fresh_served() -> Iterator[Served]:
    """A server of its own, for tests that swap its weights: started with :data:`TOKEN`, as a trainer's is."""
    eng = Engine.load("tiny")
    app = create_app(eng, token=TOKEN)
    with BackgroundServer(app) as server:
        yield Served(eng, server.url, app, TOKEN)
    eng.close()


@pytest.fixture(scope="session")
def other_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny architecture with other weights (seed 1), saved as the trainer would export it."""
    model, tokenizer = build_tiny_model(TinyModelConfig(seed=1))
    return save_weights(model, tmp_path_factory.mktemp("ckpt") / "step-1", tokenizer)


ForwardLogprobs = Callable[[Any, list[int], list[int]], list[float]]


@pytest.fixture(scope="session")
def forward_logprobs() -> ForwardLogprobs:
    """Log-probs of ``output`` after ``prompt`` from one full forward pass of ``model``: no cache, no batching."""

    def compute(model: Any, prompt: list[int], output: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return [float(logprobs[len(prompt) + i - 1, token]) for i, token in enumerate(output)]

    return compute
