"""Which episode an inference call belongs to, so that a router keeps the episode on one engine.

The rollout side binds a :class:`RouteKey` around an episode (:func:`bound`: the runner per
episode, the session gateway per session); every request a client sends through
:class:`~sandrl.inference.transport.JSONTransport` while it is bound carries the key in
:data:`ROUTING_KEY_HEADER`, and the router (:mod:`sandrl.inference.fleet.router`) sends every call
with that key to the engine it pinned the key to, while that engine lives. The header is SGLang
Model Gateway's (``X-SMG-Routing-Key``, its ``manual`` and ``consistent_hashing`` policies), so
an SGLang router that a user runs in front of their own engines pins sandrl's episodes too.

When the pinned engine has died the router sends the call to another engine and says so in
:data:`MOVED_HEADER`; the transport counts it on the key (:attr:`RouteKey.moves`), and the runner
records the count on the trajectory (``Trajectory.engine_moves``): that call re-prefilled the
episode's history on the new engine, which costs time and is not an error.

The key also carries how long the episode's calls waited for the engines' room (:attr:`RouteKey.kv_wait_s`,
:mod:`sandrl.inference.kv_admission`): it goes wherever the episode's calls go, and the runner records it as
``Timings.kv_wait_s``.

A context variable carries the key, so it follows the episode's own tasks (``asyncio`` copies the
context into each task it creates) and nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
"""The request header naming the call's episode (or gateway session)."""
MOVED_HEADER = "X-Sandrl-Engine-Moved"
"""A response header the router sets when the call's key was pinned to an engine that is gone."""
ENGINE_HEADER = "X-Sandrl-Engine"
"""A response header the router sets to the index of the engine that answered."""
MAX_KEY_CHARS = 256
"""Longer keys are cut: a key names an episode, and a header has no business being large."""


@dataclass
class RouteKey:
    """One episode's (or one gateway session's) routing key, and how often its calls had to move."""

    key: str
    moves: int = 0
    """Calls of this key that the router sent to another engine than the one it was pinned to (that
    engine had died): each re-prefilled the history on the new engine."""
    kv_wait_s: float = 0.0
    """Seconds its calls waited for the engines' KV room (:mod:`sandrl.inference.kv_admission`)."""

    def __post_init__(self) -> None:
        # A header value: printable ASCII only, bounded (an episode id is made of task ids).
        self.key = "".join(c if " " < c < "\x7f" else "_" for c in self.key[:MAX_KEY_CHARS])


_CURRENT: ContextVar[RouteKey | None] = ContextVar("sandrl_route_key", default=None)


def current() -> RouteKey | None:
    """The key bound in this context, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def bound(route: RouteKey | str) -> Iterator[RouteKey]:
    """Bind ``route`` (a key or its string) for the calls made in this context until the block ends."""
    key = route if isinstance(route, RouteKey) else RouteKey(route)
    token = _CURRENT.set(key)
    try:
        yield key
    finally:
        _CURRENT.reset(token)
