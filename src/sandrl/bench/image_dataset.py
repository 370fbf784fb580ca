"""``sandrl bench images --dataset``: a dataset's images fetched ahead of its episodes, against
each image pulled when its first episode starts (as sandrl did before), in one run.

A real registry (Debian's ``docker-registry``) on loopback holds ``images`` images, each a runnable
base that all share (a shell made from this host's binaries) and a layer of its own of ``image_mb``
MB; ``tasks`` Harbor tasks name them (task ``i`` the image ``i mod images``), each solved and
verified by the oracle in a real sandbox, its solution first sleeping ``think_s`` (what a model's
turns take: time in which this host's CPUs and network are free). The tasks run as the training
loop draws them (a seeded shuffle, ``groups_per_step`` groups a step, each step waiting for all
its episodes), twice, each time from an empty image store:

- **loop**: no prefetch; an image is fetched when the first episode that needs it asks for it;
- **prefetch**: the same loop, with :func:`~sandrl.rollout.prefetch.images_ahead` started with it
  (the tasks in the loop's order, ``jobs`` at a time): what ``sandrl eval`` does, and ``sandrl
  train`` once wired.

Measured from the loop's start: when every image is in the store (``all_images_ready_s``); the
first episode's wait for its image (``first_episode_wait_s``); how long the steps waited for images
(``image_stall_s``: per step, from its start until its last group had its image); each group's
wait for its image; and ``behind_other_images``: the groups whose image's fetch had not started
when they asked for it (they queued behind other tasks' images). Targets: with the prefetch,
every image ready sooner than in the loop, and no group behind another task's image.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.errors import ConfigError
from sandrl.fetch_limits import PREFETCH_JOBS
from sandrl.images.host_rootfs import shell_layer
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import ImageConfig
from sandrl.images.oci_layout import LayerSpec, OCILayout, synthetic_entries
from sandrl.rollout.agents.scripted import OracleAgent
from sandrl.rollout.images import TaskImages, image_key
from sandrl.rollout.prefetch import images_ahead
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring.config import RolloutConfig
from sandrl.wiring.runner import build_runner, local_provider

TARGETS = {"prefetch_all_ready_over_loop": 1.0, "behind_other_images": 0}
FILE_KIB = 64
"""The size of each file of an image's own layer."""


@dataclass(frozen=True)
class DatasetSettings:
    tasks: int = 50
    images: int = 10
    image_mb: int = 16
    """The size of each image's own layer (half random, half text: ~2:1 gzip)."""
    groups_per_step: int = 5
    concurrency: int = 8
    jobs: int = PREFETCH_JOBS
    think_s: float = 1.0
    """Each episode's solution sleeps this long first: the model's time, which a prefetch fills."""
    seed: int = 0

    def check(self) -> None:
        if min(self.tasks, self.images, self.image_mb, self.groups_per_step, self.concurrency, self.jobs) < 1:
            raise ConfigError("--tasks, --images, --image-mb, --groups-per-step, --concurrency and --jobs must be >= 1")
        if not 0 <= self.think_s <= 600:
            raise ConfigError(f"--think-s is 0 to 600 seconds, not {self.think_s}")
        if self.images > self.tasks:
            raise ConfigError(f"{self.images} images need at least as many tasks, not {self.tasks}")


QUICK = DatasetSettings(tasks=6, images=3, image_mb=1, groups_per_step=2, concurrency=4, jobs=2, think_s=0.2)


@dataclass(frozen=True)
class GroupWait:
    task: str
    step: int
    asked_s: float
    ready_s: float
    behind: bool
    """Its image's fetch had not started when it asked, and then waited for other images' fetches."""


class _Timed:
    """The runner's ``image_for``: ``images``, with when each group asked and had its image."""

    def __init__(self, images: TaskImages, start: float) -> None:
        self.images = images
        self.start = start
        self.step = 0
        self.waits: list[GroupWait] = []

    async def __call__(self, task: Task) -> str:
        asked = time.monotonic() - self.start
        before = self.images.known(task.image_source())
        pending = before is None or before.started_s is None
        name = await self.images(task)
        ready = time.monotonic() - self.start
        fetch = self.images.known(task.image_source())
        behind = pending and fetch is not None and fetch.queued
        self.waits.append(GroupWait(task.id, self.step, asked, ready, behind))
        return name


def _write_dataset(root: Path, registry: LocalRegistry, settings: DatasetSettings) -> list[str]:
    """Push the images and write the tasks; the images' references."""
    files = max(1, (settings.image_mb << 10) // FILE_KIB)
    refs = []
    for n in range(settings.images):
        layout = OCILayout(root / "layouts" / f"img{n}")
        own = LayerSpec(synthetic_entries(n, files, FILE_KIB << 10, seed=settings.seed))
        layout.add_image([shell_layer(root / "shell-rootfs"), own], ImageConfig(env={"PATH": "/usr/bin:/bin"}), tag="1")
        registry.push(layout.root, f"bench/img{n}", tag="1")
        shutil.rmtree(layout.root)
        refs.append(f"{registry.host}/bench/img{n}:1")
    for i in range(settings.tasks):
        _write_task(root / "tasks" / f"task-{i:03d}", refs[i % settings.images], settings.think_s)
    return refs


def _write_task(task: Path, image: str, think_s: float) -> None:
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        f'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[environment]\ndocker_image = "{image}"\n'
    )
    (task / "instruction.md").write_text("Write done to /answer.\n")
    (task / "solution" / "solve.sh").write_text(f"#!/bin/sh\nsleep {think_s:g}\necho done > /answer\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/sh\nif [ "$(cat /answer)" = done ]; then r=1; else r=0; fi\n'
        "mkdir -p /logs/verifier && echo $r > /logs/verifier/reward.txt\n"
    )


async def _loop(
    provider: BwrapProvider, tasks: list[Task], settings: DatasetSettings, *, prefetch: bool
) -> dict[str, Any]:
    """The tasks in steps, as the training loop runs them; with or without the prefetch."""
    rollout = RolloutConfig(concurrency=settings.concurrency, group_size=1, max_attempts=1, max_turns=1)
    steps = [tasks[i : i + settings.groups_per_step] for i in range(0, len(tasks), settings.groups_per_step)]
    start = time.monotonic()
    passed = 0
    step_starts: list[float] = []
    if prefetch:
        async with images_ahead(provider, tasks, episode_jobs=settings.concurrency, jobs=settings.jobs) as ahead:
            timed = _Timed(ahead.images, start)
            runner = build_runner(rollout, provider, agent=OracleAgent(), image_for=timed)
            for n, step in enumerate(steps):
                timed.step = n
                step_starts.append(time.monotonic() - start)
                passed += sum(bool(t.passed) for t in (await runner.run(step)).trajectories)
            images = ahead.images
    else:
        images = TaskImages(provider)
        timed = _Timed(images, start)
        runner = build_runner(rollout, provider, agent=OracleAgent(), image_for=timed)
        for n, step in enumerate(steps):
            timed.step = n
            step_starts.append(time.monotonic() - start)
            passed += sum(bool(t.passed) for t in (await runner.run(step)).trajectories)
    wall = time.monotonic() - start
    fetches = [images.known(s) for s in {image_key(t.image_source()): t.image_source() for t in tasks}.values()]
    ends = [f.ended_s - start for f in fetches if f is not None and f.ended_s is not None]
    if len(ends) != len(fetches):
        raise ConfigError("the benchmark's images were not all fetched: see the episodes' errors")
    stall = [
        max(w.ready_s for w in timed.waits if w.step == n) - step_starts[n]
        for n in range(len(steps))
        if any(w.step == n for w in timed.waits)
    ]
    waits = [w.ready_s - w.asked_s for w in timed.waits]
    return {
        "wall_s": round(wall, 3),
        "all_images_ready_s": round(max(ends), 3),
        "first_episode_wait_s": round(min(w.ready_s for w in timed.waits), 3),
        "image_stall_s": round(sum(stall), 3),
        "group_image_wait_s": {
            "p50": round(statistics.median(waits), 3),
            "max": round(max(waits), 3),
        },
        "behind_other_images": sum(w.behind for w in timed.waits),
        "passed": passed,
        "episodes": len(tasks),
    }


async def run(settings: DatasetSettings, *, console: Console | None = None) -> dict[str, Any]:
    settings.check()
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            raise ConfigError(f"`sandrl bench images --dataset` needs {tool}: apt-get install {tool}")
    say = console.print if console is not None else (lambda *a, **k: None)
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-dataset-") as tmp:
        work = Path(tmp)
        with LocalRegistry(work / "registry") as registry:
            say(f"pushing {settings.images} images ({settings.image_mb} MB of their own each, a shell shared)")
            _write_dataset(work, registry, settings)
            loaded, problems = load_tasks(work / "tasks")
            if problems:
                raise ConfigError(f"the benchmark's tasks did not load: {problems[0].problem}")
            tasks = sorted(loaded, key=lambda t: t.id)
            random.Random(settings.seed).shuffle(tasks)  # as the training loop draws them
            arms: dict[str, dict[str, Any]] = {}
            for arm in ("loop", "prefetch"):
                say(f"{arm}: {settings.tasks} tasks from an empty store, {settings.groups_per_step} groups a step")
                provider = local_provider(work / f"state-{arm}")
                try:
                    arms[arm] = await _loop(provider, tasks, settings, prefetch=arm == "prefetch")
                finally:
                    await provider.close_all()
    loop, ahead = arms["loop"], arms["prefetch"]
    ratio = ahead["all_images_ready_s"] / loop["all_images_ready_s"]
    return {
        "bench": "images-dataset",
        "dataset": {
            "tasks": settings.tasks,
            "images": settings.images,
            "image_mb": settings.image_mb,
            "groups_per_step": settings.groups_per_step,
            "concurrency": settings.concurrency,
            "jobs": settings.jobs,
            "think_s": settings.think_s,
        },
        "loop": loop,
        "prefetch": ahead,
        "prefetch_all_ready_over_loop": round(ratio, 3),
        "targets": TARGETS,
        "met": {
            "prefetch_all_ready_over_loop": ratio < TARGETS["prefetch_all_ready_over_loop"],
            "behind_other_images": ahead["behind_other_images"] == TARGETS["behind_other_images"],
        },
    }


def render_card(result: dict[str, Any]) -> Table:
    d = result["dataset"]
    table = Table(
        title=(
            f"{d['tasks']} tasks, {d['images']} images of {d['image_mb']} MB: "
            f"{d['groups_per_step']} groups a step, episodes of {d['think_s']:g} s, {d['jobs']} ahead at a time"
        )
    )
    for column in (
        "",
        "all images ready s",
        "first episode wait s",
        "steps waiting s",
        "wait max s",
        "behind",
        "wall s",
    ):
        table.add_column(column, justify="right")
    for arm in ("loop", "prefetch"):
        m = result[arm]
        table.add_row(
            "in the loop" if arm == "loop" else "ahead",
            f"{m['all_images_ready_s']:.2f}",
            f"{m['first_episode_wait_s']:.2f}",
            f"{m['image_stall_s']:.2f}",
            f"{m['group_image_wait_s']['max']:.2f}",
            str(m["behind_other_images"]),
            f"{m['wall_s']:.2f}",
        )
    met = result["met"]
    table.caption = (
        f"all images ready in {result['prefetch_all_ready_over_loop']:.2f}x the loop's time "
        f"({'met' if met['prefetch_all_ready_over_loop'] else 'NOT met'}); groups behind another task's image: "
        f"{result['prefetch']['behind_other_images']} ({'met' if met['behind_other_images'] else 'NOT met'})"
    )
    return table
