"""A stand-in engine process for the launcher's tests: standard library only, so it starts at once.

``python standin_engine.py --port P [--child] [--exit-now] [ANY OTHER ARGS]`` serves ``GET /health``
and ``POST /generate`` (an SGLang-shaped answer) on 127.0.0.1:P and logs one line per request to
stdout. ``--child`` first starts a child of its own (``sleep``, in its process group), as SGLang's and
vLLM's workers are; ``--exit-now`` prints an error and exits 2, as an engine given a bad flag does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        print(f"request {self.command} {self.path}", flush=True)

    def _answer(self, status: int, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        meta = {"output_token_logprobs": [[-0.5, 7, None]], "finish_reason": "length"}
        self._answer(200, {"text": "", "meta_info": meta})


def main(argv: list[str]) -> int:
    port = int(argv[argv.index("--port") + 1])
    if "--exit-now" in argv:
        print("error: unrecognized arguments: --exit-now (a stand-in's bad flag)", flush=True)
        return 2
    if "--child" in argv:
        child = subprocess.Popen(["sleep", "600"])
        print(f"child {child.pid}", flush=True)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"serving on {port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
