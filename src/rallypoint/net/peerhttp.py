"""The HTTP client side of the peer API, driven by the route table (wire/routes.py)."""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import aiohttp
import msgspec

from rallypoint import wire
from rallypoint.auth import NONCE_HEADER, Authenticator
from rallypoint.core import clock
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.model import ClusterDoc
from rallypoint.wire import alive, routes, stamps

log = logging.getLogger("rallypoint.rendezvous")

#: Seconds a pooled connection to a peer may sit idle before it is closed here: under the
#: peer API's own keep-alive timeout (server.KEEPALIVE_S, 5 s, the least it is), so this side
#: never reuses a connection the peer is closing at that moment. aiohttp's default, 15 s,
#: lost the master's pushes that came about 5 s after the one before (ServerDisconnectedError).
IDLE_S = 4.0

#: (host name, verified address) -> (address to connect to, peer API port).
PeerEndpoint = Callable[[str, str], tuple[str, int]]


class Exchange(msgspec.Struct, frozen=True):
    """One request's clock readings on this node (t1 and t4 of core/clock.py) and its nonce."""

    sent: float
    received: float
    nonce: str | None


class PeerClient:
    """Signed requests to other nodes' peer APIs over one aiohttp session, by the route table.

    Every answer that carries the answering node's clock is a sample for ``offsets``; a
    request refused for its timestamp alone is sent once more on the corrected clock when
    the refusal proves itself (core/clock.py, docs/readiness.md#clocks). ``exchange_s`` bounds
    one exchange (and every connect), ``long_poll_s`` how long a long-poll may be held.
    """

    def __init__(
        self,
        auth: Authenticator,
        offsets: clock.ClockEstimate | None = None,
        *,
        exchange_s: float,
        long_poll_s: float,
    ) -> None:
        self.auth = auth
        self.offsets = offsets or clock.ClockEstimate(time.time)
        self.exchange_s = exchange_s
        self.long_poll_s = long_poll_s
        self._http: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """Start the HTTP session (inside a running event loop)."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.exchange_s),
            connector=aiohttp.TCPConnector(keepalive_timeout=IDLE_S),
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

    async def call(
        self,
        route: routes.Route,
        target: tuple[str, int],
        body: bytes = b"",
        *,
        timeout_s: float | None = None,
        connect_s: float | None = None,
        query: str | None = None,
    ) -> tuple[Any, Exchange] | None:
        """One request of ``route``: its answer parsed, and the exchange's clock readings;
        None for 204 (a long-poll that ended empty, a poke taken). PeerDown (with its
        cause), JoinRejected, AuthError or PeerMessageError when it fails.

        ``timeout_s`` is the whole request's deadline for a route whose caller gives it.
        """
        timeout = aiohttp.ClientTimeout(total=self._deadline(route, timeout_s), connect=connect_s)
        answer = await self._request(route, target, body, timeout, query)
        if answer is None:
            if route.method == "POST" and route.parse_answer is not None:
                raise _refusal(204, b"")  # 204 is no answer to this POST
            return None
        payload, exchange = answer
        parsed = None if route.parse_answer is None else route.parse_answer(payload)
        return parsed, exchange

    def _deadline(self, route: routes.Route, timeout_s: float | None) -> float:
        if route.deadline == "caller":
            if timeout_s is None:
                raise ValueError(f"{route.context} needs the caller's timeout_s")
            return timeout_s
        if route.deadline == "long_poll":
            return self.long_poll_s + self.exchange_s
        if route.deadline == "two_exchanges":
            return 2 * self.exchange_s
        return self.exchange_s

    async def _stamped(
        self, route: routes.Route, target: tuple[str, int], body: bytes, **kw: Any
    ) -> Any:
        """``call`` for a route whose answer carries a clock stamp: the sample is taken."""
        answer = await self.call(route, target, body, **kw)
        assert answer is not None  # a POST route with an answer: 204 raised
        parsed, exchange = answer
        self._observe(exchange, parsed.clock)
        return parsed

    async def post_join(
        self,
        target: tuple[str, int],
        body: bytes,
        session: str,
        route: routes.Route = routes.JOIN,
        *,
        connect_s: float | None = None,
    ) -> wire.JoinAnswer:
        """POST /v1/join (or a relay's batch, routes.JOINS); ``connect_s`` caps the connect.

        An answer for another session is refused before its clock is taken.
        """
        answer = await self.call(route, target, body, connect_s=connect_s)
        assert answer is not None
        joined, exchange = answer
        if joined.session != session:
            raise JoinRejected(
                409, "session_mismatch", f"the master answered for {joined.session!r}"
            )
        self._observe(exchange, joined.clock)
        return cast(wire.JoinAnswer, joined)

    async def post_report(
        self, target: tuple[str, int], body: bytes, route: routes.Route = routes.REPORT
    ) -> wire.Verdict:
        """POST /v1/report (or a relay's batch, routes.REPORTS), a long-poll: the master's
        verdict once it differs from the one seen."""
        return cast(wire.Verdict, await self._stamped(route, target, body))

    async def get_cluster(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        """GET /v1/cluster as a long-poll: a newer document, or None when the poll timed out."""
        answer = await self.call(routes.CLUSTER, target, query=after)
        return None if answer is None else cast(ClusterDoc, answer[0])

    async def get_mesh(self, target: tuple[str, int]) -> dict[str, object]:
        """GET /v1/mesh: the master's mesh view (core/mesh.py), through a relay in a tree."""
        answer = await self.call(routes.MESH, target)
        if answer is None:
            raise PeerMessageError("GET /v1/mesh answered 204 without a mesh")
        return cast(dict[str, object], answer[0])

    async def post_alive(
        self, target: tuple[str, int], body: bytes, timeout_s: float
    ) -> alive.AliveAnswer:
        """POST /v1/alive, a keep-alive, within ``timeout_s`` (the connect too)."""
        answer = await self.call(
            routes.ALIVE, target, body, timeout_s=timeout_s, connect_s=timeout_s
        )
        assert answer is not None
        return cast(alive.AliveAnswer, answer[0])

    async def post_poke(self, target: tuple[str, int], body: bytes, timeout_s: float) -> bool:
        """POST /v1/poke; whether the worker took it, PeerDown when it was not reached."""
        try:
            await self.call(routes.POKE, target, body, timeout_s=timeout_s)
        except (JoinRejected, AuthError, PeerMessageError):
            return False
        return True

    async def _request(
        self,
        route: routes.Route,
        target: tuple[str, int],
        body: bytes,
        deadlines: aiohttp.ClientTimeout,
        query: str | None,
    ) -> tuple[bytes, Exchange] | None:
        """A signed request; the answer's body and the exchange's clock readings once its
        status and signature check out, None for 204.

        Refused for its timestamp, it is sent once more on the clock the refusal corrected.
        Cut off with no answer (ServerDisconnectedError: the peer closed the connection as
        this side reused it), it is sent once more, signed anew: aiohttp resends nothing,
        and every peer message is idempotent.
        """
        post = route.method == "POST"
        context = route.signed_as(query)
        params = {} if route.query is None or query is None else {route.query: query}
        retry = resent = False
        while True:
            headers = {"Content-Type": "application/json"} if post else {}
            headers.update(self.auth.sign(context, body))
            sent = self.offsets.wall()
            try:
                async with self._client().request(
                    route.method,
                    url(target, route.path),
                    data=body if post else None,
                    params=params,
                    headers=headers,
                    timeout=deadlines,
                ) as resp:
                    payload = await _read_limited(resp, route.answer_limit)
                    status, answer_headers = resp.status, resp.headers
            except aiohttp.ServerDisconnectedError as exc:
                if resent:
                    raise PeerDown(_describe(exc), cause=_cause(exc)) from exc
                resent = True
                continue
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise PeerDown(_describe(exc), cause=_cause(exc)) from exc
            if status == 204:
                return None
            exchange = Exchange(sent, self.offsets.wall(), headers.get(NONCE_HEADER))
            path = route.path
            try:
                self._check_answer(status, path, payload, answer_headers)
            except AuthError as exc:
                if retry or not self._learn(exc, status, path, payload, answer_headers, exchange):
                    raise self._clock_error(exc) from exc
                retry = True
                continue
            return payload, exchange

    def _check_answer(
        self, status: int, path: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify(f"200 {path}", payload, headers)

    # -- clock offsets (core/clock.py) ------------------------------------------------------------

    def _observe(
        self, exchange: Exchange, stamp: clock.ClockStamp | None, *, restart: bool = False
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
            stamp = stamps.stamp_of(payload, "answer")
        except PeerMessageError:
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
            f"the peer refused our signature: {message}", reason="refused", skew_s=_finite(skew)
        )
    return JoinRejected(status, code, f"refused with HTTP {status}: {message}", said=message)


def _finite(value: object) -> float | None:
    """A JSON number that is a sensible clock skew, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # An int may be too large for a float: compare it as is (NaN fails every comparison).
    return float(value) if -clock.MAX_OFFSET_S <= value <= clock.MAX_OFFSET_S else None


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
