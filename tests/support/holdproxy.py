"""A loopback proxy to a local API that holds one request back: a report that reaches the
sidecar late, after the ones sent behind it (a sidecar starved of CPU, a slow accept)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def _request(conn: socket.socket) -> bytes:
    """One whole HTTP request (its headers, then the body its Content-Length gives)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class HoldingProxy:
    """Passes every request on to ``upstream_port`` at once, except the first whose bytes
    hold ``marker``: that one goes on ``hold_s`` seconds later (its answer then reaches a
    client that may have given up). Every connection carries one request (urllib's)."""

    def __init__(self, upstream_port: int, marker: bytes, hold_s: float) -> None:
        self.upstream_port, self.marker, self.hold_s = upstream_port, marker, hold_s
        self.held = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed: the proxy stops
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._pass_on, args=(conn,), daemon=True).start()

    def _pass_on(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = _request(conn)
            if self.marker in request and not self.held.is_set():
                self.held.set()
                time.sleep(self.hold_s)
            with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as up:
                up.sendall(request)
                while chunk := up.recv(65536):
                    conn.sendall(chunk)

    def close(self) -> None:
        self.listener.close()
