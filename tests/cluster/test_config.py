"""The [cluster] section, the episode ledger and the concurrency split: pure, no Ray, no sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.cluster.config import load_cluster_run
from sandrl.cluster.images import trivial_host_dockerfile
from sandrl.cluster.ledger import EpisodeLedger
from sandrl.cluster.worker import concurrency_shares
from sandrl.errors import ClusterError, ConfigError
from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory

BASE = """
[run]
output_dir = "runs/c"
[tasks]
family = "echo"
count = 4
"""


def test_the_cluster_section_loads_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        BASE
        + """
[cluster]
workers = 3
inference = ["http://10.0.0.5:30000"]
[[cluster.hosts]]
url = "http://10.0.0.2:8700"
capacity = 4
token_file = "tok"
[[cluster.hosts]]
url = "http://10.0.0.3:8700"
name = "b"
capacity_file = "b.json"
"""
    )
    run, cluster = load_cluster_run(path)
    assert run.tasks.family == "echo" and cluster.options.workers == 3
    assert [h.name for h in cluster.hosts] == ["10.0.0.2:8700", "b"]
    assert cluster.hosts[0].token_file == str(tmp_path / "tok")
    assert cluster.hosts[1].capacity_file == str(tmp_path / "b.json")
    assert cluster.endpoints(run) == ("http://10.0.0.5:30000",)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("", "--ray needs a \\[cluster\\] section"),
        ("[cluster]\nworkers = 2\n", "at least one \\[\\[cluster.hosts\\]\\]"),
        ("[cluster]\nworkers = 0\n[[cluster.hosts]]\nurl = 'http://h:1'\n", "workers must be >= 1"),
        ("[cluster]\nnodes = 2\n[[cluster.hosts]]\nurl = 'http://h:1'\n", "unknown key\\(s\\) nodes"),
        ("[cluster]\n[[cluster.hosts]]\nurl = 'h:1'\n", "http\\(s\\)://HOST:PORT"),
        ("[cluster]\ninference = 3\n[[cluster.hosts]]\nurl = 'http://h:1'\n", "inference must be a list of URLs"),
    ],
)
def test_a_bad_cluster_section_is_a_config_error_naming_the_fix(tmp_path: Path, section: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + section)
    with pytest.raises(ConfigError, match=message):
        load_cluster_run(path)


def test_an_embedded_policy_cannot_be_shared_by_workers(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + "[cluster]\n[[cluster.hosts]]\nurl = 'http://h:1'\n")
    run, cluster = load_cluster_run(path)
    with pytest.raises(ConfigError, match="sandrl serve inference"):
        cluster.endpoints(run)


def test_concurrency_is_split_over_the_workers() -> None:
    assert concurrency_shares(8, 3) == [3, 3, 2]
    assert concurrency_shares(2, 4) == [1, 1, 1, 1]


def _group(gid: str, n: int) -> Group:
    return Group(gid, "t", [Trajectory(f"{gid}/{i}", gid, "t", i, "x", "completed") for i in range(n)])


def test_the_ledger_hands_out_every_episode_once() -> None:
    ledger = EpisodeLedger()
    ledger.issue("run/t#0", 2)
    assert ledger.reissue("run/t#0") == 1
    ledger.deliver(_group("run/t#0", 2))
    assert ledger.to_dict() == {
        "groups_issued": 1,
        "episodes_issued": 2,
        "episodes_delivered": 2,
        "groups_reissued": 1,
        "reissues": 1,
    }
    with pytest.raises(ClusterError, match="delivered twice"):
        ledger.deliver(_group("run/t#0", 2))
    with pytest.raises(ClusterError, match="already issued"):
        ledger.issue("run/t#0", 2)
    with pytest.raises(ClusterError, match="without being issued"):
        ledger.deliver(_group("run/t#9", 2))


def test_only_a_from_host_dockerfile_runs_on_any_host() -> None:
    assert trivial_host_dockerfile("FROM host\nWORKDIR /workspace\n")
    assert not trivial_host_dockerfile("FROM host\nRUN apt-get install -y jq\n")
    assert not trivial_host_dockerfile("FROM debian\n")


def test_several_model_urls_are_several_engines_behind_the_router(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    urls = "[model]\ninference = 'http://10.0.0.5:30000, http://10.0.0.6:30000'\n"
    path.write_text(BASE + urls + "[cluster]\n[[cluster.hosts]]\nurl = 'http://h:1'\n")
    run, cluster = load_cluster_run(path)
    assert cluster.endpoints(run) == ("http://10.0.0.5:30000", "http://10.0.0.6:30000")
