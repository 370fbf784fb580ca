"""One episode as the viewer's page shows it: turns as text, the verifier's word, the tokens as trained.

Everything here came from a model or a sandbox and is hostile: each text is cut to a bound (its
head and its tail, where the answer is) and sent as JSON data; the page sets it as text, never
as markup (``sandrl/view/assets/viewer.js``). Control characters other than newlines and tabs
are written as escapes (``\\x1b``), so an ANSI sequence shows as what it is.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Sequence
from typing import Any

from sandrl.inference.tokenizer import Tokenizer
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.trackers.episodes import printable

TEXT_CHARS = 20_000
"""Characters shown of one text (a reply, a command's output, the verifier's output)."""
TOKENS_SHOWN = 12_000
"""Tokens shown in the token view: the first quarter and the rest from the end."""
TOOL_CALL_CHARS = 4_000


def episode_page(
    trajectory: Trajectory,
    tokenizer: Tokenizer | None,
    *,
    number: int,
    step: int | None,
    tokens_shown: int = TOKENS_SHOWN,
) -> dict[str, Any]:
    """The page's data for one episode (``number`` is its line in ``rollouts.jsonl``, 0-based)."""
    t = trajectory
    text = _Decoder(tokenizer, t.ids)
    turns = []
    for turn in t.turns:
        turns.append(
            {
                "index": turn.index,
                "reply": text.span(turn.output_start, turn.output_end),
                "tool_calls": [_tool_call(c) for c in turn.tool_calls or []][:32],
                "command": bounded(turn.command) if turn.command is not None else None,
                "exit_code": turn.exit_code,
                "timed_out": turn.timed_out,
                "output": text.span(turn.observation_start, turn.observation_end),
                "output_truncated": turn.output_truncated,
                "finish_reason": turn.finish_reason,
                "weight_version": turn.weight_version,
                "context_tokens": turn.context_tokens,
                "output_tokens": turn.output_end - turn.output_start,
                "model_s": turn.model_s,
                "command_s": turn.command_s,
                "sandbox_wait_s": turn.sandbox_wait_s,
            }
        )
    verifier = dict(t.verifier)
    return {
        "number": number,
        "step": step,
        "episode_id": printable(t.episode_id)[:300],
        "group_id": printable(t.group_id)[:300],
        "task_id": printable(t.task_id)[:300],
        "task_set": printable(t.task_set)[:300],
        "sample_index": t.sample_index,
        "agent": printable(t.agent)[:100],
        "status": t.status,
        "stop_reason": t.stop_reason,
        "reward": t.reward,
        "passed": t.passed,
        "attempt": t.attempt,
        "engine_moves": t.engine_moves,
        "weight_version": t.weight_version,
        "image": printable(t.image or "")[:300],
        "sandbox_id": printable(t.sandbox_id or "")[:100],
        "started_at": t.started_at,
        "timings": t.timings.to_dict(),
        "error": _error(t.error.to_dict()) if t.error else None,
        "retried_errors": [_error(e.to_dict()) for e in t.retried_errors][:16],
        "prompt": text.span(0, min(t.prompt_len, len(t.ids))),
        "turns": turns,
        "verifier": {
            "exit_code": verifier.get("exit_code"),
            "timed_out": verifier.get("timed_out"),
            "duration_s": verifier.get("duration_s"),
            "error": bounded(str(verifier["error"])) if verifier.get("error") else None,
            "output": bounded(str(verifier.get("stdout_tail") or verifier.get("output") or "")),
            "details": bounded(_json_text(verifier.get("details"))) if verifier.get("details") else None,
        },
        "tokens": text.tokens(t.loss_mask, t.token_weight_versions(), t.logprobs, tokens_shown),
        "decoded": tokenizer is not None,
    }


def bounded(text: str, limit: int = TEXT_CHARS) -> str:
    """``text`` with control characters escaped, cut to ``limit`` (a quarter from its head, the rest from its tail)."""
    shown = printable(text, keep="\n\t")
    if len(shown) <= limit:
        return shown
    head = limit // 4
    return f"{shown[:head]}\n[... {len(shown) - limit} characters cut here ...]\n{shown[-(limit - head) :]}"


class _Decoder:
    """Text of spans of one episode's ids, and its ids as pieces; bounded, never raising."""

    def __init__(self, tokenizer: Tokenizer | None, ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = ids

    def span(self, start: int, end: int) -> str:
        start, end = max(0, start), min(len(self.ids), end)
        if end <= start:
            return ""
        if self.tokenizer is None:
            return f"({end - start} tokens; no tokenizer to decode them: `sandrl view --model MODEL`)"
        # A span decodes from its ends only: the text shown is bounded whatever the span's length.
        limit = TEXT_CHARS * 2
        try:
            if end - start <= 2 * limit:
                return bounded(self.tokenizer.decode(list(self.ids[start:end])))
            head = self.tokenizer.decode(list(self.ids[start : start + limit]))
            tail = self.tokenizer.decode(list(self.ids[end - limit : end]))
        except Exception as exc:  # ids a tokenizer cannot decode are the episode's problem, not the page's
            return f"({end - start} tokens; not decodable: {type(exc).__name__})"
        return bounded(f"{head}\n[... {end - start} tokens in all ...]\n{tail}")

    def tokens(
        self, mask: Sequence[int], versions: Sequence[int | None], logprobs: Sequence[float], shown: int
    ) -> dict[str, Any]:
        """The ids as trained: ``[piece, trained (0/1), version, logprob, id]`` per token shown."""
        n = len(self.ids)
        if n <= shown:
            ranges = [(0, n)]
        else:
            head = shown // 4
            ranges = [(0, head), (n - (shown - head), n)]
        parts = []
        for start, end in ranges:
            parts.append({"start": start, "rows": self._rows(start, end, mask, versions, logprobs)})
        return {"count": n, "parts": parts}

    def _rows(
        self, start: int, end: int, mask: Sequence[int], versions: Sequence[int | None], logprobs: Sequence[float]
    ) -> list[list[Any]]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        rows: list[list[Any]] = []
        for i in range(start, end):
            token = self.ids[i]
            piece = self._piece(decoder, token)
            trained = int(mask[i]) if i < len(mask) else 0
            version = versions[i] if i < len(versions) else None
            logprob = float(logprobs[i]) if i < len(logprobs) and trained else None
            logprob = round(logprob, 4) if logprob is not None and math.isfinite(logprob) else logprob
            rows.append([piece, trained, version, logprob, token])
        return rows

    def _piece(self, decoder: codecs.IncrementalDecoder, token: int) -> str:
        if self.tokenizer is None:
            return f"[{token}]"
        try:
            raw = self.tokenizer.token_bytes(token)
        except Exception:  # an id outside the vocabulary: show the id
            return f"[{token}]"
        return printable(decoder.decode(raw), keep="\n\t")[:200]


def _tool_call(call: dict[str, Any]) -> dict[str, str]:
    if "error" in call:
        return {"error": bounded(str(call["error"]), TOOL_CALL_CHARS)}
    return {
        "name": bounded(str(call.get("name", "")), 200),
        "arguments": bounded(_json_text(call.get("arguments")), TOOL_CALL_CHARS),
    }


def _error(error: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": error.get("kind"),
        "phase": bounded(str(error.get("phase", "")), 100),
        "error_code": bounded(str(error.get("error_code", "")), 200),
        "message": bounded(str(error.get("message", "")), 4000),
        "retryable": error.get("retryable"),
    }


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, indent=1, default=str)
    except (TypeError, ValueError):
        return str(value)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity written as a string (``"nan"``, ``"-inf"``): JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
