"""Many episodes at once: a concurrency limit, GRPO groups, streaming, retries, JSONL, a summary.

::

    runner = RolloutRunner(provider, agent, policy=engine, config=RunnerConfig(concurrency=64, group_size=8))
    async for group in runner.stream(tasks):      # groups in the order they finish
        trainer_queue.put(group)
    result = await runner.run(tasks)              # or all at once, with a summary

Every task becomes one group of ``group_size`` episodes (a GRPO group: same task, independent
samples). Episodes of all groups share one semaphore of ``concurrency`` slots, taken in
submission order, so early groups finish first and flow on while later ones run. An episode
that ends in a retryable ``infra_error`` is run again (same ``episode_id``, ``attempt`` + 1)
up to ``max_attempts``; the errors of earlier attempts stay on the final trajectory.
Cancelling a stream or a run cancels its episodes, each of which closes its sandbox.

With ``fork_groups`` a group's setup runs once, in a parent sandbox that is then snapshotted,
and its episodes start from the snapshot (:mod:`sandrl.rollout.forks`); the parent takes a
concurrency slot while it sets up, and a failed setup is retried as an episode is, then fails
every episode of its group with its error.

``host_capacity`` admits commands, not episodes: at most that many commands (the agents', the
setup's and the verifiers') run at once across the run's sandboxes, the rest queue
(:class:`~sandrl.sandbox.admission.CommandAdmission`); episodes waiting on the model hold no slot.
Set it to the host's measured capacity (``sandrl bench contention``: busy sandboxes within the
latency bar, :func:`sandrl.capacity.admission_slots`) to keep commands within the bar.

The other side's capacity, the inference engines' KV cache, is admitted per model call by the
policy the runner is given (``[inference] kv_admission``: :mod:`sandrl.inference.kv_admission`):
a burst of episodes waits for the engines' room instead of making them retract. Each episode's
wait is its ``timings.kv_wait_s``, the run's the summary's ``kv_admission``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandrl.aio import gather_all, wait_out
from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient
from sandrl.inference.fleet import affinity
from sandrl.inference.kv_admission import admission_stats
from sandrl.retry import Backoff, retry
from sandrl.rollout.agent import Agent, InstallsInImage
from sandrl.rollout.episode import EpisodeConfig, run_episode
from sandrl.rollout.failures import classify
from sandrl.rollout.forks import PreparedGroup, check_forks, prepare_group, release_group
from sandrl.rollout.images import ImageFor, TaskImages
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.progress import EpisodeProgress
from sandrl.rollout.summary import summarize
from sandrl.rollout.trajectory import EpisodeError, Trajectory
from sandrl.sandbox.admission import AdmittedProvider, CommandAdmission
from sandrl.sandbox.base import SandboxProvider
from sandrl.sandbox.idle_cpu import IdleCpus
from sandrl.tasks.task import Task


@dataclass(frozen=True)
class RunnerConfig:
    """How many episodes run at once, how they are grouped and retried.

    The one place these settings are checked: ``[rollout]``
    (:class:`~sandrl.wiring.config.RolloutConfig`) and ``sandrl eval``'s options build one to check theirs.
    """

    concurrency: int = 32
    """Most episodes (and so sandboxes) live at once."""
    group_size: int = 1
    """Samples per task (GRPO's n)."""
    max_attempts: int = 3
    """Attempts per episode when it ends in a retryable infra error (1 = no retry)."""
    retry_backoff_s: float = 1.0
    """Wait before a retry; doubles with each further attempt."""
    host_capacity: int | None = None
    """Most commands running at once across the run's sandboxes; the rest wait for a slot (FIFO).
    None: every command runs when issued."""
    fill_idle_cores: float | None = None
    """With ``host_capacity``: also run a waiting command while at least this many of the host's
    cores sat idle over the last tenth of a second (work-conserving admission,
    :class:`~sandrl.sandbox.idle_cpu.IdleCpus`), at most ``host_capacity`` such extras at once.
    None: never beyond the capacity."""
    run_id: str | None = None
    """Prefix of every group and episode id; a fixed one makes ids stable across runs. None: random."""
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    fork_groups: bool = False
    """Set each group's task up once and start its episodes from a snapshot of that sandbox
    (:mod:`sandrl.rollout.forks`); the provider must fork (refused at start otherwise)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.retry_backoff_s < 0:
            raise ConfigError(f"retry_backoff_s must be >= 0, got {self.retry_backoff_s}")
        if self.host_capacity is not None and self.host_capacity < 1:
            raise ConfigError(f"host_capacity must be >= 1 command at once, got {self.host_capacity}")
        if self.fill_idle_cores is not None and not self.fill_idle_cores > 0:
            raise ConfigError(f"fill_idle_cores must be a positive number of cores, got {self.fill_idle_cores}")
        if not isinstance(self.fork_groups, bool):
            raise ConfigError(f"fork_groups must be true or false, got {self.fork_groups!r}")


@dataclass(frozen=True)
class Group:
    """The samples of one task in one run: what GRPO normalises rewards over."""

    group_id: str
    task_id: str
    trajectories: list[Trajectory]

    @property
    def complete(self) -> bool:
        """Every sample was verified: no infra or agent error left after retries."""
        return all(t.reward is not None for t in self.trajectories)

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]


@dataclass(frozen=True)
class RunResult:
    groups: list[Group]
    summary: dict[str, Any]
    wall_s: float

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]


class RolloutRunner:
    """Runs groups of episodes concurrently; see the module docstring."""

    def __init__(
        self,
        provider: SandboxProvider,
        agent: Agent,
        *,
        policy: InferenceClient | None = None,
        config: RunnerConfig | None = None,
        image_for: ImageFor | None = None,
        writer: TrajectoryWriter | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.provider = provider
        self.agent = agent
        self.policy = policy
        self.config = config or RunnerConfig()
        if self.config.fork_groups:
            check_forks(provider)
        self.run_id = self.config.run_id or uuid.uuid4().hex[:12]
        self.image_for = image_for or TaskImages(provider)
        if isinstance(agent, InstallsInImage):  # a CLI agent: the task's image with the agent's files over it
            self.image_for = agent.image_for(self.image_for, provider)
        self.writer = writer
        self._listeners: list[Callable[[Trajectory], None]] = [on_episode] if on_episode is not None else []
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self.admission: CommandAdmission | None = None
        """The command admission of ``host_capacity`` (its counters say how much queued), else None."""
        self._episode_provider: SandboxProvider = provider
        if self.config.host_capacity is not None:
            fill = self.config.fill_idle_cores
            self.admission = CommandAdmission(
                self.config.host_capacity,
                fill_idle=IdleCpus() if fill is not None else None,
                fill_idle_cores=fill if fill is not None else 1.0,
            )
            self._episode_provider = AdmittedProvider(provider, self.admission)

    def group_ids(self, tasks: Sequence[Task]) -> list[str]:
        """The group id of each task: ``<run_id>/<task_id>#<k>``, k counting repeats of a task in the list."""
        seen: Counter[str] = Counter()
        ids = []
        for task in tasks:
            ids.append(f"{self.run_id}/{task.id}#{seen[task.id]}")
            seen[task.id] += 1
        return ids

    async def stream(self, tasks: Sequence[Task]) -> AsyncIterator[Group]:
        """Run every task's group; yield each group as soon as all its samples have finished."""
        pending = {
            asyncio.ensure_future(self._group(task, gid))
            for task, gid in zip(tasks, self.group_ids(tasks), strict=True)
        }
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    yield finished.result()
        finally:
            for still in pending:
                still.cancel()
            if pending:
                # Wait for the cancelled episodes to close their sandboxes.
                with contextlib.suppress(asyncio.CancelledError):
                    await wait_out(pending)

    async def run(self, tasks: Sequence[Task], *, progress: bool = False) -> RunResult:
        """All groups, in the tasks' order, with the summary of every episode."""
        start = time.monotonic()
        order = {gid: i for i, gid in enumerate(self.group_ids(tasks))}
        groups: list[Group] = []
        bar = EpisodeProgress(len(tasks) * self.config.group_size, enabled=progress)
        self._listeners.append(bar.done)
        try:
            with bar:
                async for group in self.stream(tasks):
                    groups.append(group)
        finally:
            self._listeners.remove(bar.done)
        groups.sort(key=lambda g: order[g.group_id])
        trajectories = [t for g in groups for t in g.trajectories]
        summary = summarize(trajectories)
        if self.admission is not None:
            summary["admission"] = self.admission.stats()
        kv_admission = admission_stats(self.policy)  # [inference] kv_admission
        if kv_admission is not None:
            summary["kv_admission"] = kv_admission
        return RunResult(groups, summary, time.monotonic() - start)

    async def run_group(self, task: Task, group_id: str) -> Group:
        """One group of ``task`` under an id the caller chose (a training driver numbers groups across steps)."""
        return await self._group(task, group_id)

    async def _group(self, task: Task, group_id: str) -> Group:
        try:
            image = await self.image_for(task)
        except Exception as exc:
            error = classify(exc, "image")
            trajectories = [self._failed(task, group_id, i, error) for i in range(self.config.group_size)]
        else:
            if self.config.fork_groups:
                trajectories = await self._forked_group(task, group_id, image)
            else:
                submitted = time.monotonic()
                trajectories = await gather_all(
                    *(self._episode(task, group_id, i, image, submitted) for i in range(self.config.group_size))
                )
        group = Group(group_id, task.id, trajectories)
        if self.writer is not None:
            self.writer.write_all(group.trajectories)
        return group

    async def _forked_group(self, task: Task, group_id: str, image: str) -> list[Trajectory]:
        """The group's episodes, started from one set-up sandbox's snapshot (:mod:`.forks`)."""
        prepared, earlier = await self._prepare(task, image)
        if isinstance(prepared, EpisodeError):
            return [self._failed(task, group_id, i, prepared, earlier) for i in range(self.config.group_size)]
        provenance = prepared.provenance()
        try:
            submitted = time.monotonic()
            return await gather_all(
                *(
                    self._episode(task, group_id, i, prepared.snapshot, submitted, provenance)
                    for i in range(self.config.group_size)
                )
            )
        finally:
            await asyncio.shield(release_group(self._episode_provider, prepared))

    async def _prepare(self, task: Task, image: str) -> tuple[PreparedGroup | EpisodeError, list[EpisodeError]]:
        """The group's setup, retried as an episode is; with the errors of the attempts before."""
        earlier: list[EpisodeError] = []

        async def attempt(n: int) -> PreparedGroup | EpisodeError:
            async with self._slots:
                return await prepare_group(task, self._episode_provider, image, self.config.episode.timeouts, attempt=n)

        def keep(_: int, failed: PreparedGroup | EpisodeError | Exception) -> None:
            assert isinstance(failed, EpisodeError)
            earlier.append(failed)

        result = await retry(
            attempt,
            attempts=self.config.max_attempts,
            backoff=Backoff(self.config.retry_backoff_s),
            retry_if=lambda r: isinstance(r, EpisodeError) and r.retryable,
            on_retry=keep,
        )
        return result, earlier

    def _failed(
        self, task: Task, group_id: str, index: int, error: EpisodeError, earlier: Sequence[EpisodeError] = ()
    ) -> Trajectory:
        trajectory = Trajectory(
            episode_id=f"{group_id}/{index}",
            group_id=group_id,
            task_id=task.id,
            task_set=task.source.parent.name,
            sample_index=index,
            agent=self.agent.name,
            status="infra_error" if error.kind == "infra" else "agent_error",
            stop_reason="error",
            error=error,
            retried_errors=list(earlier),
            started_at=time.time(),
        )
        self._finished(trajectory)
        return trajectory

    def _finished(self, trajectory: Trajectory) -> None:
        for listener in self._listeners:
            listener(trajectory)

    async def _episode(
        self,
        task: Task,
        group_id: str,
        index: int,
        image: str,
        submitted: float,
        forked_from: dict[str, Any] | None = None,
    ) -> Trajectory:
        """The episode's last attempt, after retryable infra errors (kept on it as ``retried_errors``)."""
        episode_id = f"{group_id}/{index}"
        earlier: list[EpisodeError] = []

        async def attempt(n: int) -> Trajectory:
            queued_since = submitted if n == 1 else time.monotonic()  # a retry queues from the end of its wait
            async with self._slots:
                return await run_episode(
                    task,
                    self._episode_provider,
                    self.agent,
                    policy=self.policy,
                    config=self.config.episode,
                    image=image,
                    episode_id=episode_id,
                    group_id=group_id,
                    sample_index=index,
                    attempt=n,
                    queue_s=time.monotonic() - queued_since,
                    forked_from=forked_from,
                )

        def keep(_: int, failed: Trajectory | Exception) -> None:
            assert isinstance(failed, Trajectory) and failed.error is not None
            earlier.append(failed.error)

        # Every inference call of the episode names it: a router keeps it on one engine (the prefix cache).
        with affinity.bound(episode_id) as route:
            trajectory = await retry(
                attempt,
                attempts=self.config.max_attempts,
                backoff=Backoff(self.config.retry_backoff_s),
                retry_if=lambda t: t.status == "infra_error" and t.error is not None and t.error.retryable,
                on_retry=keep,
            )
        trajectory = dataclasses.replace(trajectory, retried_errors=earlier, engine_moves=route.moves)
        self._finished(trajectory)
        return trajectory
