"""The job's progress, cluster-wide: `run`'s marks in, the keep-alives' progress fields both ways.

`rallypoint run` tells its sidecar each new progress mark of its job (POST /job/progress, at
most once a second). Marks ride the keep-alives that already flow after ready
(keepalive.py), at their own pace: nothing is sent for a mark alone. A worker's keep-alive
carries its own last mark, a relay's its group's marks that changed since its upstream took
them; the master holds every node's. Every answer carries the master's summary of the
attempt the cluster runs (core/progress.py: the two oldest marks and the newest), which a
relay passes down as it heard it. So each keep-alive and answer grows by a few marks
whatever the cluster's size, and the master alone holds N of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rallypoint.core import fanout
from rallypoint.core import progress as marks
from rallypoint.core.progress import Mark, ProgressBook, Summary
from rallypoint.model import ClusterSpec
from rallypoint.wire import alive as wirealive
from rallypoint.wire.jobstates import ProgressReport, ProgressView, ShownMark

#: Most marks a node shows in its local view (the master's summary covers every node).
MAX_SHOWN = 256


class ProgressWatch:
    """This node's ProgressBook, what feeds it, and the summary it answers with."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        group_size: int,
        now: Callable[[], float],
        offset: Callable[[], float],
        error: Callable[[], float],
        attempt: Callable[[], int],
    ) -> None:
        self.spec = spec
        self.book = ProgressBook()
        self._size = group_size
        #: The master's clock; this node's clock minus it; how far off that may be.
        self._now = now
        self._offset = offset
        self._error = error
        #: The attempt the cluster started last (-1: none; the master's summary is of it).
        self._attempt = attempt
        #: Group members' marks as last taken by the upstream, and which upstream took them.
        self._sent: dict[int, Mark] = {}
        self._upstream_boot = "-"
        #: The summary last heard from upstream (a worker's and a relay's view of the cluster).
        self._heard: Summary | None = None

    def mine(self, report: ProgressReport) -> None:
        """A mark of this node's own job, by its own clock: kept on the master's."""
        error = min(max(self._error(), 0.0), 3600.0)
        at = min(max(report.at - self._offset(), 0.0), 1e10 - 1)
        self.book.note(
            Mark(
                self.spec.rank,
                report.attempt,
                round(at, 6),
                report.step,
                report.phase,
                report.local_rank,
                round(error, 6),
                report.period_s,
            )
        )

    # -- what the keep-alives carry ----------------------------------------------------

    def outgoing(self, group: Iterable[int]) -> tuple[Mark | None, tuple[Mark, ...]]:
        """For a keep-alive upstream: our last mark, our group's changed ones."""
        book = self.book
        changed = []
        for rank in group:
            mark = book.marks.get(rank)
            if mark is not None and self._sent.get(rank) != mark:
                changed.append(mark)
        return book.marks.get(self.spec.rank), tuple(changed[: wirealive.MAX_HEARD])

    def sent(self, sent: tuple[Mark, ...]) -> None:
        """The upstream took these marks."""
        for mark in sent:
            self._sent[mark.rank] = mark

    def from_peer(self, alive: wirealive.Alive) -> None:
        """A keep-alive: the sender's mark, and its group's (a relay)."""
        if alive.mark is not None:
            self.book.note(alive.mark)
        group = fanout.group(alive.rank, self._size, self.spec.nnodes)
        for mark in alive.marks:
            if mark.rank in group:
                self.book.note(mark)

    def from_upstream(self, answer: wirealive.AliveAnswer) -> None:
        """The upstream's answer: the cluster's summary (a restarted upstream: send again)."""
        if answer.boot != self._upstream_boot:
            self._upstream_boot = answer.boot
            self._sent.clear()
        self._heard = answer.progress

    def summary(self) -> Summary | None:
        """The cluster's summary: the master's own, the upstream's elsewhere."""
        if self.spec.is_master:
            return self.book.summary(max(self._attempt(), 0))
        return self._heard

    # -- what the local API shows -------------------------------------------------------

    def view(self, attempt: int) -> ProgressView:
        """GET /job's "progress": the summary of ``attempt``, the line on which node is
        behind, and the marks this node holds (the master: every node's)."""
        hosts, now = self.spec.hosts, self._now()
        summary = self.summary()
        if summary is not None and summary.attempt != attempt:
            summary = None
        held = tuple(ShownMark.of(m, hosts, now) for m in self.book.of(attempt)[:MAX_SHOWN])
        if summary is None:
            return ProgressView(attempt, nodes=held)
        newest = None if summary.newest is None else ShownMark.of(summary.newest, hosts, now)
        return ProgressView(
            attempt,
            summary.marked,
            tuple(ShownMark.of(m, hosts, now) for m in summary.oldest),
            newest,
            marks.behind(summary, hosts) or None,
            held,
        )
