"""GRPO groups from one prepared sandbox (``fork_groups``): setup once per group, episodes forked from it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sandrl.bench.fork_groups import run as bench_fork_groups
from sandrl.bench.setup_heavy import load_setup_heavy, write_task
from sandrl.errors import ConfigError, SandboxCreateError
from sandrl.rollout import OracleAgent, ReplayAgent, RolloutRunner, RunnerConfig, ThinkTime
from sandrl.rollout.images import TaskImages
from sandrl.sandbox.base import SandboxProvider, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig, build_runner
from sandrl.wiring.evaluate import EvalConfig

from .conftest import RecordingProvider


@pytest.fixture(scope="module")
def slow_setup(tmp_path_factory: pytest.TempPathFactory) -> Task:
    """A task whose setup waits 5 s (and makes the file the answer is read from)."""
    return load_setup_heavy(write_task(tmp_path_factory.mktemp("setup-heavy"), "slow-setup", wait_s=5.0))


class ForkingRecorder(RecordingProvider):
    """The recording provider, saying (as the provider it wraps does) that its sandboxes fork."""

    snapshots = True

    async def remove_image(self, name: str) -> None:
        await self.inner.remove_image(name)


def _fork_images(provider: BwrapProvider) -> list[str]:
    return [n for n in provider.images.names() if n.startswith("fork-")]


async def test_a_group_sets_up_once_and_its_episodes_start_from_the_snapshot(
    slow_setup: Task, provider: BwrapProvider
) -> None:
    recording = ForkingRecorder(provider)
    agent = ReplayAgent(["@solution"], ThinkTime(1, 2, 100.0))
    layers_before = set((provider.images.root / "layers").iterdir())
    config = RunnerConfig(concurrency=4, group_size=4, fork_groups=True, run_id="fork")
    runner = RolloutRunner(recording, agent, config=config, image_for=TaskImages(provider))
    result = await runner.run([slow_setup])
    (group,) = result.groups
    assert group.complete and group.rewards == [1.0] * 4, [t.error for t in group.trajectories]
    # One parent and four children, all closed; the 5 s setup ran once, in the parent: each episode
    # carries the one shared record of it, and its own time holds no setup.
    assert len(recording.created) == 5 and recording.live == 0
    parent = recording.created[0].id
    records = [t.forked_from for t in group.trajectories]
    assert all(r is not None and r["parent"] == parent for r in records)
    assert len({r["snapshot"] for r in records if r is not None}) == 1
    first = records[0]
    assert first is not None and first["setup_s"] >= 5.0 and first["image"] != first["snapshot"]
    assert all(t.timings.setup_s == 0.0 and t.image == first["snapshot"] for t in group.trajectories)
    assert all(t.timings.total_s < 5.0 for t in group.trajectories)
    forked = result.summary["forked_groups"]
    assert forked["groups"] == 1 and forked["setup_s"]["p50"] >= 5.0
    # The snapshot and its layer are gone with the group.
    assert _fork_images(provider) == []
    assert set((provider.images.root / "layers").iterdir()) == layers_before


async def test_siblings_see_the_setup_and_not_each_others_writes(tmp_path: Path, provider: BwrapProvider) -> None:
    task = load_setup_heavy(write_task(tmp_path, "quick-setup"))
    # Three siblings at once, each marking /workspace, then counting the marks a second later.
    look = "test -s /workspace/data/digest.txt && touch /workspace/sibling-$(hostname) && sleep 1 && "
    look += 'test "$(ls /workspace | grep -c sibling-)" = 1'
    agent = ReplayAgent([look], ThinkTime(0, 0, 100.0))
    config = RunnerConfig(concurrency=3, group_size=3, fork_groups=True, max_attempts=1)
    result = await RolloutRunner(provider, agent, config=config).run([task])
    assert [t.turns[0].exit_code for t in result.trajectories] == [0, 0, 0]
    assert len({t.sandbox_id for t in result.trajectories}) == 3
    assert _fork_images(provider) == []


async def test_a_failed_group_setup_is_retried_then_fails_every_episode(
    tmp_path: Path, provider: BwrapProvider
) -> None:
    class FailsFirst(ForkingRecorder):
        async def create(self, spec: SandboxSpec) -> object:  # type: ignore[override]
            if self.refusals == 0:
                self.refusals += 1
                raise SandboxCreateError("the host hiccupped")
            return await super().create(spec)

    task = load_setup_heavy(write_task(tmp_path, "fails-once"))
    flaky = FailsFirst(provider)
    config = RunnerConfig(concurrency=2, group_size=2, fork_groups=True, max_attempts=2, retry_backoff_s=0.01)
    runner = RolloutRunner(flaky, OracleAgent(), config=config, image_for=TaskImages(provider))
    (group,) = (await runner.run([task])).groups
    assert group.rewards == [1.0, 1.0]
    assert all(r is not None and r["attempt"] == 2 for r in (t.forked_from for t in group.trajectories))

    broken = ForkingRecorder(provider, refuse=SandboxCreateError("no room"))
    runner = RolloutRunner(broken, OracleAgent(), config=config, image_for=TaskImages(provider))
    (group,) = (await runner.run([task])).groups
    assert [t.status for t in group.trajectories] == ["infra_error", "infra_error"]
    assert all(t.error is not None and t.error.phase == "sandbox_create" for t in group.trajectories)
    assert all(len(t.retried_errors) == 1 and t.forked_from is None for t in group.trajectories)
    assert broken.refusals == 2  # the group's setup, twice; no episode tried on its own


def test_a_provider_that_cannot_fork_is_refused_at_start(provider: BwrapProvider) -> None:
    with pytest.raises(ConfigError, match="fork_groups needs sandboxes that can be snapshotted"):
        RolloutRunner(RecordingProvider(provider), OracleAgent(), config=RunnerConfig(fork_groups=True))
    # The setting reaches the runner through [rollout]; with command admission the provider still forks.
    runner = build_runner(RolloutConfig(fork_groups=True, host_capacity=2), provider, agent=OracleAgent())
    assert runner.config.fork_groups
    assert EvalConfig("builtin", samples=4, fork_groups=True).rollout().fork_groups  # sandrl eval --fork-groups
    not_a_forker: SandboxProvider = RecordingProvider(provider)
    with pytest.raises(ConfigError, match="set fork_groups = false"):
        build_runner(RolloutConfig(fork_groups=True), not_a_forker, agent=OracleAgent())


async def test_bench_rollout_fork_groups_small() -> None:
    result = await bench_fork_groups(
        1, 3, 3, wait_s=0.5, rounds=1000, data_mb=1, think_s=(0.0, 0.05), console=Console(file=io.StringIO())
    )
    assert result["valid"], result
    per, forked = result["per_episode_setup"], result["fork_groups"]
    assert (per["setups"], forked["setups"]) == (3, 1)
    assert per["setup_s_p50"] >= 0.5 and forked["setup_s_p50"] >= 0.5 and forked["episode_total_s_p50"] < 0.5 + 5
    assert result["speedup"] > 0
