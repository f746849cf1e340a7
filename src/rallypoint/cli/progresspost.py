"""`rallypoint run` tells its sidecar the job's progress (docs/run.md "Hangs: progress and
stalls"): each new mark, at most once per PUBLISH_S, so that every node's last progress is
shown cluster-wide (GET /job "progress", `rallypoint status`).

Two threads per attempt: one reads the progress file (progressfile.Watch.follow), one posts.
A mark that comes within PUBLISH_S of the last post waits for the next turn; it is never
dropped, because the last mark before a hang is the one that matters. The sidecar is not
the job: a post that fails is let go (the job's own watcher says once that the sidecar is
gone), and the next mark tries again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rallypoint.cli import client, progressfile
from rallypoint.core.progress import MAX_PERIOD_S
from rallypoint.errors import RallypointError
from rallypoint.wire import jobstates

#: Least seconds between two posts: a job marks every step, the sidecars need a mark a second.
PUBLISH_S = 1.0
#: Longest wait for the sidecar's answer to one post.
POST_TIMEOUT_S = 2.0


class Publisher:
    """Posts the latest mark of one attempt to the sidecar, at most once per PUBLISH_S."""

    def __init__(self, url: str, attempt: int, *, proof: str | None = None) -> None:
        self.url = url
        self.proof = proof
        self.attempt = attempt
        self._latest: tuple[progressfile.Mark, float | None] | None = None
        self._new = threading.Event()
        #: The last mark the sidecar took.
        self.posted: progressfile.Mark | None = None

    def offer(self, mark: progressfile.Mark, period_s: float | None = None) -> None:
        """A new mark (``period_s`` after the one before): posted at the next turn (a later
        one replaces it while it waits)."""
        self._latest = (mark, period_s)
        self._new.set()

    def run(self, over: threading.Event) -> None:
        """Post each new mark until ``over`` is set."""
        while not over.is_set():
            if not self._new.wait(progressfile.POLL_S):
                continue
            self._new.clear()
            latest = self._latest
            if latest is not None:
                self.post(*latest)
            over.wait(PUBLISH_S)

    def post(self, mark: progressfile.Mark, period_s: float | None = None) -> bool:
        """Post ``mark`` once; whether the sidecar took it."""
        period = None if period_s is None else round(min(period_s, MAX_PERIOD_S), 6)
        report = jobstates.ProgressReport(
            self.attempt, mark.at, mark.step, mark.phase, mark.local_rank, period
        )
        try:
            client.report_progress(
                self.url,
                jobstates.encode_progress(report),
                proof=self.proof,
                timeout_s=POST_TIMEOUT_S,
            )
        except RallypointError:
            return False
        self.posted = mark
        return True

    def last(self, watch: progressfile.Watch) -> None:
        """The job ended: post its last mark now if it is not posted yet (a job that marks
        its last step and ends within PUBLISH_S would otherwise show the step before)."""
        watch.look()
        if watch.last is not None and watch.last != self.posted:
            self.post(watch.last, watch.period_s)


def start(
    url: str,
    attempt: int,
    watch: progressfile.Watch,
    stalled: Callable[[progressfile.Stall], None],
    over: threading.Event,
    *,
    proof: str | None = None,
) -> Publisher:
    """Follow the attempt's progress file and post its marks, until ``over`` is set."""
    publisher = Publisher(url, attempt, proof=proof)
    threading.Thread(
        target=watch.follow,
        args=(stalled, over, publisher.offer),
        name="rallypoint-progress",
        daemon=True,
    ).start()
    threading.Thread(
        target=publisher.run, args=(over,), name="rallypoint-progress-post", daemon=True
    ).start()
    return publisher
