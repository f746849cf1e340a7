"""The HTTP client side of the peer API: join the master, long-poll its document, poke workers."""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp
import msgspec

from rallypoint import clock, mesh, wire, wirealive, wireclock
from rallypoint.auth import NONCE_HEADER, Authenticator
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.model import ClusterDoc
from rallypoint.settings import Settings

log = logging.getLogger("rallypoint.rendezvous")

#: (host name, verified address) -> (address to connect to, peer API port).
PeerEndpoint = Callable[[str, str], tuple[str, int]]


class Exchange(msgspec.Struct, frozen=True):
    """One request's clock readings on this node (t1 and t4 of clock.py) and its nonce."""

    sent: float
    received: float
    nonce: str | None


class PeerClient:
    """Signed requests to other nodes' peer APIs over one aiohttp session.

    Every answer that carries the answering node's clock is a sample for ``offsets``; a
    request refused for its timestamp alone is sent once more on the corrected clock when
    the refusal proves itself (clock.py, docs/readiness.md#clocks).
    """

    def __init__(
        self, settings: Settings, auth: Authenticator, offsets: clock.ClockEstimate | None = None
    ) -> None:
        self.settings = settings
        self.auth = auth
        self.offsets = offsets or clock.ClockEstimate(time.time)
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
        payload, exchange = await self._signed_post(
            target, path, body, wire.MAX_JOIN_BYTES, timeout_s, connect_s=connect_s
        )
        answer = wire.parse_join_answer(payload)
        if answer.session != session:
            raise JoinRejected(
                409, "session_mismatch", f"the master answered for {answer.session!r}"
            )
        self._observe(exchange, answer.clock)
        return answer

    async def post_reports(self, target: tuple[str, int], body: bytes) -> wire.Verdict:
        """POST /v1/reports (a relay's batch), a long-poll like POST /v1/report."""
        timeout_s = self.settings.long_poll_s + self.settings.resolve_timeout_s
        payload, exchange = await self._signed_post(
            target, "/v1/reports", body, wire.MAX_REPORT_BYTES, timeout_s
        )
        verdict = wire.parse_verdict(payload)
        self._observe(exchange, verdict.clock)
        return verdict

    async def get_cluster(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        """GET /v1/cluster as a long-poll: a newer document, or None when the poll timed out."""
        query = "" if after is None else after
        answer = await self._request(
            "GET",
            target,
            "/v1/cluster",
            f"GET /v1/cluster?after={query}",
            b"",
            wire.MAX_DOC_BYTES,
            aiohttp.ClientTimeout(self.settings.long_poll_s + self.settings.resolve_timeout_s),
            params={} if after is None else {"after": after},
        )
        return None if answer is None else wire.parse_cluster_doc(answer[0])

    async def get_mesh(self, target: tuple[str, int]) -> dict[str, object]:
        """GET /v1/mesh: the master's mesh view (mesh.py), through a relay in a tree."""
        answer = await self._request(
            "GET",
            target,
            "/v1/mesh",
            "GET /v1/mesh",
            b"",
            mesh.MAX_BYTES,
            aiohttp.ClientTimeout(2 * self.settings.resolve_timeout_s),
        )
        if answer is None:
            raise PeerMessageError("GET /v1/mesh answered 204 without a mesh")
        return mesh.parse(answer[0])

    async def post_report(self, target: tuple[str, int], body: bytes) -> wire.Verdict:
        """POST /v1/report, a long-poll: the master's verdict once it differs from the one seen.

        PeerDown, JoinRejected, AuthError or PeerMessageError when it fails.
        """
        timeout_s = self.settings.long_poll_s + self.settings.resolve_timeout_s
        payload, exchange = await self._signed_post(
            target, "/v1/report", body, wire.MAX_REPORT_BYTES, timeout_s
        )
        verdict = wire.parse_verdict(payload)
        self._observe(exchange, verdict.clock)
        return verdict

    async def _signed_post(
        self,
        target: tuple[str, int],
        path: str,
        body: bytes,
        limit: int,
        timeout_s: float,
        *,
        connect_s: float | None = None,
    ) -> tuple[bytes, Exchange]:
        """POST a signed JSON body; the answer's body once its status and signature check out,
        and the exchange's clock readings (see _request)."""
        answer = await self._request(
            "POST",
            target,
            path,
            f"POST {path}",
            body,
            limit,
            aiohttp.ClientTimeout(total=timeout_s, connect=connect_s),
        )
        if answer is None:  # 204 is no answer to a POST
            raise _refusal(204, b"")
        return answer

    async def _request(
        self,
        method: str,
        target: tuple[str, int],
        path: str,
        context: str,
        body: bytes,
        limit: int,
        deadlines: aiohttp.ClientTimeout,
        *,
        params: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Exchange] | None:
        """A signed request; the answer's body and the exchange's clock readings once its
        status and signature check out, None for 204 (a long-poll that ended empty).

        Refused for its timestamp, it is sent once more on the clock the refusal corrected.
        """
        for retry in (False, True):
            headers = {"Content-Type": "application/json"} if method == "POST" else {}
            headers.update(self.auth.sign(context, body))
            sent = self.offsets.wall()
            try:
                async with self._client().request(
                    method,
                    url(target, path),
                    data=body if method == "POST" else None,
                    params=params,
                    headers=headers,
                    timeout=deadlines,
                ) as resp:
                    payload = await _read_limited(resp, limit)
                    status, answer_headers = resp.status, resp.headers
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise PeerDown(_describe(exc), cause=_cause(exc)) from exc
            if status == 204:
                return None
            exchange = Exchange(sent, self.offsets.wall(), headers.get(NONCE_HEADER))
            try:
                self._check_answer(status, path, payload, answer_headers)
            except AuthError as exc:
                if retry or not self._learn(exc, status, path, payload, answer_headers, exchange):
                    raise self._clock_error(exc) from exc
                continue
            return payload, exchange
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _check_answer(
        self, status: int, path: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify(f"200 {path}", payload, headers)

    # -- clock offsets (clock.py) ------------------------------------------------------------

    def _observe(
        self, exchange: Exchange, stamp: wireclock.ClockStamp | None, *, restart: bool = False
    ) -> bool:
        """Take the sample an authentic answer's stamp gives; whether it was taken.

        With a token the stamp must echo this request's nonce: an answer made for another
        request (another node's, replayed to us) would give a false offset.
        """
        if stamp is None:
            return False
        if self.auth.enabled and (
            exchange.nonce is None
            or stamp.nonce is None
            or not hmac.compare_digest(exchange.nonce.encode(), stamp.nonce.encode())
        ):
            return False
        taken = clock.sample(
            exchange.sent, stamp.received, stamp.answered, exchange.received, stamp.source
        )
        if taken is None:
            return False
        before = self.offsets.offset_s
        self.offsets.add(taken, restart=restart)
        if abs(self.offsets.offset_s - before) >= clock.CLOCK_WARN_S:
            log.info(
                "clock_offset",
                extra={
                    "offset_s": round(self.offsets.offset_s, 3),
                    "rtt_s": round(taken.rtt_s, 6),
                    "source": taken.source,
                },
            )
        return True

    def _learn(
        self,
        exc: AuthError,
        status: int,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        exchange: Exchange,
    ) -> bool:
        """Whether an answer refused for its clock (``exc``) gave a sample worth a retry: its
        signature is good and its stamp echoes our nonce (then its age does not matter)."""
        if exc.skew_s is None:
            return False
        try:
            data = json.loads(payload)
            stamp = wireclock.stamp_from(
                data.get("clock") if isinstance(data, dict) else None, "answer"
            )
        except (ValueError, RecursionError, PeerMessageError):
            return False
        if stamp is None:
            return False
        if self.auth.enabled:
            if exchange.nonce is None or stamp.nonce is None:
                return False
            try:
                self.auth.verify_echo(
                    f"{status} {path}", payload, headers, sent=exchange.nonce, echoed=stamp.nonce
                )
            except AuthError:
                return False
        # Refused for its clock: whatever was measured before is wrong now (the clock stepped).
        return self._observe(exchange, stamp, restart=True)

    def _clock_error(self, exc: AuthError) -> AuthError:
        """``exc``, or for a clock refusal one whose skew_s is this node's clock minus the
        peer's, whichever end refused (the reason says which: refused, or stale here)."""
        if exc.skew_s is None:
            return exc
        ours = exc.skew_s if exc.reason == "refused" else -exc.skew_s
        return AuthError(str(exc), reason=exc.reason, skew_s=ours)

    async def post_alive(
        self, target: tuple[str, int], body: bytes, timeout_s: float
    ) -> wirealive.AliveAnswer:
        """POST /v1/alive, a keep-alive; PeerDown (with its cause), JoinRejected, AuthError or
        PeerMessageError when it fails."""
        payload, _exchange = await self._signed_post(
            target, "/v1/alive", body, wirealive.MAX_ANSWER_BYTES, timeout_s,
            connect_s=timeout_s,
        )  # fmt: skip
        return wirealive.parse_answer(payload)

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
    data: object = None
    with contextlib.suppress(ValueError, RecursionError):
        data = json.loads(payload)
    if isinstance(data, dict):
        message = str(data.get("error", message))
        code = str(data.get("code", code))
    if status == 401:
        # Our clock minus the peer's, as the peer measured it (server/common.py); shown, never
        # acted on unless the refusal proves itself (PeerClient._learn).
        skew = data.get("skew_s") if isinstance(data, dict) else None
        return AuthError(
            f"the peer refused our signature: {message}",
            reason="refused",
            skew_s=_finite(skew),
        )
    return JoinRejected(status, code, f"refused with HTTP {status}: {message}", said=message)


def _finite(value: object) -> float | None:
    """A JSON number that is a sensible clock skew, else None."""
    try:
        return wireclock.seconds(value, "skew_s", -wireclock.MAX_OFFSET_S)
    except PeerMessageError:
        return None


async def _read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    payload = bytearray()
    async for chunk in resp.content.iter_any():
        payload += chunk
        if len(payload) > limit:
            raise PeerMessageError(f"answer larger than {limit} bytes")
    return bytes(payload)


#: Connect errors that mean no path to the peer at all, rather than a peer saying no.
_UNREACHABLE = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.EHOSTDOWN, errno.ENETDOWN}
)


def _cause(exc: BaseException) -> str:
    """What a failed request says of the peer (liveness.CAUSES)."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed_out"
    os_error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(os_error, OSError):
        if os_error.errno == errno.ECONNREFUSED:
            return "refused"
        if os_error.errno in _UNREACHABLE:
            return "unreachable"
        if os_error.errno == errno.ETIMEDOUT:
            return "timed_out"
    return "failed"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
