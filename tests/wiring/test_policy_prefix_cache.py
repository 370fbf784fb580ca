"""``[inference] prefix_cache_tokens`` sizes the in-process engine's prefix cache (0: off)."""

from __future__ import annotations

import pytest

from sandrl.inference.engine import Engine
from sandrl.inference.fleet.config import FleetConfig
from sandrl.wiring.config import ModelConfig
from sandrl.wiring.policy import open_policy


@pytest.mark.parametrize(("fleet", "budget"), [(None, 32768), (FleetConfig(prefix_cache_tokens=0), 0)])
async def test_the_in_process_engine_takes_its_prefix_cache_budget_from_inference(
    fleet: FleetConfig | None, budget: int
) -> None:
    async with open_policy(ModelConfig(), fleet=fleet) as engine:
        assert isinstance(engine, Engine)
        assert engine.config.prefix_cache_tokens == budget
