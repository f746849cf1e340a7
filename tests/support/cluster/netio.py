"""Sockets and HTTP requests made from inside a network namespace, from any thread."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.netns import NETNS_DIR

_CLONE_NEWNET = 0x40000000


def netns_socket(
    ns: str,
    family: socket.AddressFamily = socket.AF_INET,
    kind: socket.SocketKind = socket.SOCK_STREAM,
) -> socket.socket:
    """A socket created inside namespace ns; it stays there whichever thread uses it."""
    # setns(CLONE_NEWNET) switches only the calling thread, so a throwaway thread enters the
    # namespace, creates the socket and exits; the socket keeps its namespace for life.
    libc = ctypes.CDLL(None, use_errno=True)
    made: dict[str, Any] = {}

    def enter() -> None:
        try:
            with open(NETNS_DIR / ns, "rb") as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into {ns}: {os.strerror(code)}")
            made["sock"] = socket.socket(family, kind)
        except BaseException as exc:  # re-raised in the caller's thread
            made["error"] = exc

    worker = threading.Thread(target=enter, name=f"setns-{ns}")
    worker.start()
    worker.join()
    if "error" in made:
        raise made["error"]
    sock: socket.socket = made["sock"]
    return sock


class _NetnsHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection whose socket lives in a given network namespace."""

    def __init__(self, ns: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ns = ns

    def connect(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = netns_socket(self._ns, family)
        sock.settimeout(self.timeout)
        try:
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: status code, headers and body."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(ns: str, host: str, port: int, path: str, *, timeout_s: float = 5.0) -> Reply:
    """GET http://host:port/path from inside namespace ns; OSError when nothing answers."""
    conn = _NetnsHTTPConnection(ns, host, port, timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(), dict(resp.getheaders()))
    finally:
        conn.close()


def tcp_connect(ns: str, host: str, port: int, *, timeout_s: float = 2.0) -> str | None:
    """Try a TCP connect from inside ns: None on success, else the error text."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = netns_socket(ns, family)
    sock.settimeout(timeout_s)
    try:
        sock.connect((host, port))
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
    return None
