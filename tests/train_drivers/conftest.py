"""Fixtures of the driver tests: real bwrap sandboxes, the tiny embedded engine, a policy-driven test agent.

:class:`ParityAgent` is the one fake, at the agent edge: it samples a few tokens from the real
policy and runs the task's reference solution when the first sampled token is even, so rewards
vary within a group (GRPO has a signal) and depend on the policy (it is learnable), while the
sandbox, verifier, engine, trainer and drivers are all real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout.agent import AgentResult, Budget
from sandrl.rollout.trajectory import Turn
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.task import Task
from sandrl.tasks.verify import run_solution
from sandrl.train.run_config import RunConfig, from_dict

from ..support import REASON


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(tmp_path_factory.mktemp("driver-state"))
    yield p
    p._close_all_sync()


class ParityAgent:
    """Samples ``tokens`` tokens; an even first token means "solve" (runs the reference solution)."""

    name = "parity"

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.tokenizer = ByteTokenizer()

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        assert policy is not None
        prompt = self.tokenizer.encode_messages([{"role": "user", "content": "pick"}], add_generation_prompt=True)
        started = time.monotonic()
        gen = await policy.generate(prompt, SamplingParams(max_new_tokens=self.tokens, ignore_eos=True))
        model_s = time.monotonic() - started
        command = None
        if gen.output_ids[0] % 2 == 0:
            await run_solution(task, sandbox)
            command = "solve"
        turn = Turn(
            index=0,
            command=command,
            output_start=len(prompt),
            output_end=len(prompt) + len(gen.output_ids),
            context_tokens=len(prompt),
            finish_reason=gen.finish_reason,
            weight_version=gen.weight_version,
            start_weight_version=gen.start_weight_version,
            model_s=model_s,
        )
        return AgentResult(
            "submitted",
            [turn],
            ids=[*prompt, *gen.output_ids],
            loss_mask=[0] * len(prompt) + [1] * len(gen.output_ids),
            logprobs=[0.0] * len(prompt) + list(gen.output_logprobs),
            prompt_len=len(prompt),
        )


def run_config(out: Path, **sections: dict[str, Any]) -> RunConfig:
    """A small run on generated echo tasks under ``out``; ``sections`` override tables key by key."""
    data: dict[str, dict[str, Any]] = {
        "run": {"output_dir": str(out), "steps": 3, "groups_per_step": 2},
        "tasks": {"family": "echo", "count": 8},
        "rollout": {"group_size": 4, "concurrency": 8, "max_turns": 1, "max_new_tokens": 8},
        "train": {"lr": 3e-2, "loss": {"loss_type": "dapo"}},
    }
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    return from_dict(data)
