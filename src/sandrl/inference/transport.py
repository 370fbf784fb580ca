"""JSON over HTTP for the inference clients: timeouts, retries with backoff, typed errors.

Both clients (SGLang's native API and the OpenAI-compatible one) go through
:class:`JSONTransport`, so they fail the same way:

- the server cannot be reached (refused, reset, DNS): retried with exponential backoff,
  then :class:`~sandrl.errors.InferenceError` (``inference_unreachable``) saying how to start it;
- 502/503/504 (a proxy, or a server still loading): retried the same way;
- any other 4xx: the server rejected the request, so sending it again cannot help:
  :class:`~sandrl.errors.ConfigError` with the server's own message;
- 5xx, a timeout, or a body that is not JSON: :class:`~sandrl.errors.InferenceError`.

A call made while an episode's routing key is bound (:mod:`sandrl.inference.fleet.affinity`)
carries it in ``X-SMG-Routing-Key``, and counts on it the router's word that the call had to
move to another engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.fleet import affinity
from sandrl.retry import Backoff, retry

_RETRY_STATUS = frozenset({502, 503, 504})
_UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)
"""The failures retried: the server cannot be reached, or dropped the connection."""


@dataclass(frozen=True)
class HTTPConfig:
    """Timeouts and retries of an inference client."""

    timeout_s: float = 600.0
    """Longest wait for one response; a long generation on a busy server can take minutes."""
    connect_timeout_s: float = 5.0
    retries: int = 3
    """Attempts after the first when the server is unreachable or answers 502/503/504."""
    backoff_s: float = 0.5
    """Wait before the first retry; it doubles on each next one, up to ``backoff_max_s``."""
    backoff_max_s: float = 8.0
    api_key: str | None = None
    """Sent as ``Authorization: Bearer ...`` when set (OpenAI-compatible servers started with an API key)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("inference client timeouts must be positive")
        if self.retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ConfigError("inference client retries and backoff must be >= 0")


class JSONTransport:
    """An httpx.AsyncClient bound to one server, with the retry and error policy above."""

    def __init__(
        self, base_url: str, config: HTTPConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config or HTTPConfig()
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=headers, transport=transport)

    async def get(self, path: str) -> Any:
        return (await self.send("GET", path)).json()

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        return _json(await self.send("POST", path, body), self.base_url + path)

    async def send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One request with retries; returns a 2xx response or raises a typed error."""
        url = self.base_url + path
        cfg = self.config
        # The episode the call belongs to, for a router in front of several engines (:mod:`~sandrl.inference.fleet`).
        route = affinity.current()
        headers = {affinity.ROUTING_KEY_HEADER: route.key} if route is not None else None

        async def attempt(_: int) -> httpx.Response:
            response = await self._client.request(method, path, json=body, headers=headers)
            if route is not None and response.headers.get(affinity.MOVED_HEADER):
                route.moves += 1
            return response

        try:
            response = await retry(
                attempt,
                attempts=cfg.retries + 1,
                backoff=Backoff(cfg.backoff_s, max_s=cfg.backoff_max_s),
                retry_on=_UNREACHABLE,
                retry_if=lambda r: r.status_code in _RETRY_STATUS,
            )
        except _UNREACHABLE as exc:
            raise InferenceError(
                f"inference server at {self.base_url} is not reachable ({type(exc).__name__}: {exc}; "
                f"{cfg.retries + 1} attempts): start it with `sandrl serve inference --model tiny` "
                "or check --inference",
                error_code="inference_unreachable",
            ) from exc
        except httpx.TimeoutException as exc:
            raise InferenceError(
                f"inference server at {self.base_url} did not answer {method} {path} within "
                f"{cfg.timeout_s:g} s: lower max_new_tokens, or raise the client's timeout_s",
                error_code="inference_timeout",
            ) from exc
        except httpx.HTTPError as exc:
            raise InferenceError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise _status_error(method, url, response)
        return response

    async def probe(self, path: str) -> tuple[int, str]:
        """One ``GET path``, not retried, whatever its status: for readings that are worth nothing late (an
        engine's load, :mod:`sandrl.inference.kv_capacity`). A transport failure raises InferenceError."""
        try:
            response = await self._client.get(path)
        except httpx.HTTPError as exc:
            raise InferenceError(f"GET {self.base_url}{path} failed: {type(exc).__name__}: {exc}") from exc
        return response.status_code, response.text

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> JSONTransport:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _json(response: httpx.Response, url: str) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InferenceError(
            f"{url} answered {response.status_code} with a body that is not JSON: {response.text[:200]!r}; "
            "is that an inference server?",
            error_code="inference_bad_response",
        ) from exc


def _status_error(method: str, url: str, response: httpx.Response) -> ConfigError | InferenceError:
    """The error for a non-2xx answer, keeping the server's machine-readable code and message."""
    message, error_code = response.text[:500] or response.reason_phrase, None
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        # sandrl: {code, error_code, message}; OpenAI: {error: {message, code}}; SGLang: {message} or {detail},
        # and {error_message} from its LoRA routes.
        raw = body.get("error")
        nested: dict[str, Any] = raw if isinstance(raw, dict) else {}
        found = body.get("message") or nested.get("message") or body.get("detail") or body.get("error_message")
        message = str(found or message)
        code = body.get("error_code") or nested.get("code") or nested.get("type")
        error_code = str(code) if isinstance(code, str) and code else None
    text = f"{method} {url} answered {response.status_code}: {message}"
    error: ConfigError | InferenceError
    if 400 <= response.status_code < 500:
        error = ConfigError(text, error_code=error_code)
    else:
        error = InferenceError(text, error_code=error_code)
    # The server's status, so a caller can tell a 404 (no such route) from a 400 (bad request).
    error.http_status = response.status_code
    return error


def parse_version(value: Any) -> int | None:
    """A weight version as an int: SGLang reports it as a string ("default" before any update)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
