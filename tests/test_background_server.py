"""serve_on_loop: an app served on the caller's own event loop answers that loop's clients at once."""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx

from sandrl.background_server import serve_on_loop


async def _head_then_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_an_answer_in_two_writes_does_not_wait_for_a_delayed_ack() -> None:
    # Without TCP_NODELAY on the served socket the body waits for the client's ACK of the head,
    # which Linux delays by 40 ms: every call of the fleet's router paid it.
    async with serve_on_loop(_head_then_body) as url, httpx.AsyncClient() as http:
        latencies = []
        for _ in range(12):
            start = time.perf_counter()
            assert (await http.get(url)).text == "ok"
            latencies.append(time.perf_counter() - start)
    assert statistics.median(latencies) < 0.02
