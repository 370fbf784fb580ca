"""The ``[cluster]`` section of a run config: what ``sandrl train CONFIG --ray ...`` adds to one machine's run.

.. code-block:: toml

    [cluster]
    workers = 2                 # rollout worker actors; [rollout] concurrency is split among them
    inference = ["http://10.0.0.5:30000"]   # the policy's servers; default: [model] inference
    max_restarts = 3            # Ray restarts a dead rollout worker this often
    max_reissues = 3            # a group whose worker died is re-issued this often

    [[cluster.hosts]]           # one table per sandbox host (`sandrl serve sandboxes`)
    url = "http://10.0.0.2:8700"
    token_file = "/etc/sandrl.token"
    capacity = 16               # busy sandboxes within the latency bar ...

    [[cluster.hosts]]
    url = "http://10.0.0.3:8700"
    token_file = "/etc/sandrl.token"
    capacity_file = "bench/host-b.json"   # ... or a `sandrl bench contention --out` result

The rest of the file is the ordinary run config (:mod:`sandrl.train.run_config`). Relative paths
are relative to the file. Capacity files are read where the command runs; token files where each
rollout worker runs (the same path on every node), or ``$SANDRL_TOKEN`` there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandrl.cluster.hosts import HostConfig
from sandrl.errors import ConfigError
from sandrl.toml_config import from_mapping, read_toml, type_name
from sandrl.train.overrides import apply_overrides
from sandrl.train.run_config import SECTION_TYPES, RunConfig, dumps, from_dict


@dataclass(frozen=True)
class ClusterOptions:
    """The scalar settings of ``[cluster]``."""

    workers: int = 2
    """Rollout worker actors; each runs a RolloutRunner with its share of ``[rollout] concurrency``."""
    worker_cpus: float = 0.5
    """Ray CPUs reserved per rollout worker (it waits on sandboxes and the model, it computes little)."""
    trainer_cpus: float = 1.0
    """Ray CPUs reserved for the trainer actor (for each rank, with several ``[train] processes``)."""
    trainer_gpus: float = 0.0
    """Ray GPUs for the trainer actor, or for each rank (0: CPU training; 1 with several processes on GPUs)."""
    engine_cpus: float = 1.0
    """Ray CPUs reserved per inference engine actor (``[inference] launch`` under ``--ray``), beside its
    ``gpus_per_engine`` GPUs (:mod:`sandrl.cluster.engines`)."""
    trainer_threads: int = 0
    """Torch threads of the trainer actor; 0: torch's default (every core of its node)."""
    max_restarts: int = 3
    """Times Ray restarts a rollout worker that died."""
    max_reissues: int = 3
    """Times one group is re-issued after the worker running it died; beyond it the run fails."""
    health_interval_s: float = 5.0
    """Seconds between health checks of each sandbox host."""
    worker_wait_s: float = 120.0
    """How long an actor may take to start (the cluster must have its resources) or a dead worker to be
    restarted, before the run fails."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        for name in ("worker_cpus", "trainer_cpus", "trainer_gpus", "engine_cpus"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value!r}")
        for name in ("max_restarts", "max_reissues", "trainer_threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.health_interval_s <= 0 or self.worker_wait_s <= 0:
            raise ConfigError("health_interval_s and worker_wait_s must be positive")


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: sandbox hosts, inference endpoints, rollout workers; see the module docstring."""

    hosts: tuple[HostConfig, ...]
    inference: tuple[str, ...] = ()
    """Engines started elsewhere (SGLang's routes), behind the router the driver serves; empty: ``[model]
    inference`` of the run config, or none with ``[inference] launch`` (engines started as Ray actors)."""
    options: ClusterOptions = field(default_factory=ClusterOptions)

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ConfigError("[cluster] needs at least one [[cluster.hosts]] table with the url of a sandbox host")
        for url in self.inference:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"[cluster] inference holds URLs of inference servers, got {url!r}")

    def endpoints(self, run: RunConfig) -> tuple[str, ...]:
        """The URLs of the engines started elsewhere that the run's router fronts (:mod:`sandrl.cluster.engines`)."""
        if self.inference:
            return self.inference
        urls = run.model.urls  # one, or several joined by commas
        if urls and all(u.startswith(("http://", "https://")) for u in urls):
            return urls
        raise ConfigError(
            "with --ray the policy is served by inference servers: set [inference] launch (sandrl starts them as "
            "Ray actors), or [cluster] inference = [URL, ...] "
            "(or [model] inference = URL); start each with `sandrl serve inference --model NAME --host 0.0.0.0 "
            "--token-file FILE` and name the same token in [model] token_file"
        )

    def resolved(self) -> ClusterConfig:
        """Capacities read from their result files (done where the run starts)."""
        return dataclasses.replace(self, hosts=tuple(h.resolved() for h in self.hosts))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dataclasses.asdict(self.options)
        out["inference"] = list(self.inference)
        return out


def cluster_from_dict(table: object, *, where: str = "[cluster]", base: Path | None = None) -> ClusterConfig:
    """A :class:`ClusterConfig` from the parsed ``[cluster]`` table."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {type_name(table)}")
    rest = dict(table)
    hosts_raw = rest.pop("hosts", [])
    inference_raw = rest.pop("inference", [])
    if not isinstance(hosts_raw, list) or not all(isinstance(h, Mapping) for h in hosts_raw):
        raise ConfigError(f"{where} hosts must be [[cluster.hosts]] tables (url = ..., capacity = ...)")
    if isinstance(inference_raw, str):
        inference_raw = [inference_raw]
    if not isinstance(inference_raw, list) or not all(isinstance(u, str) for u in inference_raw):
        raise ConfigError(f"{where} inference must be a list of URLs, got {type_name(inference_raw)}")
    hosts = []
    for i, raw in enumerate(hosts_raw):
        host = from_mapping(HostConfig, raw, where=f"{where[:-1]}.hosts] #{i + 1}")
        if base is not None:
            host = dataclasses.replace(
                host,
                capacity_file=_absolute(host.capacity_file, base),
                token_file=_absolute(host.token_file, base),
            )
        hosts.append(host)
    options = from_mapping(ClusterOptions, rest, where=where)
    return ClusterConfig(tuple(hosts), tuple(inference_raw), options)


def _absolute(path: str, base: Path) -> str:
    return str(base / path) if path and not Path(path).is_absolute() else path


def load_cluster_run(path: str | Path, overrides: Sequence[str] = ()) -> tuple[RunConfig, ClusterConfig]:
    """The run config (``--set`` ``overrides`` applied) and the ``[cluster]`` section of the file at ``path``."""
    file = Path(path)
    data = read_toml(file)
    if "cluster" not in data:
        raise ConfigError(
            f"{file}: --ray needs a [cluster] section with a [[cluster.hosts]] table per sandbox host "
            "(url, capacity or capacity_file) and the inference URLs; see the README's 'Running a cluster'"
        )
    table = data.pop("cluster")
    base = file.resolve().parent
    run = from_dict(apply_overrides(data, overrides, SECTION_TYPES), where=str(file), base=base)
    cluster = cluster_from_dict(table, where=f"{file}: [cluster]", base=base)
    return run, cluster


def save_cluster(cluster: ClusterConfig, out: Path) -> Path:
    """The resolved ``[cluster]`` section beside the run's ``config.toml`` (tokens never written)."""
    target = out / "cluster.toml"
    hosts = [
        {"name": h.name, "url": h.url, "capacity": h.capacity or 0.0, "token_file": h.token_file} for h in cluster.hosts
    ]
    body = dumps({"cluster": cluster.to_dict()})
    for host in hosts:
        body += "\n[[cluster.hosts]]\n" + dumps(host)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("# The resolved [cluster] section of this run, written by sandrl train --ray.\n" + body)
    return target
