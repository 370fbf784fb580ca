"""Agents of the cluster tests, importable by the Ray workers (``tests.cluster.agents``, no torch).

:class:`ParityAgent` is the fake at the agent edge the driver tests use too: it samples a few
tokens from the real policy and runs the task's reference solution when the first one is even,
so rewards vary within a group and rise as the policy learns. ``work_s`` makes every episode run
a command of that length in its sandbox first, so a test can kill a host while episodes are on it.
"""

from __future__ import annotations

import time

from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout.agent import AgentResult, Budget
from sandrl.rollout.trajectory import Turn
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.task import Task
from sandrl.tasks.verify import run_solution


class ParityAgent:
    """Samples ``tokens`` tokens; an even first token means "solve" (runs the reference solution)."""

    name = "parity"

    def __init__(self, tokens: int = 3, work_s: float = 0.0, calls: int = 1) -> None:
        self.tokens = tokens
        self.work_s = work_s
        self.calls = calls
        """Model calls per episode: the last one decides; the ones before it are earlier turns to a router."""
        self.tokenizer = ByteTokenizer()

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        assert policy is not None
        if self.work_s:
            await sandbox.exec(f"sleep {self.work_s}", timeout_s=self.work_s + 30)
        prompt = self.tokenizer.encode_messages([{"role": "user", "content": "pick"}], add_generation_prompt=True)
        started = time.monotonic()
        for _ in range(self.calls):
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
