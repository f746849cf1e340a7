"""Blocking client for the local API, used by `wait`, `env`, `check`, `exec` and `status`."""

from __future__ import annotations

import contextlib
import http.client
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from rallypoint import localapi
from rallypoint.core.backoff import Backoff
from rallypoint.errors import (
    HostfileError,
    NotReady,
    PeerMessageError,
    RallypointError,
    RendezvousTimeout,
    SidecarError,
    SidecarUnreachable,
    WriteRefused,
)
from rallypoint.wire import fields, jobstates, local

T = TypeVar("T")

#: Extra seconds a request may take beyond the long-poll it asked the server for.
_MARGIN_S = 5.0
#: Longest single long-poll; a wait loops over several so a restarted sidecar is noticed.
POLL_S = 30.0

# The local API is on loopback: never send it through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Answer(msgspec.Struct, frozen=True):
    """One HTTP answer from the local API."""

    status: int
    body: str


def local_url(host: str, port: int) -> str:
    """The base URL of the local API listening on host:port; wildcard hosts mean loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _where(base_url: str) -> str:
    """host:port of a base URL, for messages."""
    return urllib.parse.urlsplit(base_url).netloc or base_url


def get(
    base_url: str,
    path: str,
    *,
    timeout_s: float,
    body: bytes | None = None,
    proof: str | None = None,
) -> Answer:
    """GET base_url + path (POST with ``body``, proving the session token with ``proof``);
    SidecarUnreachable when nothing answers in time."""
    url = base_url.rstrip("/") + path
    where = _where(base_url)
    request = urllib.request.Request(url, data=body)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if proof is not None:
        request.add_header("Authorization", f"Bearer {proof}")
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return Answer(response.status, response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, exc.read().decode("utf-8", "replace"))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise SidecarUnreachable(
                f"no sidecar answers on {where}: start `rallypoint serve`"
                " (or point --url / --local-port at the one that runs)"
            ) from exc
        if isinstance(exc.reason, TimeoutError):
            raise SidecarUnreachable(
                f"the sidecar on {where} did not answer within {timeout_s:g}s:"
                " check that it runs and is not overloaded"
            ) from exc
        raise SidecarUnreachable(
            f"cannot reach the sidecar on {where}: {exc.reason}: check --url / --local-port"
        ) from exc
    except TimeoutError as exc:
        raise SidecarUnreachable(
            f"the sidecar on {where} did not answer within {timeout_s:g}s:"
            " check that it runs and is not overloaded"
        ) from exc
    except (ConnectionError, http.client.HTTPException) as exc:
        # A sidecar that is starting or stopping may drop the connection mid-answer.
        raise SidecarUnreachable(
            f"the sidecar on {where} dropped the connection ({type(exc).__name__}):"
            " it may be starting or stopping"
        ) from exc


def reason_docs(body: str) -> list[dict[str, object]]:
    """The reasons of a 503 answer as the local API gives them ({"code", "message", ...}).

    A JSON body without reasons gives its "error" (wire/local.NotReadyAnswer, ErrorAnswer);
    a text body (/readyz) its first line, whose "(+N more, see /status)" becomes a "more"
    count.
    """
    data = body.encode()
    with contextlib.suppress(PeerMessageError):
        reasons = _load(data, local.NotReadyAnswer, "503").reasons
        if reasons:
            return [reason.as_json() for reason in reasons]
    with contextlib.suppress(PeerMessageError):
        return [{"message": _load(data, local.ErrorAnswer, "503").error}]
    first = body.strip().splitlines()[0] if body.strip() else ""
    first = first.removeprefix("not ready: ")  # /readyz says so already
    if not first:
        return [{"message": "no reason given"}]
    found = _MORE.search(first)
    if found is None:
        return [{"message": first}]
    return [{"message": first[: found.start()], "more": int(found.group(1))}]


#: /readyz's count of the reasons its one line leaves out.
_MORE = re.compile(r" \(\+(\d+) more, see /status\)$")


def _reason(reason: Mapping[str, object]) -> str:
    """One reason of the local API ({"code", "message", ...}) as `code: message`."""
    code = reason.get("code")
    return f"{code}: {reason.get('message')}" if code else str(reason.get("message"))


def first_reason(reasons: Sequence[Mapping[str, object]]) -> str:
    """The first reason, with how many more there are and where to read them.

    A reason's message carries its own remedy, so the first one is said whole and the others
    are only counted: one cause and one remedy per line.
    """
    if not reasons:
        return "no reason given"
    hidden = len(reasons) - 1
    more = reasons[0].get("more")
    if isinstance(more, int):
        hidden += more
    tail = f" (+{hidden} more, see `rallypoint status`)" if hidden > 0 else ""
    return _reason(reasons[0]) + tail


def _not_ready(base_url: str, body: str) -> NotReady:
    docs = reason_docs(body)
    return NotReady(
        f"the sidecar on {_where(base_url)} is not ready: {first_reason(docs)}",
        reasons=tuple(docs),
    )


#: The codes of the refusals a route may give, and what each is here (exit 2: the hostfile's).
_REFUSALS: dict[str, type[RallypointError]] = {
    "no_hostfile": HostfileError,
    "no_master": SidecarError,
    "discovering": SidecarError,
}


def call(
    base_url: str,
    route: localapi.LocalRoute[Any],
    *,
    timeout_s: float,
    query: Mapping[str, str] | None = None,
    body: bytes | None = None,
    proof: str | None = None,
) -> Answer:
    """One request of a local route (localapi.py), answered with a status its row names.

    NotReady for a gated route's 503, WriteRefused for a write's 403 (the session token:
    retrying cannot help), the error a refusal's code names (HostfileError for
    ``no_hostfile``), SidecarError for any other status. ``proof`` is sent on the writes only
    (auth.Authenticator.local_proof; None without a token).
    """
    path = route.path + ("?" + urllib.parse.urlencode(query) if query else "")
    sent = proof if route.write else None
    answer = get(base_url, path, timeout_s=timeout_s, body=body, proof=sent)
    if answer.status in route.answered:
        return answer
    if answer.status == 503 and route.gated:
        raise _not_ready(base_url, answer.body)
    refusal = _refusal(answer)
    if answer.status == 403 and route.write:
        said = answer.body.strip()[:200] if refusal is None else refusal.error
        raise WriteRefused(f"the sidecar on {_where(base_url)} refused {route.context}: {said}")
    if refusal is not None and refusal.code in _REFUSALS:
        raise _REFUSALS[refusal.code](refusal.error)
    first = answer.body.strip().splitlines()[0][:200] if answer.body.strip() else ""
    raise SidecarError(
        f"{route.method} {path} on {_where(base_url)} answered {answer.status} {first!r}:"
        " is a rallypoint sidecar of the same version listening there?"
    )


def _refusal(answer: Answer) -> local.ErrorAnswer | None:
    """The one-line JSON error an answer carries, if it is one."""
    try:
        return _load(answer.body.encode(), local.ErrorAnswer, "error")
    except PeerMessageError:
        return None


def fetch(
    base_url: str,
    route: localapi.LocalRoute[T],
    *,
    timeout_s: float,
    query: Mapping[str, str] | None = None,
    body: bytes | None = None,
    proof: str | None = None,
) -> T:
    """One request of a JSON route (``call``), its answer decoded into the row's type."""
    answer = call(base_url, route, timeout_s=timeout_s, query=query, body=body, proof=proof)
    assert route.body is not None, f"{route.context} answers no JSON"
    return decode(base_url, route, answer, route.body)


def _load(body: bytes, kind: type[T], what: str) -> T:
    """The ``kind`` in an answer's body, every field checked (PeerMessageError when not)."""
    return fields.load(body, kind, local.MAX_ANSWER_BYTES, what)


def decode(base_url: str, route: localapi.LocalRoute[Any], answer: Answer, kind: type[T]) -> T:
    """An answer of ``route`` as a ``kind``; SidecarError, one line naming the route and what
    is wrong, when it is not one."""
    what = f"{route.context} on {_where(base_url)} answered {answer.status}"
    try:
        return _load(answer.body.encode(), kind, what)
    except PeerMessageError as exc:
        raise SidecarError(
            f"{exc}: is a rallypoint sidecar of the same version listening there?"
        ) from None


def fetch_env(
    base_url: str, fmt: str = "json", wait_s: float = 0.0, *, timeout_s: float = _MARGIN_S
) -> str:
    """The rendered env from GET /env; NotReady when the sidecar is not ready after wait_s."""
    return _when_ready(base_url, localapi.ENV, wait_s, timeout_s, {"format": fmt})


def env_values(body: str) -> dict[str, str]:
    """GET /env?format=json's body as a dict; SidecarError when it is not one of strings."""
    return decode("the sidecar", localapi.ENV, Answer(200, body), local.EnvValues)


def fetch_hostfile(base_url: str, wait_s: float = 0.0, *, timeout_s: float = _MARGIN_S) -> str:
    """The hostfile from GET /hostfile; NotReady when not ready after wait_s.

    HostfileError (exit 2) when the sidecar has no slot count to write (answer 409).
    """
    return _when_ready(base_url, localapi.HOSTFILE, wait_s, timeout_s, {})


def _when_ready(
    base_url: str,
    route: localapi.LocalRoute[Any],
    wait_s: float,
    timeout_s: float,
    query: dict[str, str],
) -> str:
    """A gated route's text once ready, waiting up to ``wait_s`` for it (?wait=)."""
    if wait_s > 0:
        query["wait"] = f"{wait_s:.3f}"
    return call(base_url, route, query=query, timeout_s=timeout_s + wait_s).body


def readyz(base_url: str, *, timeout_s: float = 2.0) -> str:
    """The body of GET /readyz when ready; NotReady with the reason otherwise."""
    return call(base_url, localapi.READYZ, timeout_s=timeout_s).body


def status(base_url: str, *, timeout_s: float = _MARGIN_S) -> local.StatusView:
    """GET /status as the CLI reads it (served whether ready or not)."""
    return fetch(base_url, localapi.STATUS, timeout_s=timeout_s)


def status_document(base_url: str, *, timeout_s: float = _MARGIN_S) -> dict[str, Any]:
    """The whole /status document, every section as the sidecar wrote it."""
    answer = call(base_url, localapi.STATUS, timeout_s=timeout_s)
    return decode(base_url, localapi.STATUS, answer, dict[str, Any])


def mesh(base_url: str, *, timeout_s: float = 3 * _MARGIN_S) -> dict[str, Any]:
    """The mesh from GET /mesh (the master's view); SidecarError saying why when there is none.

    A node other than the master asks the master for it, hence the longer timeout.
    """
    return fetch(base_url, localapi.MESH, timeout_s=timeout_s)


def job(base_url: str, after: int | None = None, wait_s: float = 0.0) -> jobstates.JobView:
    """GET /job: the supervised job on every node; with ``after``, once its version passed it."""
    query = None if after is None else {"after": str(after), "wait": f"{wait_s:.3f}"}
    return fetch(base_url, localapi.JOB, query=query, timeout_s=_MARGIN_S + wait_s)


def report_job(
    base_url: str, body: bytes, *, proof: str | None = None, timeout_s: float = _MARGIN_S
) -> jobstates.JobView:
    """POST /job: this node's job started or ended; the job view once the report went on.

    ``proof``: the session token's local proof, None without a token."""
    return fetch(base_url, localapi.JOB_REPORT, body=body, proof=proof, timeout_s=timeout_s)


def report_progress(
    base_url: str, body: bytes, *, proof: str | None = None, timeout_s: float = _MARGIN_S
) -> None:
    """POST /job/progress: the job's latest progress mark (``proof`` as for report_job)."""
    call(base_url, localapi.PROGRESS, body=body, proof=proof, timeout_s=timeout_s)


def wait_env(
    base_url: str,
    fmt: str,
    timeout_s: float | None,
    *,
    backoff_initial_s: float = 0.05,
    backoff_max_s: float = 2.0,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    watch: Callable[[NotReady | SidecarUnreachable], None] | None = None,
) -> str:
    """Block until /env answers 200 and return it; RendezvousTimeout after timeout_s (None: never).

    Connection failures are retried with capped exponential backoff, because the sidecar
    may still be starting; a 503 is retried with a long-poll (?wait=) so readiness is
    seen at once. An answer outside the contract (SidecarError) ends the wait. ``watch``
    is called with every failed round's error, as it happens (progress lines).
    """
    deadline = None if timeout_s is None else clock() + timeout_s
    # No jitter: one process waits for its own sidecar, there is no crowd to spread.
    backoff = Backoff(backoff_initial_s, backoff_max_s, jitter="none")
    last: str = "no answer yet"
    while True:
        remaining = poll_s if deadline is None else deadline - clock()
        if remaining <= 0:
            # `last` is a cause with its remedy (a reason's message carries one): nothing added.
            raise RendezvousTimeout(f"not ready after {timeout_s}s: {last}")
        wait_s = min(remaining, poll_s)
        started = clock()
        try:
            return fetch_env(base_url, fmt, wait_s)
        except SidecarUnreachable as exc:
            last = str(exc)
            if watch is not None:
                watch(exc)
        except NotReady as exc:
            last = first_reason(exc.reasons)
            if watch is not None:
                watch(exc)
            # A server that answered long before the long-poll ended (it ignores ?wait, or
            # it restarted) must not be hammered.
            if clock() - started >= wait_s / 2:
                backoff.reset()
                continue
        sleep(backoff.next_s(None if deadline is None else deadline - clock()))
