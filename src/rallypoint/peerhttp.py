"""The HTTP client side of the peer API: join the master, long-poll its document, poke workers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import aiohttp

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.model import ClusterDoc
from rallypoint.settings import Settings

#: (host name, verified address) -> (address to connect to, peer API port).
PeerEndpoint = Callable[[str, str], tuple[str, int]]


class PeerClient:
    """Signed requests to other nodes' peer APIs over one aiohttp session."""

    def __init__(self, settings: Settings, auth: Authenticator) -> None:
        self.settings = settings
        self.auth = auth
        self._http: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """Start the HTTP session (inside a running event loop)."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.resolve_timeout_s)
        )

    async def close(self) -> None:
        """Close the HTTP session; closing twice is safe."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("Rendezvous used outside its async context")
        return self._http

    async def post_join(
        self,
        target: tuple[str, int],
        body: bytes,
        session: str,
        path: str = "/v1/join",
        *,
        connect_s: float | None = None,
    ) -> wire.JoinAnswer:
        """POST /v1/join (or a relay's batch to /v1/joins); PeerDown, JoinRejected, AuthError
        or PeerMessageError when it fails. ``connect_s`` caps the connect alone."""
        timeout_s = self.settings.resolve_timeout_s
        payload = await self._signed_post(
            target, path, body, wire.MAX_JOIN_BYTES, timeout_s, connect_s=connect_s
        )
        answer = wire.parse_join_answer(payload)
        if answer.session != session:
            raise JoinRejected(
                409, "session_mismatch", f"the master answered for {answer.session!r}"
            )
        return answer

    async def post_reports(self, target: tuple[str, int], body: bytes) -> wire.Verdict:
        """POST /v1/reports (a relay's batch), a long-poll like POST /v1/report."""
        timeout_s = self.settings.long_poll_s + self.settings.resolve_timeout_s
        payload = await self._signed_post(
            target, "/v1/reports", body, wire.MAX_REPORT_BYTES, timeout_s
        )
        return wire.parse_verdict(payload)

    async def get_cluster(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        """GET /v1/cluster as a long-poll: a newer document, or None when the poll timed out."""
        query = "" if after is None else after
        headers = self.auth.sign(f"GET /v1/cluster?after={query}", b"")
        params = {} if after is None else {"after": after}
        timeout = aiohttp.ClientTimeout(
            total=self.settings.long_poll_s + self.settings.resolve_timeout_s
        )
        try:
            async with self._client().get(
                url(target, "/v1/cluster"), params=params, headers=headers, timeout=timeout
            ) as resp:
                payload = await _read_limited(resp, wire.MAX_DOC_BYTES)
                status, answer_headers = resp.status, resp.headers
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PeerDown(_describe(exc)) from exc
        if status == 204:
            return None
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify("200 /v1/cluster", payload, answer_headers)
        return wire.parse_cluster_doc(payload)

    async def post_report(self, target: tuple[str, int], body: bytes) -> wire.Verdict:
        """POST /v1/report, a long-poll: the master's verdict once it differs from the one seen.

        PeerDown, JoinRejected, AuthError or PeerMessageError when it fails.
        """
        timeout_s = self.settings.long_poll_s + self.settings.resolve_timeout_s
        payload = await self._signed_post(
            target, "/v1/report", body, wire.MAX_REPORT_BYTES, timeout_s
        )
        return wire.parse_verdict(payload)

    async def _signed_post(
        self,
        target: tuple[str, int],
        path: str,
        body: bytes,
        limit: int,
        timeout_s: float,
        *,
        connect_s: float | None = None,
    ) -> bytes:
        """POST a signed JSON body; the answer's body once its status and signature check out."""
        headers = {"Content-Type": "application/json"}
        headers.update(self.auth.sign(f"POST {path}", body))
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_s)
        try:
            async with self._client().post(
                url(target, path), data=body, headers=headers, timeout=timeout
            ) as resp:
                payload = await _read_limited(resp, limit)
                status, answer_headers = resp.status, resp.headers
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PeerDown(_describe(exc)) from exc
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify(f"200 {path}", payload, answer_headers)
        return payload

    async def post_poke(self, target: tuple[str, int], body: bytes, timeout_s: float) -> bool:
        """POST /v1/poke; whether the worker accepted it, PeerDown when it was not reached."""
        headers = {"Content-Type": "application/json"}
        headers.update(self.auth.sign("POST /v1/poke", body))
        try:
            async with self._client().post(
                url(target, "/v1/poke"),
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(timeout_s),
            ) as resp:
                await resp.read()
                return resp.status < 300
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PeerDown(_describe(exc)) from exc


def url(target: tuple[str, int], path: str) -> str:
    """The URL of ``path`` on a peer API at ``target`` (address, port), IPv6 bracketed."""
    host, port = target
    if ":" in host:
        host = f"[{host.replace('%', '%25')}]"
    return f"http://{host}:{port}{path}"


def _refusal(status: int, payload: bytes) -> Exception:
    message = payload[:300].decode("utf-8", "replace")
    code = f"http_{status}"
    with contextlib.suppress(ValueError):
        data = json.loads(payload)
        if isinstance(data, dict):
            message = str(data.get("error", message))
            code = str(data.get("code", code))
    if status == 401:
        return AuthError(f"the peer refused our signature: {message}", reason="refused")
    return JoinRejected(status, code, f"refused with HTTP {status}: {message}")


async def _read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    payload = bytearray()
    async for chunk in resp.content.iter_any():
        payload += chunk
        if len(payload) > limit:
            raise PeerMessageError(f"answer larger than {limit} bytes")
    return bytes(payload)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
