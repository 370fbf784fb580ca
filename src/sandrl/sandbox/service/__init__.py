"""The sandbox service: any sandbox provider served over HTTP, by sandrl's native API and E2B's.

:mod:`.state` holds the live sandboxes (TTLs, admission, draining); :mod:`.routes` is the native
``/v1`` API, whose bodies are :mod:`sandrl.sandbox.remote.wire` (shared with the client,
:mod:`sandrl.sandbox.remote`, which imports nothing of the service); :mod:`.hot_routes` serves its
create, exec and delete without FastAPI's per-request machinery, and :mod:`.channel` serves the
same calls over one upgraded connection; :mod:`.auth` the bearer token, loopback and body-size
guards; :mod:`.errors` the service's own refusals; :mod:`.metrics` the Prometheus metrics;
:mod:`.server` builds the app and runs it (and states the service's threat model); :mod:`.e2b`
is the E2B-compatible API over the same sandboxes.
"""
