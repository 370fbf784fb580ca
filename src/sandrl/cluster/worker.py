"""A rollout worker: a RolloutRunner over the fleet of sandbox hosts, with its share of the concurrency.

This is the body of the Ray actor (:mod:`sandrl.cluster.ray` wraps it with ``ray.remote``); it
imports nothing of Ray, so it runs and is tested in one process too. A worker

- loads the run's tasks itself: a generated family is written again (byte-identical for the same
  family, count and seed) into a directory of its own; a task path must be readable on its node;
- samples from the inference servers (:class:`~sandrl.cluster.endpoints.EndpointsClient`) and
  places sandboxes with a :class:`~sandrl.cluster.fleet.FleetProvider` whose sandboxes carry the
  worker's label, so a restarted worker first closes what its dead predecessor left;
- runs the groups the driver hands it (:meth:`RolloutWorker.run_group`, by task id and group id:
  the ids of the episodes are ``<group id>/<sample index>``, the same whichever worker runs them).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandrl.cluster.fleet import FleetConfig, FleetProvider
from sandrl.cluster.hosts import HostConfig
from sandrl.cluster.images import fleet_image
from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.rollout.agent import Agent, Budget
from sandrl.rollout.episode import EpisodeConfig
from sandrl.rollout.runner import Group, RolloutRunner, RunnerConfig
from sandrl.tasks.task import Task
from sandrl.train.run_config import RunConfig

WORKER_LABEL = "sandrl.worker"
"""The metadata key of every sandbox a worker creates: its value is the worker's name."""


def load_run_tasks(config: RunConfig, root: Path) -> list[Task]:
    """The tasks of ``config``: a generated family written under ``root``, or the task set at its path."""
    from sandrl.rollout.evaluate import load_task_set
    from sandrl.tasks.builtin.generated import generate_tasks

    spec = config.tasks
    if spec.family:
        generate_tasks(root, spec.family, spec.count, spec.seed, overwrite=True)
        return load_task_set(str(root))
    return load_task_set(spec.path)


def concurrency_shares(total: int, workers: int) -> list[int]:
    """``total`` episode slots split over ``workers`` (the first ones get the remainder); each at least 1."""
    base, extra = divmod(total, workers)
    return [max(1, base + (1 if i < extra else 0)) for i in range(workers)]


@dataclass(frozen=True)
class WorkerSpec:
    """What one rollout worker is made from (pickled to its actor by Ray)."""

    name: str
    """Unique in the run; labels the worker's sandboxes."""
    run: RunConfig
    hosts: tuple[HostConfig, ...]
    """With capacities resolved (:meth:`~sandrl.cluster.config.ClusterConfig.resolved`)."""
    inference: tuple[str, ...]
    """The policy's servers; empty for agents without a model (replay, oracle)."""
    concurrency: int
    run_id: str
    agent: Agent | None = None
    """None: the LLM agent of the run config; else this agent (copied to the worker)."""
    fleet: FleetConfig = field(default_factory=FleetConfig)


def llm_agent(config: RunConfig) -> Agent:
    """The run config's LLM agent, with the tokenizer of ``[model] name`` (read on this node)."""
    from sandrl.inference.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
    from sandrl.rollout.llm_agent import SYSTEM_PROMPT, LLMAgent, LLMAgentConfig

    r = config.rollout
    tokenizer: Tokenizer | None = ByteTokenizer() if config.model.name == "tiny" else load_tokenizer(config.model.name)
    if tokenizer is None:
        raise ConfigError(
            f"no tokenizer files in {config.model.name} on this node: [model] name must be a checkpoint "
            "directory readable by every rollout worker"
        )
    sampling = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens)
    return LLMAgent(tokenizer, LLMAgentConfig(sampling=sampling, system_prompt=r.system_prompt or SYSTEM_PROMPT))


class RolloutWorker:
    """Runs groups on the fleet; see the module docstring. Start it with :meth:`start` (idempotent)."""

    def __init__(self, spec: WorkerSpec, *, policy: InferenceClient | None = None) -> None:
        self.spec = spec
        self.fleet = FleetProvider(spec.hosts, spec.fleet, labels={WORKER_LABEL: spec.name})
        self._policy = policy
        self._own_policy = policy is None
        self.tasks: dict[str, Task] = {}
        self.runner: RolloutRunner | None = None
        self.reaped = 0
        """Sandboxes of a dead predecessor closed at start."""
        self.groups_done = 0
        self.in_flight = 0
        self._started: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        spec = self.spec
        self._dir = tempfile.TemporaryDirectory(prefix=f"sandrl-{spec.name.replace('/', '-')}-")
        tasks = load_run_tasks(spec.run, Path(self._dir.name) / "tasks")
        self.tasks = {t.id: t for t in tasks}
        if self._policy is None and spec.inference:
            from sandrl.cluster.endpoints import EndpointsClient

            self._policy = EndpointsClient(spec.inference)
        agent = spec.agent if spec.agent is not None else llm_agent(spec.run)
        r = spec.run.rollout
        config = RunnerConfig(
            concurrency=spec.concurrency,
            group_size=r.group_size,
            max_attempts=r.max_attempts,
            run_id=spec.run_id,
            episode=EpisodeConfig(budget=Budget(max_turns=r.max_turns, max_total_tokens=r.max_total_tokens)),
        )
        await self.fleet.check_all()
        self.reaped = await self.fleet.reap()
        await self.fleet.__aenter__()
        self.runner = RolloutRunner(self.fleet, agent, policy=self._policy, config=config, image_for=fleet_image)

    def task_ids(self) -> list[str]:
        return sorted(self.tasks)

    async def run_group(self, task_id: str, group_id: str) -> Group:
        """The group ``group_id`` of the task ``task_id``: ``group_size`` episodes, retried on infra errors."""
        await self.start()
        assert self.runner is not None
        task = self.tasks.get(task_id)
        if task is None:
            raise ConfigError(
                f"worker {self.spec.name} has no task {task_id!r}: the driver and the workers loaded different "
                "task sets (a task path must hold the same tasks on every node)"
            )
        self.in_flight += 1
        current = asyncio.current_task()
        running = {current} if current is not None else set()
        self._running |= running
        try:
            group = await self.runner.run_group(task, group_id)
        finally:
            self.in_flight -= 1
            self._running -= running
        self.groups_done += 1
        return group

    def pid(self) -> int:
        return os.getpid()

    def metrics(self) -> dict[str, Any]:
        """The worker's counters and its fleet's per-host metrics."""
        return {
            "name": self.spec.name,
            "pid": os.getpid(),
            "concurrency": self.spec.concurrency,
            "groups_done": self.groups_done,
            "in_flight": self.in_flight,
            "reaped": self.reaped,
            "hosts": self.fleet.metrics(),
        }

    async def close(self) -> None:
        """Cancel the groups still running (their sandboxes close), close what is left with the worker's
        label, then the fleet's clients and the policy's; remove the worker's task copy."""
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._started is not None:
            self.reaped += await self.fleet.reap()
        await self.fleet.aclose()
        if self._own_policy and self._policy is not None:
            aclose = getattr(self._policy, "aclose", None)
            if aclose is not None:
                await aclose()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def task_fingerprint(tasks: Sequence[Task]) -> list[str]:
    return sorted(t.id for t in tasks)
