"""The router's HTTP side: one URL with the engines' own routes, for the driver, the gateway and harnesses.

An ASGI app (:class:`FleetProxy`, served on the driver's event loop on loopback) that speaks
whatever its engines speak (SGLang's native routes, OpenAI's, sandrl's; vLLM's), by kind of route:

- **Generation** (``POST /generate``, ``/v1/completions``, ``/v1/chat/completions``, and sandrl's
  session routes ``/v1/sessions...``): to one engine, chosen by :class:`~sandrl.inference.fleet.router.Router`
  from the call's routing key (``X-SMG-Routing-Key``; a session route's key is its session). The
  answer is relayed as it comes (streams too), with ``X-Sandrl-Engine`` (the engine's index) and,
  when the call had to leave its key's dead engine, ``X-Sandrl-Engine-Moved: 1``. A call whose
  engine refuses the connection or drops it before answering is sent to another engine (the
  engine is marked dead); a call broken off mid-stream ends with the connection, and its client's
  retry finds another engine.
- **Control** (any other ``POST``, and the control routes of :data:`~sandrl.inference.auth.CONTROL_PATHS`
  whatever their method: weights, adapters, pause and continue, flush, vLLM's ``/pause``,
  ``/collective_rpc``...): to every live engine at once, one at a time (a lock); the answer is the
  first engine's, or the first refusal. Weight and adapter loads that succeeded are remembered
  (:class:`Replay`) and replayed, in order, into an engine that comes back before it serves again.
- **Everything else** (``GET /get_model_info``, ``/v1/models``, ``/get_weight_version``...): to the
  first live engine. ``GET /health`` is the router's own: 200 while an engine is up.
  ``GET /sandrl/fleet``: the engines' state (up, load, calls, losses) and the moves.
  ``GET /v1/loads``: SGLang's load report with one entry per live engine that reports its load (its own
  ``/v1/loads``, or vLLM's ``/metrics``: :mod:`~sandrl.inference.kv_capacity`), what admission by the
  engines' KV capacity reads (:mod:`sandrl.inference.kv_admission`); 404 when none reports.

A dead engine is watched (``/health`` every half second) and brought back once it answers and
has had the replay: a restarted process (:mod:`sandrl.inference.fleet.launch`) or an engine
started elsewhere that came back.

Auth: loopback callers only (:class:`~sandrl.http_auth.LoopbackOnly`), unless ``remote`` (the router of a
Ray cluster of several nodes, bound to the driver's address: a token is then required); with a token, every route but
``/health`` and the session routes needs it (a session's routes take the session's key, which the
engine checks). Requests to engines carry the engines' token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandrl.errors import ConfigError
from sandrl.http_auth import ASGIApp, LoopbackOnly, Receive, Scope, Send, bearer, same_token, send_error
from sandrl.inference.auth import CONTROL_PATHS, MAX_BODY_BYTES, session_of
from sandrl.inference.fleet.affinity import ENGINE_HEADER, MOVED_HEADER, ROUTING_KEY_HEADER
from sandrl.inference.fleet.forward import Answer, EngineGone, EnginePool
from sandrl.inference.fleet.router import Engine, NoEngineError, Router
from sandrl.inference.kv_capacity import LOADS_ROUTE, CapacityProbe, KVCapacity, loads_answer

log = logging.getLogger(__name__)

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
SESSIONS = "/v1/sessions"
WEIGHT_PATHS = frozenset({"/update_weights_from_disk", "/collective_rpc"})
VERSION_PATHS = frozenset({"/update_weight_version"})
ADAPTER_LOADS = frozenset({"/load_lora_adapter", "/v1/load_lora_adapter"})
ADAPTER_UNLOADS = frozenset({"/unload_lora_adapter", "/v1/unload_lora_adapter"})
_HOP = frozenset(
    {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"trailer"}
)
_DECODED = frozenset({b"content-length", b"content-encoding"})
"""Headers that describe the body as sent, not as httpx hands it over once read."""
_DEAD = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a call to an engine that died (or is dying) raises before an answer."""
WATCH_EVERY_S = 0.5
DEFAULT_TOKENS = 128


@dataclass
class Replay:
    """What an engine that comes back must load before it serves: the last weights (and the version set
    after them), then the adapters still loaded, in the order they were loaded."""

    weights: tuple[str, bytes] | None = None
    version: tuple[str, bytes] | None = None
    adapters: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    broadcast: str | None = None
    """The version of the weights last pushed over a weight-update group, while they are the newest: no
    request replays them, so an engine that comes back waits for the next push (its version is checked)."""
    changes: int = 0
    """Bumped by every record: a replay that ran while one landed is run again."""

    def record(self, target: str, path: str, body: bytes) -> None:
        fields = _json_object(body)
        if path in WEIGHT_PATHS:
            if path == "/collective_rpc" and fields.get("method") != "reload_weights":
                return
            self.weights, self.version, self.broadcast = (target, body), None, None
        elif path in VERSION_PATHS:
            self.version = (target, body)
        elif path in ADAPTER_LOADS:
            self.adapters[str(fields.get("lora_name"))] = (target, body)
        elif path in ADAPTER_UNLOADS:
            self.adapters.pop(str(fields.get("lora_name")), None)
        else:
            return
        self.changes += 1

    def broadcasted(self, version: int) -> None:
        """The engines in the group got weights ``version`` over it (not through this router)."""
        self.broadcast = str(version)

    def requests(self) -> list[tuple[str, bytes]]:
        out = [r for r in (self.weights, self.version) if r is not None]
        return out + list(self.adapters.values())


class FleetProxy:
    """The router's ASGI app; see the module docstring. Start its watcher with :meth:`start`."""

    def __init__(
        self,
        router: Router,
        *,
        token: str | None = None,
        wait_s: float = 600.0,
        timeout_s: float = 3600.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        remote: bool = False,
    ) -> None:
        if remote and not token:
            raise ConfigError(
                "a fleet's router that other hosts reach (the rollout workers of a Ray cluster on several nodes) "
                "needs a token: set [model] token_file to the engines' token"
            )
        self.router = router
        self.token = token
        self.wait_s = wait_s
        """How long a call waits for an engine while none is up (they may be restarting)."""
        self.max_body_bytes = max_body_bytes
        self.replay = Replay()
        self._replay_headers = [(b"content-type", b"application/json")]
        if token:
            self._replay_headers.append((b"authorization", f"Bearer {token}".encode()))
        self._refused: dict[int, int] = {}
        """Per engine, the replay (by ``Replay.changes``) it last refused: said once, not every half second."""
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._pools = [EnginePool(e.url) for e in router.engines]
        self._probes = [CapacityProbe() for _ in router.engines]
        """The generation calls' connections (:mod:`~sandrl.inference.fleet.forward`); httpx for the rest."""
        self._control = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        # Remote callers (a Ray cluster's other nodes) hold the token, the one credential then.
        self.app: ASGIApp = (
            self._serve
            if remote
            else LoopbackOnly(
                self._serve, advice="the fleet's router serves this host's driver only: talk to it on 127.0.0.1"
            )
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def start(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    async def aclose(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._http.aclose()
        for pool in self._pools:
            pool.close()

    # -- the engines' lives

    def lost(self, engine: Engine, reason: str, *, stale: bool = True) -> None:
        """``engine`` is dead (its process exited, or a call found it so): no more calls until it is back."""
        if self.router.lost(engine, stale=stale):
            log.warning("inference engine %d (%s) is down: %s", engine.index, engine.url, reason)

    async def healthy(self, engine: Engine, timeout_s: float = 2.0) -> bool:
        try:
            answer = await self._http.get(engine.url + "/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    async def revive(self, engine: Engine) -> bool:
        """Replay what ``engine`` missed, then route to it again; False when the replay failed, or while it
        lacks the weights last broadcast (see :attr:`Engine.awaiting_weights`)."""
        while True:
            async with self._control:
                seen = self.replay.changes
                if engine.stale and engine.replayed != seen:
                    for target, body in self.replay.requests():
                        answer = await self._send(engine, "POST", target, body, self._replay_headers)
                        if answer.status_code >= 300:
                            if self._refused.get(engine.index) != seen:
                                self._refused[engine.index] = seen
                                log.warning(
                                    "inference engine %d refused the replay of %s, and stays out of service: %s",
                                    engine.index,
                                    target,
                                    answer.text[:300],
                                )
                            return False
                    engine.replayed = seen
                if seen == self.replay.changes:
                    if not await self._has_broadcast(engine):
                        return False
                    self.router.up(engine)
                    log.warning("inference engine %d (%s) is serving again", engine.index, engine.url)
                    return True

    async def _has_broadcast(self, engine: Engine) -> bool:
        """Whether ``engine`` serves the weights last broadcast (True when the newest went by a replayable route)."""
        wanted = self.replay.broadcast
        if wanted is None:
            return True
        answer = await self._send(engine, "GET", "/get_weight_version", b"", self._replay_headers)
        served = str(_json_object(answer.content).get("weight_version")) if answer.status_code == 200 else None
        if served is not None and _not_older(served, wanted):
            return True
        if not engine.awaiting_weights:
            engine.awaiting_weights = True
            log.warning(
                "inference engine %d (%s) is back with weights %s, not v%s (broadcast while it was down): it "
                "serves again once the next weight push reaches it",
                engine.index,
                engine.url,
                served,
                wanted,
            )
        return False

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            for engine in self.router.engines:
                if engine.up or engine.gone:
                    continue
                if not await self.healthy(engine):
                    if engine.awaiting_weights:  # died while it waited: no weight-update group may count on it
                        self.router.lost(engine, stale=True)
                    continue
                try:
                    await self.revive(engine)
                except httpx.HTTPError as exc:
                    log.warning("inference engine %d died again while it was being brought back: %s", engine.index, exc)

    # -- requests

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/health" and method in ("GET", "HEAD"):
            up = len(self.router.live())
            status = 200 if up else 503
            await _send_json(send, status, {"status": "ok" if up else "no engine up", "engines_up": up})
            return
        session = session_of(path)
        if self.token is not None and session is None and not same_token(bearer(scope), self.token):
            await send_error(
                send, 401, "unauthorized", "the fleet's router needs its token: 'Authorization: Bearer <token>'"
            )
            return
        body = await _read_body(receive, self.max_body_bytes)
        if body is None:
            await send_error(send, 413, "payload_too_large", f"the request body is over {self.max_body_bytes} bytes")
            return
        target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
        try:
            if path == "/sandrl/fleet" and method == "GET":
                await _send_json(send, 200, self.router.stats())
            elif path == LOADS_ROUTE and method == "GET":
                await self._loads(send)
            elif session is not None or path == SESSIONS or (method == "POST" and path in GENERATION_PATHS):
                await self._generate(scope, target, body, send, session)
            elif path in CONTROL_PATHS or method not in ("GET", "HEAD"):
                await self._broadcast(scope, target, body, send)
            else:
                await self._first(scope, target, body, send)
        except NoEngineError as exc:
            await send_error(send, 503, "inference_unavailable", exc.message)

    async def _generate(self, scope: Scope, target: str, body: bytes, send: Send, session: str | None) -> None:
        raw_key = session if session is not None else _header(scope, ROUTING_KEY_HEADER.lower().encode())
        key = f"session/{raw_key}" if session is not None else raw_key
        headers = _forward_headers(scope)
        tokens = estimate_tokens(body)
        deadline = time.monotonic() + self.wait_s
        moved = False
        while True:
            engine, moved_now = await self._engine_for(key, deadline)
            moved = moved or moved_now
            self.router.begin(engine, tokens)
            answered = False
            try:
                try:
                    answer = await self._pools[engine.index].request(scope["method"], target, headers, body)
                except EngineGone as exc:
                    self.lost(engine, exc.message)
                    continue
                answered = True
                try:
                    await self._relay_answer(answer, send, engine, moved, opens_session=scope["path"] == SESSIONS)
                except EngineGone as exc:
                    self.lost(engine, exc.message)
                    raise
                finally:
                    answer.close()
                return
            finally:
                self.router.end(engine, tokens, answered=answered)

    async def _relay_answer(
        self, answer: Answer, send: Send, engine: Engine, moved: bool, *, opens_session: bool
    ) -> None:
        """Send an engine's answer on as it comes (a session it opened pinned to it)."""
        headers = _response_headers(answer.headers, engine.index, moved, raw=False)
        if opens_session and answer.status < 300:
            body = await answer.read()
            opened = _json_object(body).get("id")
            if isinstance(opened, str):
                self.router.pin(f"session/{opened}", engine)
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        async for chunk in answer.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _engine_for(self, key: str | None, deadline: float) -> tuple[Engine, bool]:
        """The engine for ``key`` and whether the call moves (:meth:`Router.pick`), waiting (until
        ``deadline``) while none is up."""
        while True:
            try:
                return self.router.pick(key)
            except NoEngineError:
                if all(e.gone for e in self.router.engines) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    async def _broadcast(self, scope: Scope, target: str, body: bytes, send: Send) -> None:
        headers = _forward_headers(scope)
        async with self._control:
            live = self.router.live()
            if not live:
                raise NoEngineError(self.router.none_up())
            results = await asyncio.gather(
                *(self._send(e, scope["method"], target, body, headers) for e in live), return_exceptions=True
            )
            answers: list[tuple[Engine, httpx.Response]] = []
            for engine, result in zip(live, results, strict=True):
                if isinstance(result, _DEAD):
                    self.lost(engine, f"{type(result).__name__} on {target}")
                elif isinstance(result, BaseException):
                    raise result
                else:
                    answers.append((engine, result))
            if not answers:
                raise NoEngineError(self.router.none_up())
            engine, chosen = next(((e, r) for e, r in answers if r.status_code >= 300), answers[0])
            if chosen.status_code < 300:
                self.replay.record(target, scope["path"], body)
        await _relay(chosen, send, engine.index, False)

    async def _first(self, scope: Scope, target: str, body: bytes, send: Send) -> None:
        headers = _forward_headers(scope)
        for engine in self.router.live():
            try:
                answer = await self._send(engine, scope["method"], target, body, headers)
            except _DEAD as exc:
                self.lost(engine, f"{type(exc).__name__} on {target}")
                continue
            await _relay(answer, send, engine.index, False)
            return
        raise NoEngineError(self.router.none_up())

    async def _loads(self, send: Send) -> None:
        """Every live engine's load reading, asked at once, as one SGLang ``/v1/loads`` answer."""
        live = self.router.live()
        if not live:
            raise NoEngineError(self.router.none_up())
        readings = await asyncio.gather(*(self._reading(e) for e in live), return_exceptions=True)
        parts = [r for r in readings if isinstance(r, KVCapacity)]
        if parts:
            await _send_json(send, 200, loads_answer(parts))
        elif any(isinstance(r, BaseException) for r in readings):
            failed = next(r for r in readings if isinstance(r, BaseException))
            await send_error(send, 503, "inference_unavailable", f"no engine's load could be read: {failed}")
        else:
            await send_error(send, 404, "not_found", "no engine of this fleet reports its load")

    async def _reading(self, engine: Engine) -> KVCapacity | None:
        async def fetch(route: str) -> tuple[int, str]:
            answer = await self._http.get(engine.url + route, headers=self._replay_headers, timeout=5.0)
            return answer.status_code, answer.text

        return await self._probes[engine.index].read(fetch, engine.url)

    async def _send(
        self, engine: Engine, method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> httpx.Response:
        return await self._http.request(method, engine.url + target, content=body or None, headers=headers)


def _not_older(served: str, wanted: str) -> bool:
    """Whether version ``served`` is ``wanted`` or newer (numbers compare as numbers; other names must match)."""
    if served.isdigit() and wanted.isdigit():
        return int(served) >= int(wanted)
    return served == wanted


def _forward_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The caller's headers, less the hop-by-hop ones: its token (the engines' too) and routing key go on."""
    return [(k, v) for k, v in scope.get("headers", []) if k not in _HOP and not k.startswith(b"proxy-")]


def estimate_tokens(body: bytes) -> int:
    """A request's weight on an engine: its prompt's tokens (ids counted; text at 4 bytes a token) and
    the most it may generate (``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``)."""
    fields = _json_object(body)
    prompt: Any = fields.get("input_ids", fields.get("prompt", fields.get("text", fields.get("messages"))))
    sampling = fields.get("sampling_params")
    params = sampling if isinstance(sampling, dict) else fields
    new = params.get("max_new_tokens", params.get("max_tokens", params.get("max_completion_tokens")))
    return _prompt_tokens(prompt) + (new if isinstance(new, int) and new > 0 else DEFAULT_TOKENS)


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt) // 4 + 1
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt[:8]):
            return len(prompt)
        return sum(_prompt_tokens(p.get("content") if isinstance(p, dict) else p) for p in prompt)
    return 0


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1") or None
    return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _response_headers(
    headers: Iterable[tuple[bytes, bytes]], engine: int, moved: bool, *, raw: bool
) -> list[tuple[bytes, bytes]]:
    keep = {b"content-length", b"content-encoding"} if raw else set()
    out = [(k.lower(), v) for k, v in headers if k.lower() in keep or k.lower() not in _HOP | _DECODED]
    out.append((ENGINE_HEADER.lower().encode(), str(engine).encode()))
    if moved:
        out.append((MOVED_HEADER.lower().encode(), b"1"))
    return out


async def _relay(response: httpx.Response, send: Send, engine: int, moved: bool) -> None:
    """Send the engine's ``response`` on as it comes: status, headers (plus the router's), raw body."""
    buffered = response.is_stream_consumed or response.is_closed
    headers = _response_headers(response.headers.raw, engine, moved, raw=not buffered)
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    if buffered:  # read whole, and decoded: its length is the decoded body's (the server counts it)
        await send({"type": "http.response.body", "body": response.content})
        return
    async for chunk in response.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _send_json(send: Send, status: int, value: Any) -> None:
    body = json.dumps(value).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
