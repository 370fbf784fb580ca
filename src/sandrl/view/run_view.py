"""The viewer's state for one run: its files, read as they grow, its tokenizer, and the answers the page asks for.

One lock guards the run's files: the web server answers from a thread pool, and the first read of
a large run (its episode index) starts in the background as soon as the viewer does, so it is
usually done before a browser asks.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sandrl.errors import SandrlError
from sandrl.inference.tokenizer import Tokenizer, model_tokenizer
from sandrl.view.episode_page import TOKENS_SHOWN, episode_page, finite
from sandrl.view.run_files import RunFiles
from sandrl.view.summary import STATUS_FILTERS, listing_row, select, summary

PAGE_ROWS = 200
"""Episodes per page of the list at most."""
REFRESH_EVERY_S = 1.0
"""The run's files are read again at most this often (a live run appends to them)."""


@dataclass(frozen=True)
class EpisodeQuery:
    """A page of the episode list: its filters (each None: any) and where the page starts; the
    ``/api/episodes`` route reads it from the query string."""

    step: int | None = None
    task: str | None = None
    source: str | None = None
    status: str | None = None
    group: str | None = None
    offset: int = 0
    limit: int = 50


@dataclass
class RunView:
    """What the page shows of one run directory."""

    run: RunFiles
    model: str | None = None
    """The model whose tokenizer decodes the ids (``--model``); None: the run's newest checkpoint, else its config's."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refreshed_at: float = 0.0
    _summary: dict[str, Any] | None = None
    _summary_key: tuple[int, int] = (-1, -1)
    _tokenizer: Tokenizer | None = None
    _tokenizer_note: str | None = None
    _tokenizer_loaded: bool = False
    _tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> threading.Thread:
        """Read the run (and load its tokenizer) in the background; the page's first question waits for it."""
        thread = threading.Thread(target=self._warm, name="sandrl-view-index", daemon=True)
        thread.start()
        return thread

    def summary(self) -> dict[str, Any]:
        with self._lock:
            self._refresh()
            key = (len(self.run.episodes), len(self.run.metrics))
            if self._summary is None or key != self._summary_key:
                self._summary = finite(summary(self.run))
                self._summary_key = key
            return {**self._summary, "tokenizer": self._tokenizer_status()}

    def episodes(self, query: EpisodeQuery) -> dict[str, Any]:
        """A page of the episodes that match the filters."""
        q = query
        if q.status is not None and q.status not in STATUS_FILTERS:
            raise ValueError(f"status must be one of {', '.join(STATUS_FILTERS)}, got {q.status!r}")
        limit = max(1, min(q.limit, PAGE_ROWS))
        offset = max(0, q.offset)
        with self._lock:
            self._refresh()
            numbers = select(self.run, step=q.step, task=q.task, source=q.source, status=q.status, group=q.group)
            steps_of = self.run.episode_steps()
            rows = [listing_row(self.run, i, steps_of) for i in numbers[offset : offset + limit]]
        return {"total": len(numbers), "offset": offset, "rows": rows}

    def episode(self, number: int, *, tokens_shown: int = TOKENS_SHOWN) -> dict[str, Any]:
        """One episode, read again from its line; KeyError if there is no such episode."""
        with self._lock:
            self._refresh()
            if not 0 <= number < len(self.run.episodes):
                raise KeyError(number)
            trajectory = self.run.episodes.read(number)
            steps_of = self.run.episode_steps()
            step = steps_of[number]
            group = [
                {
                    "n": i,
                    "sample_index": self.run.episodes.head(i)["sample_index"],
                    "passed": self.run.episodes.passed[i],
                }
                for i in select(self.run, group=self.run.episodes.group_id[number])[:64]
            ]
        page = episode_page(trajectory, self._tokenizer_now(), number=number, step=step, tokens_shown=tokens_shown)
        page["group"] = group
        return finite(page)  # type: ignore[no-any-return]

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._refreshed_at >= REFRESH_EVERY_S:
            self.run.refresh()
            self._refreshed_at = time.monotonic()

    def _warm(self) -> None:
        with self._lock:
            self._refresh()
        self._tokenizer_now()

    def _tokenizer_now(self) -> Tokenizer | None:
        with self._tokenizer_lock:
            return self._load_tokenizer()

    def _load_tokenizer(self) -> Tokenizer | None:
        if not self._tokenizer_loaded:
            name = self.model or self.run.model_for_tokens()
            if name is None:
                self._tokenizer_note = "no model named in the run's config: `sandrl view RUN_DIR --model MODEL`"
            else:
                try:
                    self._tokenizer = model_tokenizer(name)
                except (SandrlError, OSError, ValueError) as exc:
                    self._tokenizer_note = f"the tokenizer of {name} did not load ({exc}): `--model MODEL`"
                else:
                    if self._tokenizer is None:
                        self._tokenizer_note = f"{name} has no tokenizer files: `sandrl view RUN_DIR --model MODEL`"
                    else:
                        self._tokenizer_note = name
            self._tokenizer_loaded = True
        return self._tokenizer

    def _tokenizer_status(self) -> dict[str, Any]:
        return {"loaded": self._tokenizer is not None, "note": self._tokenizer_note}
