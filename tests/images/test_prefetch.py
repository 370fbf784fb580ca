"""Every task's image fetched ahead of the episodes (``sandrl images prefetch``, the background
prefetch of ``sandrl eval``), through a real loopback registry behind the fault proxy, which
stalls each manifest so that what is in flight at once can be measured from its request log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.rollout.prefetch
import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.images.host_rootfs import shell_layer
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import ImageConfig
from sandrl.images.oci_layout import LayerSpec, regular_file
from sandrl.rollout.images import TaskImages
from sandrl.rollout.prefetch import images_ahead, prefetch_images
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring.evaluate import EvalConfig, evaluate
from sandrl.wiring.suite import run_suite

from ..support import REASON as SANDBOX_REASON
from .conftest import PushImage, needs_registry
from .fault_proxy import FaultProxy

pytestmark = [needs_registry, pytest.mark.skipif(SANDBOX_REASON is not None, reason=SANDBOX_REASON or "")]

STALL_S = 0.4
"""Each manifest answer waits this long: a pull lasts at least that, so pulls at once overlap."""


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No mirrors or credentials of this host's; the CLI's store under this test's own state directory."""
    state = tmp_path / "state"
    monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state)
    monkeypatch.setenv("SANDRL_REGISTRY_MIRRORS", "")
    monkeypatch.setenv("SANDRL_REGISTRIES_CONFIG", str(tmp_path / "registries.toml"))
    (tmp_path / "registries.toml").write_text("")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    return state


@pytest.fixture
def provider(isolated: Path) -> Iterator[BwrapProvider]:
    p = BwrapProvider(isolated)
    yield p
    p._close_all_sync()


def _task(root: Path, name: str, *, image: str | None = None, dockerfile: str | None = None) -> Path:
    """A Harbor task whose environment is ``image`` (a registry reference) or ``dockerfile``."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    environment = "[environment]\nbuild_timeout_sec = 120.0\n" + (f'docker_image = "{image}"\n' if image else "")
    (task / "task.toml").write_text(f'version = "1.0"\n\n[verifier]\ntimeout_sec = 30.0\n\n{environment}')
    (task / "instruction.md").write_text("Write done to /answer.\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\necho done > /answer\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/sh\nif [ "$(cat /answer)" = done ]; then r=1; else r=0; fi\n'
        "mkdir -p /logs/verifier && echo $r > /logs/verifier/reward.txt\n"
    )
    if dockerfile is not None:
        (task / "environment").mkdir()
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def _load(root: Path) -> list[Task]:
    tasks, problems = load_tasks(root)
    assert problems == []
    return sorted(tasks, key=lambda t: t.id)


def _images(push_image: PushImage, n: int) -> list[str]:
    """``n`` small distinct images pushed; their repositories."""
    return [push_image([LayerSpec([regular_file(f"etc/image-{i}", f"{i}\n" * 1000)])]).repository for i in range(n)]


def _pull_windows(proxy: FaultProxy) -> dict[str, tuple[float, float]]:
    """Per repository, from its first request to the end of its last: the span of its pull."""
    spans: dict[str, tuple[float, float]] = {}
    for r in proxy.requests:
        if not r.path.startswith("/v2/") or r.path == "/v2/":
            continue
        repo = r.path[len("/v2/") :].split("/manifests/")[0].split("/blobs/")[0]
        end = r.ended if r.ended is not None else float("inf")
        first, last = spans.get(repo, (r.started, end))
        spans[repo] = (min(first, r.started), max(last, end))
    return spans


def _most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _manifest_gets(proxy: FaultProxy, repo: str) -> int:
    return proxy.count("GET", f"^/v2/{repo}/manifests/")


async def test_prefetch_pulls_each_image_once_jobs_at_a_time_and_then_finds_them_cached(
    provider: BwrapProvider, push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    repos = _images(push_image, 5)
    for i in range(10):  # two tasks per image
        _task(tmp_path / "tasks", f"t{i}", image=f"{fault_proxy.host}/{repos[i % 5]}:1")
    tasks = _load(tmp_path / "tasks")
    fault_proxy.stall_next("/manifests/", seconds=STALL_S, times=100)
    report = await prefetch_images(TaskImages(provider), tasks, jobs=2)
    assert [r.outcome for r in report.rows] == ["pulled"] * 5, report
    assert all(len(r.tasks) == 2 and r.downloaded_bytes > 0 and r.ahead for r in report.rows)
    assert [_manifest_gets(fault_proxy, repo) for repo in repos] == [1] * 5
    assert _most_at_once(list(_pull_windows(fault_proxy).values())) == 2
    assert report.store_bytes is not None and report.store_bytes > 0
    fault_proxy.reset()
    again = await prefetch_images(TaskImages(provider), tasks, jobs=2)
    assert [r.outcome for r in again.rows] == ["cached"] * 5
    assert fault_proxy.requests == []  # nothing asked of the registry
    assert again.to_dict()["cached"] == 5


async def test_tasks_naming_one_image_pull_it_once_when_their_episodes_start_together(
    provider: BwrapProvider, push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """Without a prefetch too: an image is fetched once however many tasks name it."""
    (repo,) = _images(push_image, 1)
    for i in range(3):
        _task(tmp_path / "tasks", f"t{i}", image=f"{fault_proxy.host}/{repo}:1")
    tasks = _load(tmp_path / "tasks")
    fault_proxy.stall_next("/manifests/", seconds=STALL_S, times=10)
    images = TaskImages(provider)
    names = await asyncio.gather(*(images(task) for task in tasks))
    assert len(set(names)) == 1
    assert _manifest_gets(fault_proxy, repo) == 1


async def test_an_episode_waits_only_for_its_own_image(
    provider: BwrapProvider, push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """The prefetch fetches a, b, c one at a time; an episode of c, asking while a is fetched, starts
    c's fetch at once, and an episode of a waits for the prefetch's fetch of a: one fetch each."""
    repos = _images(push_image, 3)
    for i, repo in enumerate(repos):
        _task(tmp_path / "tasks", f"t{i}", image=f"{fault_proxy.host}/{repo}:1")
    tasks = _load(tmp_path / "tasks")
    fault_proxy.stall_next("/manifests/", seconds=STALL_S, times=10)
    async with images_ahead(provider, tasks, jobs=1) as prefetch:
        await asyncio.sleep(0.1)  # a's fetch is under way
        asked = asyncio.get_running_loop().time()
        await asyncio.gather(prefetch.images(tasks[2]), prefetch.images(tasks[0]))
        waited = asyncio.get_running_loop().time() - asked
        await prefetch.job
        report = prefetch.report()
    assert report is not None and [r.outcome for r in report.rows] == ["pulled"] * 3
    assert [r.ahead for r in report.rows] == [True, True, False]  # c: the episode's own fetch
    c = prefetch.images.known(tasks[2].image_source())
    assert c is not None and c.started_s is not None and c.started_s - c.asked_s < 0.05
    assert waited < 3 * STALL_S  # not behind a and b in turn
    assert [_manifest_gets(fault_proxy, repo) for repo in repos] == [1, 1, 1]


async def test_the_prefetch_fetches_only_with_what_the_episodes_leave(
    provider: BwrapProvider, push_image: PushImage, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """With ``jobs`` 1 and an episode's fetch of b running, a is fetched ahead only once b's ends."""
    repos = _images(push_image, 2)
    for i, repo in enumerate(repos):
        _task(tmp_path / "tasks", f"t{i}", image=f"{fault_proxy.host}/{repo}:1")
    tasks = _load(tmp_path / "tasks")
    fault_proxy.stall_next("/manifests/", seconds=STALL_S, times=10)
    images = TaskImages(provider)
    episode = asyncio.ensure_future(images(tasks[1]))
    await asyncio.sleep(0.05)
    report = await prefetch_images(images, tasks, jobs=1)
    await episode
    assert [(r.outcome, r.ahead) for r in report.rows] == [("pulled", True), ("pulled", False)]
    windows = _pull_windows(fault_proxy)
    assert windows[repos[0]][0] >= windows[repos[1]][1]


async def test_failures_are_listed_with_their_reason_and_the_rest_fetched(
    provider: BwrapProvider, push_image: PushImage, registry: LocalRegistry, tmp_path: Path
) -> None:
    (repo,) = _images(push_image, 1)
    root = tmp_path / "tasks"
    _task(root, "a-good", image=f"{registry.host}/{repo}:1")
    _task(root, "b-no-such-tag", image=f"{registry.host}/{repo}:nope")
    _task(root, "c-broken-build", dockerfile="FROM host\nRUN echo broken >&2; exit 3\n")
    _task(root, "d-built", dockerfile="FROM host\nRUN echo built > /built\n")
    _task(root, "e-host", image="host")
    tasks = _load(root)
    report = await prefetch_images(TaskImages(provider), tasks, jobs=3)
    outcomes = {r.tasks[0]: (r.outcome, r.reason or "") for r in report.rows}
    assert outcomes["a-good"] == ("pulled", "")
    assert outcomes["b-no-such-tag"][0] == "failed" and "MANIFEST_UNKNOWN" in outcomes["b-no-such-tag"][1]
    assert outcomes["c-broken-build"][0] == "failed" and "exit" in outcomes["c-broken-build"][1]
    assert outcomes["d-built"] == ("built", "") and outcomes["e-host"] == ("host", "")
    assert [r.tasks[0] for r in report.problems] == ["b-no-such-tag", "c-broken-build"]
    again = await prefetch_images(TaskImages(provider), tasks, jobs=3)
    assert [r.outcome for r in again.rows] == ["cached", "failed", "failed", "cached", "host"]


async def test_at_the_store_bound_the_rest_is_skipped_and_still_fetched_by_its_episodes(
    provider: BwrapProvider, push_image: PushImage, registry: LocalRegistry, tmp_path: Path
) -> None:
    repos = _images(push_image, 3)
    for i, repo in enumerate(repos):
        _task(tmp_path / "tasks", f"t{i}", image=f"{registry.host}/{repo}:1")
    tasks = _load(tmp_path / "tasks")
    images = TaskImages(provider)
    report = await prefetch_images(images, tasks, jobs=1, max_store_bytes=1)
    assert [r.outcome for r in report.rows] == ["pulled", "skipped", "skipped"]
    assert "bound" in (report.rows[1].reason or "") and report.store_bytes is not None and report.store_bytes > 1
    assert "skipped 2" in report.line()
    assert await images(tasks[2])  # an episode of a skipped image still gets it
    again = await prefetch_images(TaskImages(provider), tasks, jobs=1, max_store_bytes=1)
    assert [r.outcome for r in again.rows] == ["cached", "skipped", "cached"]  # what the store has is no cost


def test_the_command_reports_each_image_and_fails_on_a_failure(
    isolated: Path, push_image: PushImage, registry: LocalRegistry, tmp_path: Path
) -> None:
    (repo,) = _images(push_image, 1)
    _task(tmp_path / "tasks", "good", image=f"{registry.host}/{repo}:1")
    _task(tmp_path / "tasks", "gone", image=f"{registry.host}/{repo}:gone")
    result = CliRunner().invoke(app, ["images", "prefetch", str(tmp_path / "tasks"), "--jobs", "2"])
    assert result.exit_code == 1, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert (line["images"], line["pulled"], line["failed"], line["jobs"]) == (2, 1, 1, 2)
    assert line["problems"][0]["tasks"] == ["gone"] and "MANIFEST_UNKNOWN" in line["problems"][0]["reason"]
    assert "failed" in result.output and "gone" in result.output
    bad = CliRunner().invoke(app, ["images", "prefetch", str(tmp_path / "tasks"), "--jobs", "0"])
    assert bad.exit_code != 0 and "--jobs must be at least 1" in str(bad.exception)


async def test_an_episode_after_the_prefetch_does_not_pull(
    provider: BwrapProvider, push_image: PushImage, fault_proxy: FaultProxy, rootfs: Path, tmp_path: Path
) -> None:
    pushed = push_image([shell_layer(rootfs)], ImageConfig(env={"PATH": "/usr/bin:/bin"}))
    _task(tmp_path / "tasks", "runs", image=pushed.ref_via(fault_proxy.host))
    tasks = _load(tmp_path / "tasks")
    report = await prefetch_images(TaskImages(provider), tasks)
    assert report.count("pulled") == 1
    fault_proxy.reset()
    runs = await run_suite(tasks, "oracle", provider, concurrency=1)
    assert runs[0].reward == 1.0, runs[0]
    assert fault_proxy.requests == []


async def test_eval_fetches_images_a_bounded_number_at_once_in_the_tasks_order(
    provider: BwrapProvider,
    push_image: PushImage,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sandrl eval`` before: every task's image at once. Now: as many as episodes run at once
    (``--concurrency``), in the tasks' order, and ahead only what they leave room for."""
    monkeypatch.setattr(sandrl.rollout.prefetch, "PREFETCH_JOBS", 1)
    repos = _images(push_image, 4)
    for i, repo in enumerate(repos):
        _task(tmp_path / "tasks", f"t{i}", image=f"{fault_proxy.host}/{repo}:1")
    fault_proxy.stall_next("/manifests/", seconds=STALL_S, times=100)
    config = EvalConfig(
        tasks=str(tmp_path / "tasks"), agent="null", concurrency=2, max_attempts=1, results_dir=tmp_path / "results"
    )
    await evaluate(config, provider=provider, progress=False)
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert (results["images"]["images"], results["images"]["pulled"], results["images"]["jobs"]) == (4, 4, 1)
    assert [_manifest_gets(fault_proxy, repo) for repo in repos] == [1] * 4
    windows = _pull_windows(fault_proxy)
    assert _most_at_once(list(windows.values())) == 2
    assert sorted(windows, key=lambda repo: windows[repo][0]) == repos
