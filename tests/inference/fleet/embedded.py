"""A run's policy served by two launched embedded engines (the tiny model), as the fleet tests that need
real engines start it: from a run config, through :func:`sandrl.wiring.open_policy`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sandrl.inference.base import InferenceClient
from sandrl.train.run_config import load_run_config
from sandrl.wiring import open_policy

CONFIG = """
[run]
output_dir = "{out}"

[inference]
launch = "embedded"
engines = 2
startup_timeout_s = 180
{more}
[tasks]
family = "echo"
"""


@asynccontextmanager
async def embedded_fleet(run_dir: Path, **inference: str | int) -> AsyncIterator[InferenceClient]:
    """The policy of a run config written to ``run_dir`` (its output under ``run_dir/out``, the engines'
    logs in ``out/engines``); ``inference`` adds keys to its ``[inference]`` table."""
    more = "".join(f"{key} = {json.dumps(value)}\n" for key, value in inference.items())  # TOML's form too
    toml = run_dir / "run.toml"
    toml.write_text(CONFIG.format(out=run_dir / "out", more=more))
    config = load_run_config(toml)
    async with open_policy(config.model, fleet=config.inference, run_dir=config.output_dir) as served:
        yield served
