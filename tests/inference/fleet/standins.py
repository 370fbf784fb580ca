"""Stand-in engines for the router's tests: real HTTP servers on loopback that record what they are sent.

:class:`StandIn` answers SGLang's ``/generate`` (one token, id = the engine's number), ``/health``,
``/get_model_info`` and every other route with ``{"success": true}``, and keeps each request's
method, path, routing key and body. It can be stopped and started again on the same port (an
engine that died and was restarted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sandrl.background_server import BackgroundServer


@dataclass
class Request:
    method: str
    path: str
    key: str | None
    body: dict[str, Any]
    client_port: int = 0
    content_type: str | None = None


@dataclass
class StandIn:
    number: int
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    server: BackgroundServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StandIn:
        self.server = BackgroundServer(self, port=self.port, name=f"stand-in {self.number}").start()
        self.port = self.server.port
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        key = headers.get(b"x-smg-routing-key")
        self.requests.append(
            Request(
                scope["method"],
                scope["path"],
                key.decode() if key else None,
                json.loads(body) if body else {},
                scope["client"][1],
                headers[b"content-type"].decode() if b"content-type" in headers else None,
            )
        )
        answer: dict[str, Any] = {"success": True}
        if scope["path"] == "/generate":
            answer = {
                "text": "",
                "meta_info": {
                    "output_token_logprobs": [[-0.25, self.number, None]],
                    "finish_reason": {"type": "length"},
                    "weight_version": "0",
                    "prompt_tokens": len(json.loads(body).get("input_ids", [])),
                },
            }
        elif scope["path"] == "/get_model_info":
            answer = {"model_path": f"stand-in-{self.number}"}
        data = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})
