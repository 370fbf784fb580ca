"""The sandbox provider of ``[rollout] sandboxes``: this machine's, or an E2B-compatible service's.

``local`` is the bubblewrap provider (root, on this machine); ``e2b`` is
:class:`~sandrl.sandbox.e2b.provider.E2BProvider`, configured by the ``e2b`` SDK's own environment
variables (``E2B_API_KEY``, ``E2B_DOMAIN`` or ``E2B_API_URL``/``E2B_SANDBOX_URL``) with
``[rollout] create_concurrency`` creates in flight. Each task's image is then a template the
service must hold (:mod:`sandrl.sandbox.e2b.templates`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.sandbox.base import SandboxProvider
from sandrl.wiring.config import RolloutConfig
from sandrl.wiring.runner import local_provider


@contextlib.asynccontextmanager
async def open_provider(rollout: RolloutConfig, *, state_dir: Path | None = None) -> AsyncIterator[SandboxProvider]:
    """The provider of ``rollout.sandboxes``, for as long as the context lasts: when it ends, every
    sandbox the provider still holds is closed (a local one's cgroups and state record go with it,
    even when a signal stopped the run; an E2B one is killed, its TTL the backstop).

    Every command that runs sandboxes builds them here (``eval``, ``train``, ``tasks``, the
    benchmarks and demos). ``state_dir`` holds a local provider's state and image store (default:
    the host's; a benchmark's own scratch directory)."""
    if rollout.sandboxes == "local":
        local = local_provider(state_dir)
        try:
            yield local
        finally:
            await local.close_all()
        return
    try:
        from sandrl.sandbox.e2b.provider import E2BConfig, E2BProvider
    except ImportError as exc:
        raise ConfigError(
            f"--sandboxes e2b needs the e2b SDK, which is not installed ({exc}): pip install 'sandrl[e2b]'"
        ) from exc
    async with E2BProvider(E2BConfig(create_concurrency=rollout.create_concurrency)) as provider:
        yield provider
