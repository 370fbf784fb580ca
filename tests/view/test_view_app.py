"""The viewer's app over real HTTP: the overview, the episode list and its filters, one episode, and
what it refuses (another Host, a file that is not a listed report, a status it does not know)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandrl.background_server import BackgroundServer
from sandrl.errors import ConfigError
from sandrl.rollout.trajectory import EpisodeError, Trajectory
from sandrl.view.app import create_app
from sandrl.view.run_files import RunFiles
from sandrl.view.run_view import RunView

from .runs import trajectory, write_run

METRICS = [
    {
        "step": 1,
        "mode": "sync",
        "data_position": 2,
        "reward_mean": 0.5,
        "pass_rate": 0.5,
        "total_episodes": 4,
        "step_s": 10.0,
        "train/loss": float("nan"),
        "train/kl_mean": 0.01,
    },
    {
        "step": 2,
        "mode": "sync",
        "data_position": 4,
        "reward_mean": 0.75,
        "pass_rate": 0.75,
        "total_episodes": 8,
        "step_s": 8.0,
        "train/loss": 0.2,
        "train/kl_mean": 0.02,
    },
]


def episodes() -> list[Trajectory]:
    error = EpisodeError("infra", "sandbox_create", "create_failed", "no room", True)
    out = []
    for group in range(4):
        for sample in range(2):
            passed = (group + sample) % 2 == 0
            out.append(trajectory(group, sample, task=f"task-{group % 2}", passed=passed))
    out.append(
        trajectory(
            4,
            0,
            status="infra_error",
            reward=None,
            passed=None,
            error=error,
            ids=[],
            loss_mask=[],
            logprobs=[],
            turns=[],
            task_set="other",
        )
    )
    return out


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, RunView]]:
    run = write_run(tmp_path / "run", episodes(), METRICS)
    (run / "bench").mkdir()
    (run / "bench" / "report.html").write_text("<p>a report</p>")
    (tmp_path / "secret.txt").write_text("not for the page")
    view = RunView(RunFiles.open(run))
    with BackgroundServer(create_app(view)) as server:
        yield server.url, view


def test_the_overview_has_the_curves_the_tasks_and_the_statuses(served: tuple[str, RunView]) -> None:
    url, _ = served
    summary = httpx.get(f"{url}/api/summary").json()
    assert summary["run"]["kind"] == "train" and summary["run"]["steps"] == 2 and summary["run"]["episodes"] == 9
    series = summary["curves"]["series"]
    assert series["reward_mean"] == [0.5, 0.75]
    assert series["train/loss"] == [None, 0.2]  # a NaN is no point, and the JSON stays valid
    assert series["episodes_per_hour"] == [4 / 10 * 3600, 4 / 8 * 3600]
    assert "time/model_s" in series
    assert summary["statuses"] == {"passed": 4, "failed": 4, "truncated": 0, "agent_error": 0, "infra_error": 1}
    tasks = {t["name"]: t for t in summary["tasks"]}
    assert tasks["task-0"]["episodes"] == 4 and tasks["task-0"]["pass_rate"] == 0.5
    assert tasks["task-0"]["over_steps"] == [[1, 1, 0.5], [2, 2, 0.5]]
    sources = {s["name"]: s for s in summary["sources"]}
    assert sources["other"]["infra_errors"] == 1 and sources["family"]["episodes"] == 8
    assert summary["reports"] == ["bench/report.html"]
    assert summary["filters"]["steps"] == [1, 2]
    titles = [p["title"] for p in summary["panels"]]
    assert "Pass rate by task source" not in titles  # one task set: no per-source charts


def test_a_run_that_mixes_sources_gets_a_chart_per_source_statistic(tmp_path: Path) -> None:
    metrics = [
        {**m, "source/a/pass_rate": 0.5 + i / 4, "source/b/pass_rate": 0.25, "source/a/share": 0.75}
        for i, m in enumerate(METRICS)
    ]
    view = RunView(RunFiles.open(write_run(tmp_path / "run", episodes(), metrics)))
    panels = {p["title"]: p["series"] for p in view.summary()["panels"]}
    assert panels["Pass rate by task source"] == ["source/a/pass_rate", "source/b/pass_rate"]
    assert panels["Share of the groups by task source"] == ["source/a/share"]
    assert view.summary()["curves"]["series"]["source/a/pass_rate"] == [0.5, 0.75]


def test_the_list_filters_by_step_task_source_and_status(served: tuple[str, RunView]) -> None:
    url, _ = served

    def numbers(**query: str) -> list[int]:
        return [r["n"] for r in httpx.get(f"{url}/api/episodes", params=query).json()["rows"]]

    assert numbers(step="2") == [4, 5, 6, 7]
    assert numbers(task="task-1") == [2, 3, 6, 7]
    assert numbers(status="passed", step="1") == [0, 3]
    assert numbers(status="infra_error") == [8] and numbers(source="other") == [8]
    page = httpx.get(f"{url}/api/episodes", params={"offset": 3, "limit": 2}).json()
    assert page["total"] == 9 and [r["n"] for r in page["rows"]] == [3, 4]
    bad = httpx.get(f"{url}/api/episodes", params={"status": "bogus"})
    assert bad.status_code == 400 and "passed" in bad.json()["error"]


def test_an_episode_is_its_turns_decoded_with_its_group(served: tuple[str, RunView]) -> None:
    url, _ = served
    episode = httpx.get(f"{url}/api/episode/2").json()
    assert episode["decoded"] and episode["prompt"].endswith("task<|im_start|>")
    (turn,) = episode["turns"]
    assert turn["reply"] == "reply<|im_end|>" and turn["output"] == "out" and turn["command"] == "echo out"
    assert [g["n"] for g in episode["group"]] == [2, 3] and episode["step"] == 1
    assert episode["engine_moves"] == 0
    rows = episode["tokens"]["parts"][0]["rows"]
    assert [r[1] for r in rows] == [0] * 7 + [1] * 6 + [0] * 3 and rows[7][3] == -0.5
    assert httpx.get(f"{url}/api/episode/99").status_code == 404


def test_the_page_answers_only_its_loopback_host_and_serves_only_listed_reports(served: tuple[str, RunView]) -> None:
    url, _ = served
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert "unsafe-inline" not in page.headers["content-security-policy"]
    assert httpx.get(f"{url}/", headers={"Host": "evil.example:80"}).status_code == 403
    report = httpx.get(f"{url}/reports/bench/report.html")
    assert report.status_code == 200 and report.headers["content-security-policy"].startswith("sandbox")
    for name in ("../secret.txt", "config.toml", "rollouts.jsonl", "%2e%2e/secret.txt"):
        assert httpx.get(f"{url}/reports/{name}").status_code == 404


def test_a_live_run_is_read_as_it_grows(served: tuple[str, RunView], monkeypatch: pytest.MonkeyPatch) -> None:
    url, view = served
    monkeypatch.setattr("sandrl.view.run_view.REFRESH_EVERY_S", 0.0)
    assert httpx.get(f"{url}/api/summary").json()["run"]["episodes"] == 9
    from sandrl.rollout.jsonl import dumps

    with (view.run.directory / "rollouts.jsonl").open("a") as file:
        file.write(dumps(trajectory(5, 0)) + "\n")
    with (view.run.directory / "metrics.jsonl").open("a") as file:
        file.write('{"step": 3, "data_position": 6, "reward_mean": 1.0}\n{"step": 4, "dat')
    time.sleep(0.01)
    summary = httpx.get(f"{url}/api/summary").json()
    assert summary["run"]["episodes"] == 10 and summary["curves"]["steps"] == [1, 2, 3]


def test_a_directory_that_is_not_a_run_is_refused_with_what_a_run_holds(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        RunFiles.open(tmp_path / "missing")
    write_run(tmp_path / "runs" / "first", episodes()[:1], METRICS)
    with pytest.raises(ConfigError, match=r"not a run directory.*runs/first"):
        RunFiles.open(tmp_path)
