"""Where an episode's time goes, and how long its KV cache sits idle: pure arithmetic.

An :class:`EpisodeBreakdown` splits one episode's wall time into model, commands, verifier,
sandbox create and the rest. It is read from the rollout layer's ``Timings.to_dict()``
(:meth:`EpisodeBreakdown.from_timings`), so the episode-level benchmark plugs in here.

KV-cache token-seconds. While the model decodes turn *i*, the sequence's cache grows from
``context_tokens`` to ``context_tokens + output_tokens``: ``model_s * (context + output / 2)``
token-seconds *decoding*. While the agent then waits on the sandbox, the server keeps that
cache for the next turn (prefix caching, sessions) and nothing uses it:
``wait_s * (context + output)`` token-seconds *idle*. The idle fraction is
``idle / (idle + decoding)``: the share of the cache memory that agents' commands hold hostage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandrl.errors import ConfigError
from sandrl.stats import quantile


@dataclass(frozen=True)
class KvTurn:
    """One turn as the KV cache saw it."""

    context_tokens: int
    """The prompt length at this turn (everything before the model's output)."""
    output_tokens: int
    model_s: float
    """Time the model spent on the turn (prefill and decode)."""
    wait_s: float
    """Time the agent then waited on the sandbox (the command, transport, queueing)."""

    def __post_init__(self) -> None:
        if min(self.context_tokens, self.output_tokens) < 0 or min(self.model_s, self.wait_s) < 0:
            raise ConfigError(f"a KV turn's tokens and seconds cannot be negative: {self}")


def kv_turns(turns: Iterable[Mapping[str, Any]]) -> list[KvTurn]:
    """KV turns from the rollout layer's ``Turn.to_dict()`` records."""
    return [
        KvTurn(
            context_tokens=int(t.get("context_tokens", 0)),
            output_tokens=max(0, int(t.get("output_end", 0)) - int(t.get("output_start", 0))),
            model_s=float(t.get("model_s", 0.0)),
            wait_s=float(t.get("sandbox_wait_s", 0.0)),
        )
        for t in turns
    ]


@dataclass(frozen=True)
class KvUsage:
    decoding_token_s: float
    idle_token_s: float

    @property
    def idle_fraction(self) -> float:
        """Idle share of the cache's token-seconds; 0 for an episode that held no cache."""
        total = self.decoding_token_s + self.idle_token_s
        return self.idle_token_s / total if total > 0 else 0.0

    def with_speedup(self, k: float) -> KvUsage:
        """The same turns with inference ``k`` times faster: decoding token-seconds / k."""
        return KvUsage(self.decoding_token_s / k, self.idle_token_s)

    def __add__(self, other: KvUsage) -> KvUsage:
        return KvUsage(self.decoding_token_s + other.decoding_token_s, self.idle_token_s + other.idle_token_s)

    def to_dict(self) -> dict[str, float]:
        return {
            "decoding_token_s": round(self.decoding_token_s, 3),
            "idle_token_s": round(self.idle_token_s, 3),
            "idle_fraction": round(self.idle_fraction, 4),
        }


def kv_usage(turns: Iterable[KvTurn]) -> KvUsage:
    decoding = idle = 0.0
    for t in turns:
        decoding += t.model_s * (t.context_tokens + t.output_tokens / 2)
        idle += t.wait_s * (t.context_tokens + t.output_tokens)
    return KvUsage(decoding, idle)


PHASES = ("model_s", "commands_s", "verifier_s", "sandbox_create_s", "other_s")


@dataclass(frozen=True)
class EpisodeBreakdown:
    """One episode's wall time by phase (seconds)."""

    total_s: float
    model_s: float
    commands_s: float
    """Time the agent waited on its commands (``Timings.sandbox_wait_s``)."""
    verifier_s: float
    sandbox_create_s: float
    kv: KvUsage | None = None

    def __post_init__(self) -> None:
        parts = self.model_s + self.commands_s + self.verifier_s + self.sandbox_create_s
        if min(self.total_s, self.model_s, self.commands_s, self.verifier_s, self.sandbox_create_s) < 0:
            raise ConfigError(f"episode phase times cannot be negative: {self}")
        if parts > self.total_s * (1 + 1e-6) + 1e-6:
            raise ConfigError(f"the phases ({parts:.3f} s) add up to more than the episode ({self.total_s:.3f} s)")

    @property
    def other_s(self) -> float:
        """Setup, close and the orchestrator's own time."""
        return max(0.0, self.total_s - self.model_s - self.commands_s - self.verifier_s - self.sandbox_create_s)

    @classmethod
    def from_timings(cls, timings: Mapping[str, float], kv: KvUsage | None = None) -> EpisodeBreakdown:
        """From ``Timings.to_dict()`` of :mod:`sandrl.rollout.trajectory`."""
        return cls(
            total_s=float(timings["total_s"]),
            model_s=float(timings.get("model_s", 0.0)),
            commands_s=float(timings.get("sandbox_wait_s", timings.get("command_s", 0.0))),
            verifier_s=float(timings.get("verifier_s", 0.0)),
            sandbox_create_s=float(timings.get("sandbox_create_s", 0.0)),
            kv=kv,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total_s": round(self.total_s, 4)}
        out |= {p: round(float(getattr(self, p)), 4) for p in PHASES}
        out["kv"] = self.kv.to_dict() if self.kv is not None else None
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EpisodeBreakdown:
        kv = d.get("kv")
        return cls(
            total_s=float(d["total_s"]),
            model_s=float(d["model_s"]),
            commands_s=float(d["commands_s"]),
            verifier_s=float(d["verifier_s"]),
            sandbox_create_s=float(d["sandbox_create_s"]),
            kv=KvUsage(float(kv["decoding_token_s"]), float(kv["idle_token_s"])) if kv else None,
        )


def mean(breakdowns: Sequence[EpisodeBreakdown]) -> EpisodeBreakdown:
    """The mean episode; its KV usage is the sum's ratio (token-seconds weighted), not a mean of fractions."""
    if not breakdowns:
        raise ConfigError("no episodes to average")
    n = len(breakdowns)
    kvs = [b.kv for b in breakdowns if b.kv is not None]
    kv = None
    if kvs:
        total = kvs[0]
        for k in kvs[1:]:
            total = total + k
        kv = KvUsage(total.decoding_token_s / len(kvs), total.idle_token_s / len(kvs))
    return EpisodeBreakdown(
        total_s=sum(b.total_s for b in breakdowns) / n,
        model_s=sum(b.model_s for b in breakdowns) / n,
        commands_s=sum(b.commands_s for b in breakdowns) / n,
        verifier_s=sum(b.verifier_s for b in breakdowns) / n,
        sandbox_create_s=sum(b.sandbox_create_s for b in breakdowns) / n,
        kv=kv,
    )


def episodes_section(breakdowns: Sequence[EpisodeBreakdown], **meta: Any) -> dict[str, Any]:
    """The ``episodes`` part of a benchmark result (the episode-level run fills ``meta``:
    agent, load, tasks...)."""
    m = mean(breakdowns)
    totals = [b.total_s for b in breakdowns]
    return {
        "n": len(breakdowns),
        "mean": m.to_dict(),
        "total_p50_s": round(quantile(totals, 0.5), 4),
        "total_p95_s": round(quantile(totals, 0.95), 4),
        "per_episode": [b.to_dict() for b in breakdowns],
        **meta,
    }
