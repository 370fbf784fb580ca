"""The E2B-compatible API of the sandbox service: the official ``e2b`` SDK works against sandrl.

Point the SDK at the one server (``E2B_API_URL=http://HOST:PORT``,
``E2B_SANDBOX_URL=http://HOST:PORT``, ``E2B_API_KEY=<the service's token>``); it then sends
the control plane (``/v2/sandboxes``...) and every in-sandbox call (with ``E2b-Sandbox-Id``)
to that port. :func:`mount` adds both to the service's app:

- :mod:`.control`: the control-plane routes (a FastAPI router beside the native ``/v1`` one),
  :mod:`.snapshots` (snapshots and forks), :mod:`.metrics` (a sandbox's CPU, memory and disk),
  and :mod:`.unsupported` (what is refused, with why);
- :mod:`.gateway`: an ASGI layer in front that maps E2B's ``X-API-Key`` to the service's
  bearer token and sends envd traffic to :mod:`.envd`;
- :mod:`.envd`: envd's Connect RPC services (:mod:`.processes`, :mod:`.filesystem`, from the
  code generated out of ``proto/``) and its ``/files`` routes;
- :mod:`.state`: the per-sandbox records (envd access tokens, the commands tracked in
  :mod:`.process_table`).

Tested against e2b 2.63.0 (``tests/sandbox/e2b``).
"""

from __future__ import annotations

from fastapi import FastAPI

from sandrl.sandbox.service.e2b import control, metrics, snapshots, unsupported
from sandrl.sandbox.service.e2b.envd import EnvdApp
from sandrl.sandbox.service.e2b.gateway import E2BGateway
from sandrl.sandbox.service.e2b.state import E2BRegistry
from sandrl.sandbox.service.state import SandboxService

__all__ = ["mount"]


def mount(app: FastAPI, service: SandboxService, *, token: str | None) -> None:
    """Serve the E2B API on ``app``; call it after every other middleware is added (the gateway goes outermost)."""
    registry = E2BRegistry(service)
    app.state.e2b = registry
    for module in (control, snapshots, metrics, unsupported):  # the refusals' catch-alls last
        app.include_router(module.router)
    failures = service.metrics.failures
    app.add_middleware(
        E2BGateway, envd=EnvdApp(registry), token=token, on_refused=lambda code: failures.labels(code).inc()
    )
