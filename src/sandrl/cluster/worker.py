"""A rollout worker: a RolloutRunner over the fleet of sandbox hosts, with its share of the concurrency.

This is the body of the Ray actor (:mod:`sandrl.cluster.ray` wraps it with ``ray.remote``); it
imports nothing of Ray, so it runs and is tested in one process too. A worker

- loads the run's tasks itself: a generated family is written again (byte-identical for the same
  family, count and seed) into a directory of its own; a task path must be readable on its node;
- samples through the run's inference router (:mod:`sandrl.cluster.engines`: one URL in front of the
  engines, every episode's calls on one engine) and
  places sandboxes with a :class:`~sandrl.cluster.fleet.FleetProvider` whose sandboxes carry the
  worker's label, so a restarted worker first closes what its dead predecessor left;
- runs the groups the driver hands it (:meth:`RolloutWorker.run_group`, by task id and group id:
  the ids of the episodes are ``<group id>/<sample index>``, the same whichever worker runs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from sandrl.inference.base import InferenceClient
from sandrl.inference.openai import OpenAIClient
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import Tokenizer, model_tokenizer
from sandrl.inference.transport import HTTPConfig
from sandrl.inference.vllm import VLLMClient
from sandrl.rollout.agent import Agent
from sandrl.rollout.runner import Group, RolloutRunner
from sandrl.tasks.task import Task
from sandrl.train.run_config import RunConfig
from sandrl.wiring import build_runner, task_set

WORKER_LABEL = "sandrl.worker"
"""The metadata key of every sandbox a worker creates: its value is the worker's name."""


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
    inference: str
    """The URL of the run's inference router; empty for agents without a model (replay, oracle)."""
    concurrency: int
    run_id: str
    agent: Agent | None = None
    """None: the LLM agent of the run config; else this agent (copied to the worker)."""
    fleet: FleetConfig = field(default_factory=FleetConfig)
    inference_token: str | None = field(default=None, repr=False)
    """The router's token (the engines' own)."""
    inference_api: str = "sglang"
    """The router's routes: those of its engines (``sglang``: sandrl's and SGLang's; ``vllm``; ``openai``)."""


class RolloutWorker:
    """Runs groups on the fleet; see the module docstring. Start it with :meth:`start` (idempotent)."""

    def __init__(self, spec: WorkerSpec, *, policy: InferenceClient | None = None) -> None:
        self.spec = spec
        self.fleet = FleetProvider(spec.hosts, spec.fleet, labels={WORKER_LABEL: spec.name})
        self._policy = policy
        self._endpoints: SGLangClient | VLLMClient | OpenAIClient | None = None
        """The policy's client when the worker made it (and so closes it)."""
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
        tasks = task_set(spec.run.tasks, Path(self._dir.name) / "tasks")
        self.tasks = {t.id: t for t in tasks}
        if self._policy is None and spec.inference:
            # The tokenizer of [model] name, read on this node: the agent renders its prompts with it.
            tokenizer = model_tokenizer(spec.run.model.name) if spec.agent is None else None
            self._policy = self._endpoints = router_client(spec, tokenizer)
        # The fleet's hosts have capacities of their own (HostConfig); [rollout] host_capacity is one machine's.
        rollout = dataclasses.replace(
            spec.run.rollout, concurrency=spec.concurrency, host_capacity=None, capacity_file=""
        )
        await self.fleet.check_all()
        self.reaped = await self.fleet.reap()
        await self.fleet.__aenter__()
        self.runner = build_runner(
            rollout, self.fleet, policy=self._policy, agent=spec.agent, run_id=spec.run_id, image_for=fleet_image
        )

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
        if self._endpoints is not None:
            await self._endpoints.aclose()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def router_client(spec: WorkerSpec, tokenizer: Tokenizer | None) -> SGLangClient | VLLMClient | OpenAIClient:
    """A client of the run's router, with its engines' routes; it sends each episode's routing key."""
    http = HTTPConfig(api_key=spec.inference_token)
    policy = spec.run.model.update_policy
    if spec.inference_api == "vllm":
        return VLLMClient(spec.inference, http=http, tokenizer=tokenizer, update_policy=policy)
    if spec.inference_api == "openai":
        return OpenAIClient(spec.inference, http=http, tokenizer=tokenizer)
    # A launched SGLang returns temperature-1 log-probs (commands.py sets its switch).
    original = True if spec.run.inference.launch == "sglang" else None
    return SGLangClient(
        spec.inference, http=http, tokenizer=tokenizer, update_policy=policy, original_logprobs=original
    )


def task_fingerprint(tasks: Sequence[Task]) -> list[str]:
    return sorted(t.id for t in tasks)
