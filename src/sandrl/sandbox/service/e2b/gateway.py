"""The ASGI gateway in front of the sandbox service's app: E2B's auth header and envd routing.

- A request with an ``E2b-Sandbox-Id`` header is envd traffic (the SDK sends it to
  ``E2B_SANDBOX_URL``): it goes to :class:`~sandrl.sandbox.service.e2b.envd.EnvdApp`, which checks the
  sandbox's own access token.
- A request with E2B's ``X-API-Key`` header (and no ``Authorization``) is checked against the
  service's token and passed on as ``Authorization: Bearer <token>``, so the service's bearer
  auth, body limits and error handlers apply to the E2B control plane as to the native API.
- Everything else passes through untouched.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from sandrl.sandbox.service.auth import ASGIApp, Receive, Scope, Send, send_error


class E2BGateway:
    def __init__(
        self, app: ASGIApp, *, envd: ASGIApp, token: str | None, on_refused: Callable[[str], None] | None = None
    ) -> None:
        self.app = app
        self.envd = envd
        self._token = token.encode() if token is not None else None
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        names = {name for name, _ in headers}
        if b"e2b-sandbox-id" in names:
            await self.envd(scope, receive, send)
            return
        if b"x-api-key" in names and b"authorization" not in names:
            given = next(value for name, value in headers if name == b"x-api-key")
            if self._token is not None and not hmac.compare_digest(given.strip(), self._token):
                if self._on_refused is not None:
                    self._on_refused("unauthorized")
                await send_error(
                    send,
                    401,
                    "unauthorized",
                    "the API key is wrong: set E2B_API_KEY to the token the sandrl server was started with "
                    "($SANDRL_TOKEN or --token-file)",
                )
                return
            if self._token is not None:
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + self._token)]}
        await self.app(scope, receive, send)
