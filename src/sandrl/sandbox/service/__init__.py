"""The sandbox service: any sandbox provider served over HTTP, by sandrl's native API and E2B's.

:mod:`.state` holds the live sandboxes (TTLs, admission, draining); :mod:`.routes` is the native
``/v1`` API whose bodies are :mod:`.api` (shared with :mod:`sandrl.sandbox.client`); :mod:`.auth`
the bearer token, loopback and body-size guards; :mod:`.metrics` the Prometheus metrics;
:mod:`.server` builds the app and runs it (and states the service's threat model); :mod:`.e2b`
is the E2B-compatible API over the same sandboxes.

Nothing is imported here, so that a client importing :mod:`.api` loads no server code.
"""
