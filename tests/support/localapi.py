"""A scripted local API on loopback: what `wait`, `env`, `check` and `status` talk to in tests."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rallypoint.served import render

VALUES = {
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "29555",
    "NNODES": "2",
    "NODE_RANK": "1",
    "TF_CONFIG": '{"cluster":{"worker":["a:1","b:2"]},"task":{"type":"worker","index":1}}',
}
REASONS = [{"code": "waiting_for_peers", "message": "1 of 2 nodes joined", "ranks": [0]}]
STATUS = {
    "ready": False,
    "generation": "g7",
    "role": "worker",
    "spec": {"provider": "explicit", "session": "s1", "nnodes": 2, "rank": 1, "master": "n0"},
    "peers": [
        {"rank": 0, "host": "n0", "joined": True, "addresses": ["10.1.2.3"], "verdict": "ok",
         "resolved": ["10.1.2.3"], "detail": None, "tf_port": None},
        {"rank": 1, "host": "n1", "joined": False, "addresses": [], "verdict": "not_found",
         "resolved": [], "detail": "n1 does not resolve", "tf_port": None},
    ],
    "reasons": REASONS,
    "warnings": ["peer messages are not authenticated"],
    "overrides": [{"key": "MASTER_PORT", "value": "29555", "derived": "29500", "source": "--set"}],
    "ports": {"master": {"port": 29555, "held": True, "skipped": []}},
}  # fmt: skip


class FakeLocalAPI:
    """A scripted local API: not ready for the first `ready_after` /env requests, then ready."""

    def __init__(self, port: int = 0, *, ready_after: int = 0, status: int | None = None) -> None:
        self.ready_after = ready_after
        self.forced_status = status
        self.paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.paths.append(self.path)
                code, body = fake.answer(self.path)
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def ready(self) -> bool:
        return sum(path.startswith("/env") for path in self.paths) > self.ready_after

    def answer(self, path: str) -> tuple[int, str]:
        if self.forced_status is not None:
            return self.forced_status, "<html>nope</html>"
        route, _, query = path.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        if route == "/env":
            if self.ready:
                return 200, render.render(VALUES, params.get("format", "json"))
            time.sleep(min(float(params.get("wait", 0)), 0.05))  # a short long-poll
            return 503, json.dumps({"ready": False, "reasons": REASONS})
        if route == "/readyz":
            return (200, "ready\n") if self.ready_after < 0 else (503, "not ready: starting: x\n")
        if route == "/status":
            return 200, json.dumps(STATUS)
        return 404, "{}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
