"""What `rallypoint run` reads of its sidecar's job view (GET /job), and the start of an
attempt: report starting, wait until every node is starting too (docs/run.md)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from rallypoint.cli import client
from rallypoint.core import jobs
from rallypoint.core.jobs import JobStatus
from rallypoint.errors import RallypointError, WriteRefused
from rallypoint.wire import jobstates
from rallypoint.wire.jobstates import JobView, ShownState

#: Seconds between attempts to reach a sidecar that does not answer.
RETRY_S = 1.0
#: Longest long-poll of GET /job while the job runs; the loop polls again.
POLL_S = 30.0
#: Longest single wait for the attempt's start; the loop looks at signals and its bound.
START_POLL_S = 1.0
#: After this long at the start, `run` says once what it waits for.
START_SAY_S = 3.0
#: How long a restart waits for its sidecar's env (it is ready when the attempt starts).
ENV_WAIT_S = 5.0
#: How long a node whose child failed waits for news of an earlier failure elsewhere.
SETTLE_S = 0.5
#: The longest it waits while a node it keeps alive with is silent (the sidecar says how long
#: until that node is named down: 15 s at the default interval); a bound against bad values.
UNSETTLED_MAX_S = 120.0


def wait_start(
    url: str,
    started: float,
    bound_s: float | None,
    *,
    proof: str | None = None,
    stopped: Callable[[], bool],
    say: Callable[[str], None],
    rejoin_s: float | None = None,
) -> int | None:
    """Report starting, and wait until the sidecar says which attempt to start (None: not
    within ``bound_s``, or ``stopped()`` from outside meanwhile).

    With ``rejoin_s`` (a restart), once every node but the lost ones is starting, the wait
    is for those to come back: it ends after ``rejoin_s`` more, not at ``bound_s``.
    """
    body = jobstates.encode_report(jobstates.Report(JobStatus.STARTING, started))
    began = time.monotonic()
    view: JobView | None = None
    gone = said = False
    only_lost: float | None = None  # since when every node not lost is starting
    while not stopped():
        now = time.monotonic()
        waited = now - began
        if bound_s is not None and waited > bound_s:
            return None
        if rejoin_s is not None and only_lost is not None and now - only_lost >= rejoin_s:
            return None
        try:
            if view is None:
                view = client.report_job(url, body, proof=proof)
            else:
                later = client.job(url, view.version, START_POLL_S)
                view = None if later.boot != view.boot else later
                if view is None:
                    continue  # the sidecar restarted: it must hear we are starting
        except WriteRefused:
            raise  # not the token: no retry can start the job
        except RallypointError as exc:
            if not gone:
                say(f"rallypoint: warning: {exc}; waiting for the sidecar to start")
                gone = True
            view = None
            time.sleep(RETRY_S)
            continue
        if view.start is not None:
            return view.start
        if not waiting_for_lost(view):
            only_lost = None
        elif only_lost is None:
            only_lost = time.monotonic()
            continue  # a --rejoin-timeout of 0 gives up now
        if not said and waited >= START_SAY_S:
            said = True
            say(f"rallypoint: waiting for every node to start: {starting(view)}")
    return None


def served_env(url: str, attempt: int, say: Callable[[str], None]) -> dict[str, str]:
    """The env the sidecar serves now, for a restart: a node that came back with new facts
    started a new generation, checked again before the attempt started ({} if unavailable:
    the child keeps the last attempt's, and `run` says so)."""
    try:
        return client.env_values(client.fetch_env(url, "json", ENV_WAIT_S))
    except RallypointError as exc:
        say(f"rallypoint: warning: attempt {attempt} starts with the last attempt's env: {exc}")
        return {}


def settled(url: str, view: JobView) -> JobView:
    """The view once an earlier failure elsewhere would be known.

    News travels within a moment (SETTLE_S), except while a node this sidecar keeps alive
    with is silent: then it may be the one that failed first (cut off, it cannot tell), so
    `run` waits until it is heard again or named lost (``unsettled_s``).
    """
    if sum(view.counts.values()) <= 1:
        return view  # no other node to hear from
    unsettled = min(view.unsettled_s, UNSETTLED_MAX_S)
    deadline = time.monotonic() + max(SETTLE_S, unsettled)
    while (left := deadline - time.monotonic()) > 0:
        try:
            later = client.job(url, view.version, left)
        except RallypointError:
            return view
        if later.stop or later.version == view.version:
            return later  # a stop, or nothing new within the wait
        view = later
    return view


def latest(url: str, view: JobView) -> JobView:
    """The job view as the sidecar has it now (an earlier failure may have come in while this
    node stopped its job); ``view`` when the sidecar does not answer."""
    with contextlib.suppress(RallypointError):
        view = client.job(url)
    return view


def line(first: ShownState) -> str:
    """The first-failure line for a failure as the local API shows it."""
    return jobs.line(first.job, first.ago)


def waiting_for_lost(view: JobView) -> bool:
    """Whether the nodes not yet starting are all lost: every other one is starting."""
    lost, starting = view.counts.get(JobStatus.LOST, 0), view.counts.get(JobStatus.STARTING, 0)
    return lost > 0 and lost + starting == sum(view.counts.values())


def starting(view: JobView) -> str:
    """How many nodes are starting, from a job view: "3 of 4 nodes starting attempt 1"."""
    total, waiting = sum(view.counts.values()), view.counts.get(JobStatus.STARTING, 0)
    attempt = None if view.own is None else view.own.attempt
    return f"{waiting} of {total} nodes starting attempt {attempt}"


def follow_stop(
    url: str,
    running: Callable[[], bytes],
    stop: Callable[[JobView], None],
    over: threading.Event,
    *,
    proof: str | None = None,
    say: Callable[[str], None],
) -> None:
    """Report the attempt's start (``running``'s body), then long-poll the sidecar until it
    says stop (``stop`` hears the view, once) or the attempt is ``over``."""
    boot: str | None = None
    version = -1
    gone = False
    while not over.is_set():
        try:
            view = (
                client.report_job(url, running(), proof=proof)
                if boot is None
                else client.job(url, version, POLL_S)
            )
        except RallypointError as exc:
            if not gone:
                say(
                    f"rallypoint: warning: {exc}; the job keeps running, and other nodes'"
                    " failures cannot stop it until the sidecar is back"
                )
                gone = True
            boot = None
            time.sleep(RETRY_S)
            continue
        if gone:
            say("rallypoint: the sidecar answers again; the job's state is reported")
            gone = False
        if boot is None and not view.carried:
            say(
                "rallypoint: warning: the sidecar runs with --keepalive 0: other nodes'"
                " failures cannot stop this job"
            )
        if view.boot != boot and boot is not None:
            boot = None  # the sidecar restarted: it must hear of the job again
            continue
        boot, version = view.boot, view.version
        if view.stop:
            stop(view)
            return


def behind(view: JobView | None) -> str:
    """The job view's line on which node's progress stopped first ("" when it has none)."""
    progress = None if view is None else view.progress
    return "" if progress is None else progress.behind or ""
