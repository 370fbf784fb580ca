"""A run's :class:`Session`: what the sync and async drivers share; it rolls out, trains, pushes weights, records.

A driver only decides *when* groups are collected and *when* weights are pushed
(:mod:`sandrl.train.sync`, :mod:`sandrl.train.async_`); everything else is here:

- the data stream: the groups of a :class:`~sandrl.train.group_sources.GroupSource` by data position
  (with ``[[tasks.sources]]``, each step's record split by source, :mod:`sandrl.train.mix_report`);
  a checkpoint saves the lowest one not yet consumed and those above it
  already consumed, so a resumed run redoes only the groups that were in flight, and trains none twice;
- :meth:`Session.train`: trajectories to a batch (:mod:`sandrl.train.adapter`), then the one
  :meth:`~sandrl.train.trainer.Trainer.step` both drivers use; metrics to ``metrics.jsonl`` (with
  staleness per trajectory and per token, :mod:`sandrl.train.staleness`) and the progress line;
  checkpoints every ``checkpoint_every`` steps;
- :meth:`Session.push_weights`: the trainer's weights into the inference side (broadcast, or by the disk:
  ``[inference] weight_sync``), whose next samples then carry the new weight version.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from rich.console import Console

from sandrl.aio import gather_all
from sandrl.errors import ConfigError, InferenceError
from sandrl.host_memory import process_memory_bytes
from sandrl.inference.base import InferenceClient
from sandrl.inference.broadcast_policy import BroadcastingPolicy, push_broadcast
from sandrl.inference.weight_push import BroadcastSpec
from sandrl.progress import duration
from sandrl.rollout.agent import Agent
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.prefetch import images_ahead
from sandrl.sandbox.base import SandboxProvider
from sandrl.train import checkpoint
from sandrl.train.adapter import batch_from_groups
from sandrl.train.batch import Batch
from sandrl.train.group_sources import FileSource, GroupSource, Item, RolloutSource
from sandrl.train.mismatch_watch import MismatchWatch
from sandrl.train.mix_report import MixReport
from sandrl.train.run_config import RunConfig, save_resolved
from sandrl.train.signal_watch import SignalWatch, split_no_signal
from sandrl.train.staleness import mixed_version, oldest_version, token_staleness_hist
from sandrl.train.step_progress import StepProgress
from sandrl.train.trackers.fanout import Trackers, open_trackers
from sandrl.train.trainer import ExportedWeights, Metrics, Trainer
from sandrl.wiring import build_runner, open_agent, open_policy, open_provider, task_mix
from sandrl.wiring.task_mix import TaskMix

T = TypeVar("T")


class StepTrainer(Protocol):
    """What a session needs of its trainer: a :class:`Trainer`, or a proxy to one in another process."""

    steps: int
    version: int
    data_position: int
    data_done: tuple[int, ...]

    def step(self, batch: Batch) -> Metrics: ...

    def export_weights(self, directory: str | Path) -> ExportedWeights: ...

    def broadcast_weights(self, spec: BroadcastSpec) -> str | None:
        """Send the weights to the engines over a process group; None when done, else why not (then: the disk)."""

    def save_checkpoint(self, root: str | Path) -> Path: ...

    def close(self) -> None:
        """Let go of what the trainer holds (its rank processes); a trainer in this process holds nothing."""


def _memory(trainer: StepTrainer | None) -> dict[str, float]:
    """The driver process's resident memory now and at its peak (MiB): a run whose memory grows
    step after step on a flat workload shows it in every line. A trainer of rank processes on this
    host (``[train] processes``) adds theirs, summed (``rss_ranks_mb``); the engines a run launched
    (``[inference] launch``) and the sandboxes are not counted."""
    memory = process_memory_bytes()
    if memory is None:
        return {}
    record = {"rss_mb": memory[0] / 2**20, "rss_peak_mb": memory[1] / 2**20}
    ranks = [m[0] for pid in getattr(trainer, "pids", ()) if (m := process_memory_bytes(pid)) is not None]
    if ranks:
        record["rss_ranks_mb"] = sum(ranks) / 2**20
    return record


@dataclass
class Counters:
    """Running totals over the whole run, in every metrics line."""

    episodes: int = 0
    infra_errors: int = 0
    untrainable: int = 0
    zero_signal_groups: int = 0
    stale_dropped: int = 0
    stale_regenerated: int = 0


@dataclass
class Session:
    """One run's state between the drivers and the parts; see the module docstring."""

    config: RunConfig
    source: GroupSource
    trainer: StepTrainer | None
    """None with ``--rollout-only``."""
    policy: InferenceClient | None = None
    """The inference side weights are pushed to; None when training from a file."""
    mode: str = "sync"
    console: Console = field(default_factory=lambda: Console(stderr=True))
    counters: Counters = field(default_factory=Counters)
    signal: SignalWatch = field(default_factory=SignalWatch)
    mismatch: MismatchWatch = field(default_factory=MismatchWatch)
    progress: StepProgress | None = None
    """The bar of the step in progress (default: on ``console``); the runner's ``on_episode`` feeds it."""
    batches: int = 0
    """Batches consumed (trained, or recorded with ``--rollout-only``)."""
    pushed_version: int = 0
    """The weight version the inference side serves (it starts on the initial weights, version 0)."""
    _next: int = 0
    _requeued: collections.deque[int] = field(default_factory=collections.deque)
    _regenerated: collections.Counter[int] = field(default_factory=collections.Counter)
    _consumed: set[int] = field(default_factory=set)
    _low: int = 0
    _metrics: IO[str] | None = None
    _last: float = field(default_factory=time.monotonic)
    _began: tuple[float, int] | None = None
    """When this process's first step began, and the steps done before it (for the run's ETA)."""
    trackers: Trackers | None = None
    """``[run] trackers`` besides ``metrics.jsonl`` (default: opened from the config, on ``console``)."""
    mix: TaskMix | None = None
    """What the positions' tasks are drawn from; with several sources, each step's record is split by source."""
    _mix_report: MixReport | None = None

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = episode_bar(self.config, self.console)
        out = self.config.output_dir
        out.mkdir(parents=True, exist_ok=True)
        if self.trainer is not None and self.config.run.resume:
            last = _forget_steps_after(out / "metrics.jsonl", self.trainer.steps)
            # The run's totals go on from the checkpoint's step.
            self.counters = Counters(**{k: int(last.get(f"total_{k}", 0)) for k in vars(Counters())})
        self._metrics = (out / "metrics.jsonl").open("a", encoding="utf-8")
        if self.trackers is None:
            self.trackers = open_trackers(self.config.run.trackers, self.config.output_dir, self.console)
        self.trackers.log_config(self.config.to_dict())
        if self.trainer is not None:
            self.batches = self.trainer.steps
            self._next = self._low = self.trainer.data_position
            self._consumed = {p for p in self.trainer.data_done if p > self._low}
        if self.mix is not None:
            self._mix_report = MixReport.of(self.mix, self.console, self._low, self._consumed)

    # -- the data stream ---------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        exhausted = self.source.limit is not None and self._next >= self.source.limit and not self._requeued
        return self.batches >= self.config.run.steps or (exhausted and not self._in_use())

    def _in_use(self) -> bool:
        return self._low < self._next

    def next_position(self) -> int | None:
        """The next data position to roll out (a requeued one first); None when the source is used up."""
        if self._requeued:
            return self._requeued.popleft()
        while self._next in self._consumed:  # consumed before a resume
            self._next += 1
        if self.source.limit is not None and self._next >= self.source.limit:
            return None
        self._next += 1
        return self._next - 1

    async def rollout(self, position: int) -> Item:
        assert self.progress is not None
        self.progress.rolling_out(self.batches + 1)
        group_id = self.source.group_id(position, self._regenerated[position])
        return position, await self.source.group(position, group_id)

    async def collect(self, n: int) -> list[Item]:
        """``n`` groups rolled out at once (fewer at the end of a file)."""
        positions = [p for p in (self.next_position() for _ in range(n)) if p is not None]
        return await gather_all(*(self.rollout(p) for p in positions))

    def consumed(self, position: int) -> None:
        self._consumed.add(position)
        while self._low in self._consumed:
            self._consumed.discard(self._low)
            self._low += 1

    def stale(self, position: int) -> None:
        """A group too stale to train: drop it, or run its task again (``async.on_stale``)."""
        if self.config.async_.on_stale == "regenerate" and self.source.regenerates:
            self.counters.stale_regenerated += 1
            self._regenerated[position] += 1
            self._requeued.append(position)
        else:
            self.counters.stale_dropped += 1
            self.consumed(position)

    @property
    def version(self) -> int:
        """The trainer's weight version (what staleness is measured against)."""
        return self.trainer.version if self.trainer is not None else self.pushed_version

    # -- the step ---------------------------------------------------------------------------------

    async def train(self, items: Sequence[Item], **extra: float) -> dict[str, Any]:
        """Train on ``items`` with ``Trainer.step`` (or only record them with ``--rollout-only``); log, checkpoint.

        The step runs in a worker thread, so the event loop (episodes in flight, the async
        driver's producer) goes on meanwhile; the bookkeeping stays on the loop. Cancelled
        meanwhile (SIGINT, SIGTERM), it lets the step end (its thread cannot be stopped, and only
        then is the trainer's state whole), records and checkpoints it as usual, then raises
        :class:`asyncio.CancelledError`.
        """
        groups = [g.trajectories for _, g in items]
        # The token budget the agent loop enforced: the policy's context caps [rollout] max_total_tokens.
        truncation = self.config.truncation(self.policy.max_context if self.policy is not None else None)
        loss = self.config.train.loss
        adapted = batch_from_groups(
            groups,
            scale_rewards=loss.scale_rewards,
            truncation=truncation,
            advantage=loss.advantage,
            epsilon=loss.advantage_epsilon,
        )
        c = self.counters
        c.episodes += adapted.episodes
        c.infra_errors += adapted.infra_errors
        c.untrainable += adapted.untrainable
        c.zero_signal_groups += adapted.batch.zero_signal_groups
        trajectories = [t for g in groups for t in g]
        # Measured against the weights the step starts from, per trajectory (its oldest token) and per token.
        sampled_by = [v for v in map(oldest_version, trajectories) if v is not None]
        staleness = [self.version - v for v in sampled_by]
        token_hist = token_staleness_hist(trajectories, self.version)
        trained: Metrics = {}
        stopping = False
        assert self.progress is not None
        tokens = sum(len(s.token_ids) for s in adapted.batch.samples)
        self.progress.training(self.batches + 1, len(adapted.batch.samples), tokens)
        if self._began is None:
            self._began = (self._last, self.batches)
        if self.trainer is not None:
            trained, stopping = await to_the_end(asyncio.to_thread(self.trainer.step, adapted.batch))
        self.batches += 1
        for position, _ in items:
            self.consumed(position)
        if not self.finished:  # before the step's line, so no line of this step's bar comes after it
            self.progress.rolling_out(self.batches + 1)
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        model_tokens = sum(sum(t.loss_mask) for t in trajectories)
        all_pass, all_fail = split_no_signal(groups)
        record: dict[str, Any] = {
            "step": self.batches,
            "mode": self.mode,
            "time": time.time(),
            "data_position": self._low,
            "weight_version": self.version,
            "reward_mean": adapted.batch.reward_mean,
            "pass_rate": sum(bool(t.passed) for t in trajectories) / max(len(trajectories), 1),
            "tokens_per_s": model_tokens / elapsed if elapsed > 0 else 0.0,
            "step_s": elapsed,
            "groups": len(items),
            "groups_trained": adapted.batch.groups - adapted.batch.zero_signal_groups,
            "samples_trained": len(adapted.batch.samples),
            "groups_all_pass": all_pass,
            "groups_all_fail": all_fail,
            "staleness_hist": {str(k): v for k, v in sorted(collections.Counter(staleness).items())},
            "token_staleness_hist": token_hist,
            "mixed_version_samples": sum(map(mixed_version, trajectories)),
            **adapted.truncation.metrics(),
            **(self._mix_report.step(items, self._low, self._consumed) if self._mix_report else {}),
            **{f"total_{k}": v for k, v in vars(c).items()},
            **_memory(self.trainer),
            **extra,
            **{f"train/{k}": v for k, v in trained.items()},
        }
        assert self._metrics is not None
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        assert self.trackers is not None
        tokenizer = self.policy.tokenizer if self.policy is not None else getattr(self.trainer, "tokenizer", None)
        self.trackers.log_step(record, trajectories, tokenizer)
        self._progress(record)
        every = self.config.run.checkpoint_every
        if self.trainer is not None and every and self.batches % every == 0:
            self.save_checkpoint()
            if not self.finished:
                self.progress.rolling_out(self.batches + 1)
        if stopping:
            raise asyncio.CancelledError
        return record

    def _progress(self, r: dict[str, Any]) -> None:
        hist = r["staleness_hist"]
        stale = max((int(k) for k in hist), default=0)
        line = (
            f"step {r['step']}/{self.config.run.steps}  reward {r['reward_mean']:.3f}  pass {r['pass_rate']:.2f}  "
            f"tok/s {r['tokens_per_s']:.0f}  stale<={stale}  v{r['weight_version']}  "
            f"trained {r['groups_trained']}/{r['groups']} groups"
        )
        if "rss_mb" in r:
            line += f"  rss {r['rss_mb'] / 1024:.1f}G (peak {r['rss_peak_mb'] / 1024:.1f}G)"
            if "rss_ranks_mb" in r:
                line += f" ranks {r['rss_ranks_mb'] / 1024:.1f}G"
        if self._began is not None and r["step"] < self.config.run.steps:
            began, before = self._began
            per_step = (time.monotonic() - began) / max(r["step"] - before, 1)
            line += f"  ETA {duration(per_step * (self.config.run.steps - r['step']))}"
        if "buffer_fill" in r:
            line += f"  buffer {r['buffer_fill']:.2f}  idle: trainer {r['trainer_idle_s']:.1f}s"
            line += f" rollout {r['rollout_idle_s']:.1f}s"
        suffix, advice = self.signal.observe(r["groups_trained"], r["groups_all_pass"], r["groups_all_fail"])
        suffix += self.mismatch.observe(r)
        self.console.print(line + suffix, highlight=False, markup=False, soft_wrap=True)
        if advice is not None:
            self.console.print(f"warning: {advice}", highlight=False, markup=False, soft_wrap=True)

    # -- weights and checkpoints --------------------------------------------------------------------

    async def push_weights(self) -> int:
        """Load the trainer's weights into the inference side (when they changed); the version it now serves."""
        if self.trainer is None or self.policy is None or self.trainer.version == self.pushed_version:
            return self.pushed_version
        assert self.progress is not None
        self.progress.working(self.batches, f"loading weights v{self.trainer.version} into the inference side")
        if not await self._broadcast_weights():
            exported = self.trainer.export_weights(self.config.output_dir / "weights")
            # The inference side takes the trainer's version as its own: samples name the weights that made them.
            await self.policy.update_weights(str(exported.path), version=exported.version)
            for old in sorted(exported.path.parent.glob("weights-v*"))[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        self.pushed_version = self.trainer.version
        if not self.finished:
            self.progress.rolling_out(self.batches + 1)
        return self.pushed_version

    async def _broadcast_weights(self) -> bool:
        """Push the weights over a process group if the policy's engines take them so; False: by the disk."""
        assert self.trainer is not None and self.policy is not None
        if not isinstance(self.policy, BroadcastingPolicy):
            return False
        # In a worker thread: the trainer's rank 0 runs the push on a loop of its own (generation goes on here).
        why = await push_broadcast(self.policy, self.trainer.broadcast_weights, self.trainer.version)
        if why is not None and self.config.inference.weight_sync == "broadcast":
            raise InferenceError(f"the weight broadcast failed: {why}")
        if why is not None:
            self.console.print(f"warning: the weight broadcast failed, loading from disk instead: {why}")
        return why is None

    def save_checkpoint(self) -> Path | None:
        if self.trainer is None:
            return None
        assert self.progress is not None
        self.progress.working(self.batches, "saving a checkpoint")
        self.trainer.data_position = self._low
        self.trainer.data_done = tuple(sorted(self._consumed))
        return self.trainer.save_checkpoint(self.config.output_dir / "checkpoints")

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
        if self.progress is not None:
            self.progress.stop()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self.trackers is not None:
            self.trackers.close(finished=self.finished)


async def to_the_end(work: Awaitable[T]) -> tuple[T, bool]:
    """``work``'s result, awaited to its end even through cancellations; and whether one came meanwhile."""
    future = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(future), cancelled
        except asyncio.CancelledError:
            if future.cancelled():
                raise
            cancelled = True


def episode_bar(config: RunConfig, console: Console) -> StepProgress:
    """The bar of a run's steps: ``groups_per_step x group_size`` episodes each, then the trainer's work."""
    return StepProgress(config.run.steps, config.run.groups_per_step * config.rollout.group_size, console)


# -- putting a session together ----------------------------------------------------------------------


def _forget_steps_after(metrics: Path, steps: int) -> dict[str, Any]:
    """Drop the lines of steps the checkpoint does not hold (a run killed between a step's line and its
    checkpoint, or a torn last line), so a resumed run's metrics have each step once; the last line kept."""
    if not metrics.is_file():
        return {}
    kept: list[str] = []
    last: dict[str, Any] = {}
    lines = metrics.read_text(encoding="utf-8").splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and step <= steps:
            kept.append(line)
            last = record
    if len(kept) != len(lines):
        staging = metrics.with_name(f".{metrics.name}.resume")
        staging.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        staging.replace(metrics)
    return last


def make_trainer(config: RunConfig) -> StepTrainer:
    """The trainer on a fresh copy of ``[model] name``, resumed from the newest checkpoint if ``run.resume``.

    With several ``[train] processes`` (or bf16 or offloading, which FSDP2 provides), the trainer is
    a :class:`~sandrl.train.ranks.RankGroup` of that many processes; otherwise it runs in this one.
    """
    from sandrl.inference.model import load_model
    from sandrl.train.ranks import RankGroup, RankSpec, needs_ranks

    last = checkpoint.latest(config.output_dir / "checkpoints") if config.run.resume else None
    if needs_ranks(config.train):
        return RankGroup(RankSpec(config.model.name, config.train, resume_from=str(last) if last else None))
    net, tokenizer, _ = load_model(config.model.name)
    trainer = Trainer(net, config.train, tokenizer=tokenizer)
    if last is not None:
        trainer.load_checkpoint(last)
    return trainer


@contextlib.asynccontextmanager
async def open_session(
    config: RunConfig,
    *,
    mode: str = "sync",
    load_rollouts: str | Path | None = None,
    rollout_only: bool = False,
    provider: SandboxProvider | None = None,
    agent: Agent | None = None,
    console: Console | None = None,
) -> AsyncIterator[Session]:
    """A ready session: trainer (resumed), policy with the trainer's weights, sandboxes, the data source.

    With ``load_rollouts`` nothing is started but the trainer: no sandboxes, no inference.
    ``provider`` and ``agent`` replace the bwrap provider and the LLM agent (tests, custom agents).
    """
    if load_rollouts is not None and rollout_only:
        raise ConfigError("--load-rollouts trains on saved trajectories and --rollout-only collects without training")
    save_resolved(config)
    trainer = None if rollout_only else make_trainer(config)
    console = console or Console(stderr=True)
    progress = episode_bar(config, console)
    extra: dict[str, Any] = {"mode": mode, "console": console, "progress": progress}
    if load_rollouts is not None:
        assert trainer is not None
        session = Session(config, FileSource.read(load_rollouts), trainer, **extra)
        try:
            yield session
        finally:
            session.close()
        return
    tasks = task_mix(config.tasks, config.output_dir / "tasks", config.run.seed)
    writer = TrajectoryWriter(config.output_dir / "rollouts.jsonl", append=True) if config.run.save_rollouts else None
    try:
        async with (
            open_policy(
                config.model, seed=config.run.seed, fleet=config.inference, run_dir=config.output_dir
            ) as policy,
            contextlib.AsyncExitStack() as agents,
        ):
            if agent is None:
                agent = await agents.enter_async_context(open_agent(config.rollout, policy))
            if provider is None:
                provider = await agents.enter_async_context(open_provider(config.rollout))
            # Every task's image in the background, in the order of the run's first pass over the
            # tasks: an episode waits only for its own image (nothing is fetched ahead on a
            # provider that keeps no image store: a remote service, E2B).
            order = tasks.first_pass()
            ahead = await agents.enter_async_context(
                images_ahead(provider, order, episode_jobs=config.rollout.concurrency)
            )
            runner = build_runner(
                config.rollout,
                provider,
                policy=policy,
                agent=agent,
                run_id=Path(config.run.output_dir).name,
                writer=writer,
                image_for=ahead.images,
                on_episode=progress.episode_done,
            )
            source = RolloutSource(runner, tasks, seed=config.run.seed, limit=tasks.limit)
            session = Session(config, source, trainer, policy=policy, mix=tasks, **extra)
            try:
                await session.push_weights()  # a resumed run serves the checkpoint's weights
                yield session
            finally:
                session.close()
    finally:
        if writer is not None:
            writer.close()
