"""The wire of each route ``sandrl bench gateway`` drives a conversation through, plain or streamed.

Each API is how a harness speaks it: the request of a turn from the history so far, and the answer read
back into the reply the harness appends (the whole history is sent every turn) and the gateway's own
time on the call (``session.gateway_ms``). Streamed answers are read from their events as the vendors'
clients read them: OpenAI's chunks (the text deltas; ``session`` on the last chunk), Anthropic's events
(``text_delta``; ``session`` on ``message_start``), OpenAI Responses' events (``response.completed``
holds the whole response).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

APIS = ("chat", "messages", "responses")
SYSTEM = "You are a shell agent."


@dataclass
class Conversation:
    """One session's history in its API's own shape."""

    api: str
    stream: bool
    index: int
    history: list[dict[str, Any]]

    @classmethod
    def start(cls, api: str, stream: bool, index: int) -> Conversation:
        task = f"Task {index}: list the files."
        if api == "chat":
            history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        elif api == "messages":
            history = [{"role": "user", "content": task}]
        else:
            history = [{"type": "message", "role": "user", "content": task}]
        return cls(api, stream, index, history)

    def path(self) -> str:
        return {"chat": "/chat/completions", "messages": "/v1/messages", "responses": "/responses"}[self.api]

    def body(self, max_tokens: int) -> dict[str, Any]:
        """The turn's request: greedy, so the direct path does the same work."""
        if self.api == "chat":
            body: dict[str, Any] = {"model": "tiny", "messages": self.history, "max_tokens": max_tokens}
        elif self.api == "messages":
            body = {"model": "tiny", "system": SYSTEM, "messages": self.history, "max_tokens": max_tokens}
        else:
            body = {"model": "tiny", "instructions": SYSTEM, "input": self.history, "max_output_tokens": max_tokens}
        return {**body, "temperature": 0, "stream": self.stream}

    def take(self, raw: bytes, turn: int) -> float:
        """Read an answer: append the reply and the next user message; return the gateway's ms on the call."""
        if self.api == "chat":
            text, gateway_ms = _chat(raw, self.stream)
            self.history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {turn}"}]
        elif self.api == "messages":
            text, gateway_ms = _messages(raw, self.stream)
            blocks = [{"type": "text", "text": text}] if text else []
            self.history += [{"role": "assistant", "content": blocks}, {"role": "user", "content": f"next {turn}"}]
        else:
            output, gateway_ms = _responses(raw, self.stream)
            self.history += [*output, {"type": "message", "role": "user", "content": f"next {turn}"}]
        return gateway_ms


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, in order (``[DONE]`` dropped)."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _chat(raw: bytes, stream: bool) -> tuple[str, float]:
    if not stream:
        answer = json.loads(raw)
        return answer["choices"][0]["message"]["content"] or "", float(answer["session"]["gateway_ms"])
    chunks = _events(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    session = next(c["session"] for c in reversed(chunks) if "session" in c)
    return text, float(session["gateway_ms"])


def _messages(raw: bytes, stream: bool) -> tuple[str, float]:
    if not stream:
        answer = json.loads(raw)
        text = "".join(b["text"] for b in answer["content"] if b["type"] == "text")
        return text, float(answer["session"]["gateway_ms"])
    events = _events(raw)
    started = next(e for e in events if e["type"] == "message_start")
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    text = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    return text, float(started["message"]["session"]["gateway_ms"])


def _responses(raw: bytes, stream: bool) -> tuple[list[dict[str, Any]], float]:
    if stream:
        done = [e for e in _events(raw) if e["type"] in ("response.completed", "response.incomplete")]
        response = done[-1]["response"]
    else:
        response = json.loads(raw)
    return list(response["output"]), float(response["session"]["gateway_ms"])
