"""Which engine serves a call: each episode pinned to one engine while it lives, new ones to the least loaded.

The rules (the HTTP side is :mod:`sandrl.inference.fleet.proxy`):

- A call with a routing key (:mod:`sandrl.inference.fleet.affinity`: an episode, a gateway session)
  goes to the engine the key is pinned to, while that engine is up: every turn of an episode finds
  its history in that engine's prefix cache.
- A key seen for the first time, or a call without one, goes to the live engine with the fewest
  *outstanding tokens* (prompt plus ``max_new_tokens`` of the requests it is serving): a long
  prompt weighs what it costs, a queue of short ones no more. Ties go round the engines, so idle
  engines share the first calls of a run.
- A key whose engine died (its process exited, or a call to it failed to connect or broke off) is
  pinned to another engine by the same rule, and the call is *moved*: it re-prefills the episode's
  history there. The router says so to the caller, which records it on the trajectory.
- An engine comes back only through :meth:`Router.up`, after the router has replayed the weights
  and adapters it missed (:mod:`sandrl.inference.fleet.proxy`).

Pins are kept for the most recent :data:`MAX_KEYS` keys (an episode's calls are minutes apart at
most; a key evicted early is merely placed again).

``Router(urls, affinity=False)`` is the baseline that affinity is measured against (``sandrl bench
inference --fleet``): every call goes to the next live engine in turn, its key ignored and no key
pinned; only what was pinned explicitly (:meth:`Router.pin`: a gateway session, whose state lives on
the engine that opened it) still goes to its engine.

Under ``--ray`` the same router, served by the driver, fronts the engines (engine actors or
``[cluster] inference`` URLs: :mod:`sandrl.cluster.engines`), and the rollout workers sample through it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandrl.errors import InferenceError

MAX_KEYS = 100_000


@dataclass
class Engine:
    """One engine as the router sees it."""

    index: int
    url: str
    up: bool = True
    gone: bool = False
    """Given up on: dead and not to be restarted (its launcher's restarts are spent)."""
    stale: bool = False
    """It may lack the weights and adapters loaded since it started (a restarted process, or an engine
    started elsewhere that went away): they are replayed before it serves again."""
    awaiting_weights: bool = False
    """Back and replayed, but without the weights last broadcast (a broadcast cannot be replayed): out of
    service until a push reaches it (the next push groups with it)."""
    replayed: int = -1
    """The replay (by ``Replay.changes``) it has had while it waits for the broadcast weights."""
    outstanding_tokens: int = 0
    in_flight: int = 0
    calls: int = 0
    """Calls it answered."""
    losses: int = 0
    """Times it was found dead."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "url": self.url,
            "up": self.up,
            "gone": self.gone,
            "awaiting_weights": self.awaiting_weights,
            "outstanding_tokens": self.outstanding_tokens,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "losses": self.losses,
        }


class NoEngineError(InferenceError):
    """No engine is up to take the call."""


class Router:
    """The engines, their load, and the key pins; see the module docstring."""

    def __init__(self, urls: Sequence[str], *, max_keys: int = MAX_KEYS, affinity: bool = True) -> None:
        if not urls:
            raise ValueError("a router needs at least one engine")
        self.engines = [Engine(i, url) for i, url in enumerate(urls)]
        self.max_keys = max_keys
        self.affinity = affinity
        """False: calls go round the live engines in turn, their keys ignored (the module docstring)."""
        self.moves = 0
        """Calls sent to another engine than their key's (its engine had died)."""
        self._pins: OrderedDict[str, int] = OrderedDict()
        self._turn = itertools.count()

    def live(self) -> list[Engine]:
        return [e for e in self.engines if e.up]

    def pick(self, key: str | None) -> tuple[Engine, bool]:
        """The engine for a call with ``key`` (None: no affinity), and whether the call moves its key."""
        pinned = self._pins.get(key) if key is not None else None
        if pinned is not None and self.engines[pinned].up:
            self._pins.move_to_end(key)  # type: ignore[arg-type]
            return self.engines[pinned], False
        engine = self.least_loaded() if self.affinity else self.next_in_turn()
        if key is not None and (self.affinity or pinned is not None):
            self.pin(key, engine)
        moved = pinned is not None
        if moved:
            self.moves += 1
        return engine, moved

    def least_loaded(self) -> Engine:
        """The live engine with the fewest outstanding tokens (ties: round the engines)."""
        live = self.live()
        if not live:
            raise NoEngineError(self.none_up())
        start = next(self._turn) % len(live)
        return min((live[(start + i) % len(live)] for i in range(len(live))), key=lambda e: e.outstanding_tokens)

    def next_in_turn(self) -> Engine:
        """The next live engine round the engines, whatever their load (``affinity=False``)."""
        live = self.live()
        if not live:
            raise NoEngineError(self.none_up())
        return live[next(self._turn) % len(live)]

    def pin(self, key: str, engine: Engine) -> None:
        self._pins[key] = engine.index
        self._pins.move_to_end(key)
        while len(self._pins) > self.max_keys:
            self._pins.popitem(last=False)

    def pinned(self, key: str) -> Engine | None:
        index = self._pins.get(key)
        return self.engines[index] if index is not None else None

    def begin(self, engine: Engine, tokens: int) -> None:
        engine.outstanding_tokens += tokens
        engine.in_flight += 1

    def end(self, engine: Engine, tokens: int, *, answered: bool) -> None:
        engine.outstanding_tokens -= tokens
        engine.in_flight -= 1
        if answered:
            engine.calls += 1

    def lost(self, engine: Engine, *, stale: bool) -> bool:
        """Mark ``engine`` dead (``stale``: it will need the replay); whether it was up until now."""
        was_up = engine.up
        if was_up:
            engine.losses += 1
        engine.up = False
        engine.stale = engine.stale or stale
        # A new process (or the same one, back again) needs the whole replay, and the broadcast weights anew.
        engine.awaiting_weights, engine.replayed = False, -1
        return was_up

    def up(self, engine: Engine) -> None:
        engine.up, engine.stale, engine.awaiting_weights, engine.replayed = True, False, False, -1

    def group_members(self) -> tuple[str, ...]:
        """The engines a weight-update group is formed with now: those up, and those back but waiting for
        the broadcast weights (a dead one cannot join; it waits for the push after it comes back)."""
        return tuple(e.url for e in self.engines if e.up or e.awaiting_weights)

    @property
    def losses(self) -> int:
        """Engines found dead so far, all together: a weight-update group formed before a loss is formed again."""
        return sum(e.losses for e in self.engines)

    def none_up(self) -> str:
        gone = sum(e.gone for e in self.engines)
        if gone == len(self.engines):
            return (
                f"every inference engine died and was given up on ({gone} of {len(self.engines)}): read their "
                "logs (<output_dir>/engines/engine-N.log) and raise [inference] max_restarts if they should come back"
            )
        return (
            f"no inference engine is up ({len(self.engines)} known, {gone} given up on); the others are "
            "restarting: read their logs (<output_dir>/engines/engine-N.log) if this lasts"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "engines": [e.to_dict() for e in self.engines],
            "moves": self.moves,
            "keys": len(self._pins),
            "affinity": self.affinity,
        }
