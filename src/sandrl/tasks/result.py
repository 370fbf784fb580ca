"""What verifying one episode found."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

TAIL_CHARS = 8000
"""How much of the end of each output stream a result keeps (the end is where test summaries are)."""


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


@dataclass(frozen=True)
class VerifyResult:
    """The reward of one episode and the evidence for it.

    A result with ``infra_error`` set says the *task or the machinery* failed (a test patch that
    does not apply, a test script that wrote no reward, a missing tool), not the agent: the
    episode should be retried or dropped, never trained on as reward 0. Everything the agent can
    cause (failing tests, a patch that does not apply, a timeout) is a plain reward.
    """

    reward: float
    passed: bool
    """The task is solved: reward 1 (all tests passed / the instance is resolved)."""
    duration_s: float
    details: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    """Per-format evidence: per-test statuses, named rewards, the patch command that applied..."""
    stdout_tail: str = ""
    stderr_tail: str = ""
    exit_code: int | None = None
    """The test command's exit status (None when it did not run)."""
    timed_out: bool = False
    error: str | None = None
    """Why no reward could be read the way the task defines it, for people."""
    infra_error: bool = False


def result_since(
    start: float,
    reward: float = 0.0,
    *,
    error: str | None = None,
    details: dict[str, object] | None = None,
    output: str = "",
    exit_code: int | None = None,
    timed_out: bool = False,
    infra_error: bool = False,
) -> VerifyResult:
    """A grader's result, timed from ``start`` (``time.monotonic()``): passed at reward 1, its output's tail kept.
    A grader binds its start once: ``result = functools.partial(result_since, time.monotonic())``."""
    return VerifyResult(
        reward=reward,
        passed=reward >= 1.0,
        duration_s=time.monotonic() - start,
        details=MappingProxyType(details or {}),
        stdout_tail=tail(output),
        exit_code=exit_code,
        timed_out=timed_out,
        error=error,
        infra_error=infra_error,
    )
