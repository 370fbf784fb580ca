"""Weights broadcast to a fleet of two launched embedded engines while one of them dies: the engine that comes
back without the weights last broadcast stays out of service (a broadcast cannot be replayed), the next push
forms the group again with it, and it serves the new weights from then on."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.broadcast_policy import BroadcastingPolicy, push_broadcast
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.serve import Fleet
from sandrl.inference.model import build_tiny_model
from sandrl.inference.weight_push import BlockingBroadcast, BroadcastSpec, broadcast_for, model_weights

from ...support import REASON
from .embedded import embedded_fleet

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.timeout(300),
]

GREEDY = SamplingParams(temperature=0, max_new_tokens=6)
PROMPT = list(range(40, 56))


class Pusher:
    """A one-process trainer's side of the push: its group kept while the spec stays, formed again when not."""

    def __init__(self) -> None:
        self.model, _ = build_tiny_model()
        self.sent: BlockingBroadcast | None = None
        self.groups = 0

    def step(self) -> None:
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.add_(1e-3)

    def push(self, version: int) -> Any:
        def send(spec: BroadcastSpec) -> str | None:
            sent = broadcast_for(self.sent, spec)  # as the trainer does
            if sent is not self.sent:
                self.sent, self.groups = sent, self.groups + 1
            return sent.push(model_weights(self.model), version)

        return send

    def close(self) -> None:
        if self.sent is not None:
            self.sent.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet-broadcast")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def policy(run_dir: Path) -> AsyncIterator[InferenceClient]:
    async with embedded_fleet(run_dir, weight_sync="broadcast") as served:
        yield served


@pytest.fixture
def pusher() -> Iterator[Pusher]:
    p = Pusher()
    yield p
    p.close()


def engine_pid(run_dir: Path, index: int) -> int:
    log = (run_dir / "out" / "engines" / f"engine-{index}.log").read_text()
    return int(re.findall(r"Started server process \[(\d+)\]", log)[-1])


async def fleet_state(policy: InferenceClient) -> list[dict[str, Any]]:
    answer: dict[str, Any] = await policy._http.get("/sandrl/fleet")  # type: ignore[attr-defined]
    return list(answer["engines"])


async def on_engine(fleet: Fleet, index: int, policy: InferenceClient) -> Any:
    key = f"test/engine/{index}"
    fleet.router.pin(key, fleet.router.engines[index])
    with affinity.bound(key):
        return await policy.generate(PROMPT, GREEDY)


async def test_an_engine_back_after_a_broadcast_waits_for_the_next_push_then_serves_it(
    policy: InferenceClient, pusher: Pusher, run_dir: Path
) -> None:
    assert isinstance(policy, BroadcastingPolicy) and isinstance(policy.targets, Fleet)
    fleet = policy.targets
    pusher.step()
    assert await push_broadcast(policy, pusher.push(1), 1) is None
    answers = [await on_engine(fleet, i, policy) for i in range(2)]
    assert [a.weight_version for a in answers] == [1, 1]
    assert answers[0].output_ids == answers[1].output_ids

    os.kill(engine_pid(run_dir, 0), signal.SIGKILL)
    async with asyncio.timeout(120):  # restarted with the weights it was launched with: held out, not served
        while not (await fleet_state(policy))[0]["awaiting_weights"]:
            await asyncio.sleep(0.2)
    state = await fleet_state(policy)
    assert (state[0]["up"], state[1]["up"]) == (False, True)
    moved = await on_engine(fleet, 0, policy)  # its key's engine is out: the call goes to the other
    assert moved.weight_version == 1

    pusher.step()
    assert await push_broadcast(policy, pusher.push(2), 2) is None  # a new group, with the engine that came back
    assert pusher.groups == 2
    async with asyncio.timeout(30):
        while not all(e["up"] for e in await fleet_state(policy)):
            await asyncio.sleep(0.2)
    answers = [await on_engine(fleet, i, policy) for i in range(2)]
    assert [a.weight_version for a in answers] == [2, 2]
    assert answers[0].output_ids == answers[1].output_ids  # the same weights on both
