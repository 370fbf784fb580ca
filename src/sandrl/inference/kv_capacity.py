"""An engine's load and KV room, as engines report it: :class:`KVCapacity`, read from SGLang's or vLLM's routes.

What each engine answers (read in their sources; sandrl's server answers SGLang's shape):

- **SGLang** ``GET /v1/loads`` (``entrypoints/v1_loads.py``): ``{"loads": [{"dp_rank", "num_running_reqs",
  "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "token_usage", "max_running_requests",
  ...}, ...]}``, one entry per data-parallel rank. Older SGLang has only ``/get_load`` (requests and used
  tokens, no capacity) and reports nothing here. sandrl's fleet router answers ``/v1/loads`` with one entry
  per live engine (:mod:`sandrl.inference.fleet.proxy`).
- **vLLM** ``GET /metrics`` (Prometheus text): the gauges ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction, despite its name; older
  vLLM: ``vllm:gpu_cache_usage_perc``) and ``vllm:cache_config_info``, whose labels ``num_gpu_blocks`` x
  ``block_size`` give the KV pool in tokens. vLLM has no ``/v1/loads``.

:class:`CapacityProbe` tries ``/v1/loads``, then ``/metrics``, keeps the route that answered with a reading,
and says "reports nothing" (None) for good once neither does: a plain OpenAI-compatible server, an SGLang
without ``/v1/loads``. What an engine sends is bounded and checked (counts are non-negative integers, at most
:data:`MAX_ENTRIES` entries, :data:`MAX_BODY_CHARS` of text): a bad answer is a reading of nothing, not a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sandrl.errors import InferenceError

LOADS_ROUTE = "/v1/loads"
METRICS_ROUTE = "/metrics"
MAX_ENTRIES = 4096
"""Most per-rank entries (or Prometheus samples of one gauge) read from one answer."""
MAX_BODY_CHARS = 8 * 2**20
"""Longest answer read (vLLM's ``/metrics`` with its histograms is a few hundred KiB)."""
_VLLM_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class KVCapacity:
    """One reading of an engine's (or a fleet's, summed) load and KV room."""

    running: int
    """Requests being decoded."""
    queued: int
    """Requests waiting for a batch slot or for KV room (retracted ones included)."""
    used_tokens: int | None = None
    """KV tokens the running requests hold; None: not reported."""
    total_tokens: int | None = None
    """The KV pool in tokens (SGLang's ``max_total_num_tokens``); None: not reported (no token bound is known)."""
    max_running: int | None = None
    """Most requests decoded at once (SGLang's ``max_running_requests``); None: not reported."""
    engines: int = 1
    """How many engines (or data-parallel ranks) the reading sums."""

    @property
    def free_tokens(self) -> int | None:
        if self.total_tokens is None:
            return None
        return max(0, self.total_tokens - (self.used_tokens or 0))

    @classmethod
    def summed(cls, parts: Sequence[KVCapacity]) -> KVCapacity | None:
        """The readings of several engines as one (a bound is known only if every engine has one)."""
        if not parts:
            return None

        def total(values: Iterable[int | None]) -> int | None:
            known = list(values)
            return None if any(v is None for v in known) else sum(v for v in known if v is not None)

        return cls(
            running=sum(p.running for p in parts),
            queued=sum(p.queued for p in parts),
            used_tokens=total(p.used_tokens for p in parts),
            total_tokens=total(p.total_tokens for p in parts),
            max_running=total(p.max_running for p in parts),
            engines=sum(p.engines for p in parts),
        )

    def to_load(self) -> dict[str, Any]:
        """This reading as one entry of SGLang's ``/v1/loads`` ``loads`` list (what sandrl's server answers)."""
        used = self.used_tokens or 0
        return {
            "num_running_reqs": self.running,
            "num_waiting_reqs": self.queued,
            "num_used_tokens": used,
            "max_total_num_tokens": self.total_tokens,
            "token_usage": round(used / self.total_tokens, 6) if self.total_tokens else 0.0,
            "max_running_requests": self.max_running,
        }


def loads_answer(parts: Sequence[KVCapacity]) -> dict[str, Any]:
    """SGLang's ``/v1/loads`` body for ``parts`` (one entry each, numbered as data-parallel ranks)."""
    return {"loads": [{"dp_rank": i, **part.to_load()} for i, part in enumerate(parts)]}


def from_loads(answer: Any) -> list[KVCapacity] | None:
    """The entries of an SGLang ``/v1/loads`` answer; None: not such an answer."""
    loads = answer.get("loads") if isinstance(answer, Mapping) else None
    if not isinstance(loads, list) or not loads:
        return None
    out: list[KVCapacity] = []
    for entry in loads[:MAX_ENTRIES]:
        if not isinstance(entry, Mapping):
            return None
        running, queued = _count(entry.get("num_running_reqs")), _count(entry.get("num_waiting_reqs"))
        if running is None or queued is None:
            return None
        total = _count(entry.get("max_total_num_tokens"))
        out.append(
            KVCapacity(
                running=running,
                queued=queued,
                used_tokens=_count(entry.get("num_used_tokens")),
                total_tokens=total or None,  # 0: the engine has no bound (sandrl's without kv_cache_tokens)
                max_running=_count(entry.get("max_running_requests")) or None,
            )
        )
    return out


def from_vllm_metrics(text: str) -> KVCapacity | None:
    """vLLM's load from its Prometheus ``/metrics`` text; None: the text holds no vLLM request gauges."""
    gauges: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text[:MAX_BODY_CHARS]):
            if not family.name.startswith("vllm:"):
                continue
            for sample in family.samples[:MAX_ENTRIES]:
                gauges.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except ValueError:
        return None
    running, queued = _summed(gauges.get("vllm:num_requests_running")), _summed(gauges.get("vllm:num_requests_waiting"))
    if running is None or queued is None:
        return None
    pools: dict[str, int] = {}  # per vLLM engine (its ``engine`` label): blocks x block size
    for labels, _ in gauges.get("vllm:cache_config_info", []):
        blocks, size = _count(labels.get("num_gpu_blocks")), _count(labels.get("block_size"))
        if blocks and size:
            pools[labels.get("engine", "")] = blocks * size
    usage = next((gauges[name] for name in _VLLM_USAGE if name in gauges), [])
    total = sum(pools.values()) or None
    used = None
    if total is not None and usage:
        fractions = {
            labels.get("engine", ""): min(max(value, 0.0), 1.0) for labels, value in usage if math.isfinite(value)
        }
        if set(fractions) == set(pools):
            used = round(sum(fractions[e] * pools[e] for e in pools))
        elif fractions:
            used = round(sum(fractions.values()) / len(fractions) * total)
    return KVCapacity(running=running, queued=queued, used_tokens=used, total_tokens=total, engines=max(1, len(pools)))


Fetch = Callable[[str], Awaitable[tuple[int, str]]]
"""GET a route of the engine: its status and body text (a transport error raises)."""


class CapacityProbe:
    """Reads an engine's (or a router's) :class:`KVCapacity` from the route it answers; see the module docstring."""

    def __init__(self) -> None:
        self.routes = [LOADS_ROUTE, METRICS_ROUTE]
        """The routes still worth asking, the one that answered last first; empty: the engine reports nothing."""

    @property
    def reports(self) -> bool:
        return bool(self.routes)

    async def read(self, fetch: Fetch, where: str) -> KVCapacity | None:
        """The engine's reading now; None: it reports none (and will not be asked again).

        A route that is missing (404, 405) or answers something else is not asked again; any other
        failure (the engine down, a 5xx) raises :class:`~sandrl.errors.InferenceError`."""
        for route in list(self.routes):
            status, text = await fetch(route)
            if status in (404, 405):
                self.routes.remove(route)
                continue
            if status >= 400:
                raise InferenceError(f"{where}{route} answered {status} to a load reading: {text[:200]!r}")
            reading = parse(route, text)
            if reading is None:
                self.routes.remove(route)
                continue
            self.routes = [route]
            return reading
        return None


def parse(route: str, text: str) -> KVCapacity | None:
    """The reading in the answer of ``route``; None: the answer holds none."""
    if route == METRICS_ROUTE:
        return from_vllm_metrics(text)
    try:
        answer = json.loads(text[:MAX_BODY_CHARS])
    except ValueError:
        return None
    parts = from_loads(answer)
    return KVCapacity.summed(parts) if parts is not None else None


def _count(value: Any) -> int | None:
    """A non-negative whole count from an engine's answer (a string label too); None: not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit() or len(value) > 18:
            return None
        value = int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _summed(samples: list[tuple[dict[str, str], float]] | None) -> int | None:
    if not samples:
        return None
    counts = [_count(value) for _, value in samples]
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
