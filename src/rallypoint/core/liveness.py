"""Who is gone after ready: what this node hears of the nodes it keeps alive with (pure).

The I/O is rendezvous/afterready/keepalive.py. A node watches only the nodes it exchanges
keep-alives with: a worker its upstream (its relay, and the master while the relay fails it);
a relay its group and its upstream; the master every rank, its relays' groups through the ages
their keep-alives pass on. A watched node is *down* once nothing was heard from it for
DOWN_AFTER intervals; a node's own upstream (its relay, the master) one interval later,
UPSTREAM_DOWN_AFTER. So when the link between a node and its upstream is cut, the upstream,
which can tell everyone else, names the node first, and the cut-off node's verdict (which
stops its own job) comes after the cluster's. What a node names is its own findings plus its
upstream's last answer, so every node learns within an interval what the master found.

A node that stops on purpose (its sidecar got SIGTERM) says goodbye first: it has *left*. A
node that left is not watched until it is heard again (a restarted sidecar), is never named
down, and every node learns it from its upstream's answers as it learns who is down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Annotated

import msgspec

from rallypoint.model import Rank, at_most, one_of, within

#: Intervals without a word before a watched node is named down. With the default 3 s
#: interval that is 12 s, and the others hear of it within one more interval: about 15 s,
#: torch elastic's 5 s x 3.
DOWN_AFTER = 4
#: Intervals without a word before a node names its own upstream down: one more, so that a
#: cut between the two is named by the upstream first (15 s at the default interval).
UPSTREAM_DOWN_AFTER = DOWN_AFTER + 1
#: A watched node silent this many intervals is checked actively (its cause is learnt).
CHECK_AFTER = 2
#: A watched node silent this many intervals missed an exchange: until it is heard again or
#: named down, news of a failure may be held up with it (see Watch.unsettled_s).
MISSED_AFTER = 1.5

#: Why a node is named down: its peer API refused the connection (host up, sidecar gone),
#: the request timed out (paused, or the path drops packets), no route or no address
#: (unreachable), another failure, or only silence: no attempt of this node's reached an
#: answer either way (the node is known down from a relay's ages, or this node's own
#: attempt was still unanswered one interval past the bound). A verdict on a node this node
#: is trying waits for that attempt, so the cause says what the attempt found (Watch.own).
CAUSES = ("refused", "timed_out", "unreachable", "failed", "silent")
#: Longest detail a peer carries (a cut-down error message), in characters.
MAX_DETAIL = 300
#: Ages and durations are capped at a day: past it, the number tells nothing more.
MAX_AGE_S = 86400.0
Age = Annotated[float, within(0.0, MAX_AGE_S)]


class Down(msgspec.Struct, frozen=True):
    """A node named down: how long nothing was heard from it, why, and who found it."""

    rank: Rank
    #: A host name or an IP literal (wire/fields.host_name checks it after decoding).
    host: str
    for_s: Age
    cause: Annotated[str, one_of(CAUSES)]
    detail: Annotated[str, at_most(MAX_DETAIL)]
    #: The host whose watch found it (this node, its relay or the master); checked like host.
    seen_by: str


class Watch:
    """One node's findings: when each watched rank was last heard, and why it failed since."""

    def __init__(
        self,
        hosts: Sequence[str],
        rank: int,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = tuple(hosts)
        self.rank = rank
        self.interval_s = interval_s
        self.down_after_s = DOWN_AFTER * interval_s
        self.upstream_down_after_s = UPSTREAM_DOWN_AFTER * interval_s
        self._clock = clock
        self._heard: dict[int, float] = {}
        #: The upstream ranks among the watched (named down one interval later).
        self._upstreams: frozenset[int] = frozenset()
        self._failure: dict[int, tuple[str, str]] = {}
        #: The cause (and detail) each rank named down was named with: kept until it is heard
        #: again, so a verdict does not change its mind (timed_out, then unreachable once the
        #: neighbour entry expires) while the node stays down. Only "silent" gives way to
        #: what a later attempt finds.
        self._named: dict[int, tuple[str, str]] = {}
        #: When each attempt to reach a rank that has not ended yet began (keep-alives in
        #: flight), by rank.
        self._trying: dict[int, list[float]] = {}
        #: The upstream's last answer: its rank, what it named and when (for_s as of then).
        self._upstream: tuple[int, tuple[Down, ...], float] = (-1, (), 0.0)
        #: Whether watching began (after this node's first ready).
        self.started = False
        #: The watched ranks that said goodbye, and when (this node's clock).
        self._left: dict[int, float] = {}
        #: The ranks the upstream's last answer says left.
        self._upstream_left: frozenset[int] = frozenset()

    def track(self, ranks: Iterable[int], upstream: Iterable[int] = ()) -> None:
        """Watch exactly ``ranks`` and ``upstream`` (this node's relay or master) from now on;
        a newly watched rank counts as heard now."""
        self.started = True
        now = self._clock()
        upstream = set(upstream)
        wanted = {r for r in {*ranks, *upstream} if r != self.rank and 0 <= r < len(self.hosts)}
        self._upstreams = frozenset(upstream & wanted)
        for rank in list(self._heard):
            if rank not in wanted:
                del self._heard[rank]
                self._failure.pop(rank, None)
                self._named.pop(rank, None)
        for rank in wanted:
            self._heard.setdefault(rank, now)

    @property
    def watched(self) -> frozenset[int]:
        return frozenset(self._heard)

    def heard(self, rank: int, age_s: float = 0.0) -> None:
        """A word from ``rank`` (``age_s`` ago, as a relay passes it on); unwatched: ignored."""
        last = self._heard.get(rank)
        if last is None:
            return
        at = self._clock() - max(0.0, age_s)
        # A relay's age arrives a transit time late, so the same last word looks a little
        # newer each time it is passed on: only a word half an interval newer is news (a
        # live member is heard by its relay every interval). Else the relay's keep-alives
        # would wipe the cause our own check found and keep the silence from growing.
        news = at - last >= self.interval_s / 2 if age_s > 0 else at > last
        left = self._left.get(rank)
        if left is not None and at - left < self.interval_s / 2:
            return  # a word sent before its goodbye, arriving after it
        if news:
            self._heard[rank] = at
            self._failure.pop(rank, None)
            self._named.pop(rank, None)
            self._left.pop(rank, None)

    def leave(self, rank: int) -> None:
        """``rank`` said goodbye: it is not watched until it is heard again."""
        if rank in self._heard:
            now = self._clock()
            self._left[rank] = now
            self._heard[rank] = now
            self._failure.pop(rank, None)
            self._named.pop(rank, None)

    def left(self) -> dict[int, float]:
        """Every rank known to have left and not heard since, by rank, with seconds since
        (for a goodbye the upstream passed on: since its answer)."""
        now = self._clock()
        out = {rank: now - at for rank, at in self._left.items()}
        _, _, answered = self._upstream
        for rank in self._upstream_left:
            if rank not in out and rank != self.rank and not self._is_heard(rank):
                out[rank] = now - answered
        return dict(sorted(out.items()))

    def _is_heard(self, rank: int) -> bool:
        """Whether ``rank`` is watched here, has not left, and was heard within its bound."""
        at = self._heard.get(rank)
        return at is not None and rank not in self._left and self._clock() - at < self.bound_s(rank)

    def failed(self, rank: int, cause: str, detail: str) -> None:
        """An attempt to reach ``rank`` failed (it counts as silence, with its cause)."""
        if rank in self._heard:
            self._failure[rank] = (cause if cause in CAUSES else "failed", detail)

    @contextlib.contextmanager
    def trying(self, rank: int) -> Iterator[None]:
        """Around an attempt to reach ``rank``: while it lasts, a verdict without a cause
        waits for it (heard() or failed() end it with what it found)."""
        began = self._clock()
        self._trying.setdefault(rank, []).append(began)
        try:
            yield
        finally:
            under_way = self._trying.get(rank, [])
            if began in under_way:
                under_way.remove(began)
            if not under_way:
                self._trying.pop(rank, None)

    def ages(self, ranks: Iterable[int]) -> list[tuple[int, float]]:
        """(rank, seconds since heard) of the watched ``ranks``: what a relay passes on."""
        now = self._clock()
        return [(r, now - self._heard[r]) for r in ranks if r in self._heard]

    def to_check(self) -> list[int]:
        """Watched ranks silent for CHECK_AFTER intervals: worth a keep-alive of our own."""
        now, limit = self._clock(), CHECK_AFTER * self.interval_s
        return [
            r for r, at in sorted(self._heard.items()) if now - at >= limit and r not in self._left
        ]

    def bound_s(self, rank: int) -> float:
        """Seconds of silence before ``rank`` is named down from here."""
        return self.upstream_down_after_s if rank in self._upstreams else self.down_after_s

    def _named_at(self, rank: int, at: float) -> float:
        """When ``rank``, last heard at ``at``, is named down from here.

        At its bound; but when an attempt to reach it was under way at the bound and no
        failure told why yet, one interval later at most (an attempt's own timeout is at most
        one interval), so the verdict names what the attempt found, not "silent" because the
        answer was a moment late (a loaded loop). The attempt's end publishes the verdict at
        once. An attempt begun after the bound holds nothing back: a node named down stays
        named until it is heard.
        """
        bound = at + self.bound_s(rank)
        under_way = self._trying.get(rank)
        if under_way and min(under_way) <= bound and rank not in self._failure:
            return bound + self.interval_s
        return bound

    def next_change_s(self) -> float | None:
        """Seconds until the next watched rank's silence reaches its bound (None: none left)."""
        now = self._clock()
        left = [self._named_at(r, at) - now for r, at in self._watching()]
        ahead = [s for s in left if s >= 0]
        return min(ahead) if ahead else None

    def unsettled_s(self) -> float:
        """Seconds until every watched rank that missed an exchange is named down (0: none).

        A failure elsewhere travels on the keep-alives: while a watched node is silent, news
        of it (or of a failure it was carrying) may be on its way, and it is settled when the
        node is heard again or named down. `run` waits this long before it takes its own
        job's failure for the first one (docs/run.md).
        """
        now, missed = self._clock(), MISSED_AFTER * self.interval_s
        left = [self._named_at(r, at) - now for r, at in self._watching() if now - at >= missed]
        return max([0.0, *left])

    def _watching(self) -> list[tuple[int, float]]:
        """(rank, last heard) of the watched ranks that have not left."""
        return [(r, at) for r, at in self._heard.items() if r not in self._left]

    def upstream(self, rank: int, downs: Sequence[Down], left: Iterable[int] = ()) -> None:
        """The answer of our upstream ``rank``: the nodes it names down, and those it knows
        left."""
        self._upstream = (rank, tuple(downs), self._clock())
        self._upstream_left = frozenset(left)

    def own(self) -> list[Down]:
        """The watched ranks silent past the bound (see _named_at), by rank."""
        now = self._clock()
        out = []
        for rank, at in sorted(self._watching()):
            if now > self._named_at(rank, at):
                cause, detail = self._named.get(rank, ("silent", ""))
                if cause == "silent":
                    cause, detail = self._failure.get(rank, ("silent", "no keep-alive arrived"))
                    self._named[rank] = (cause, detail)
                out.append(
                    Down(rank, self.hosts[rank], now - at, cause, detail, self.hosts[self.rank])
                )
        return out

    def view(self) -> list[Down]:
        """Every node named down, by rank: our findings, then the upstream's for the others.

        A node we heard from ourselves within the bound is not down from here, whatever the
        upstream says; an upstream we find down has nothing current to say.
        """
        own = {d.rank: d for d in self.own()}
        source, downs, at = self._upstream
        if source in own:
            downs = ()
        aged = self._clock() - at
        for down in downs:
            if down.rank == self.rank or down.rank >= len(self.hosts) or down.rank in self._left:
                continue
            mine = own.get(down.rank)
            if mine is not None and mine.cause != "silent":
                continue
            if mine is None and down.rank in self._heard:
                continue  # heard lately: up from here
            own[down.rank] = msgspec.structs.replace(down, for_s=down.for_s + aged)
        return [own[r] for r in sorted(own)]

    def up(self, rank: int) -> bool:
        """Whether ``rank`` is not named down (for the per-peer gauge)."""
        return all(d.rank != rank for d in self.view())


def aged(downs: Iterable[Down], by_s: float) -> list[Down]:
    """``downs`` as they stand ``by_s`` seconds after they were named."""
    return [msgspec.structs.replace(d, for_s=min(MAX_AGE_S, d.for_s + by_s)) for d in downs]


def status(
    watch: Watch | None, downs: Sequence[Down] = (), wall: Callable[[], float] = time.time
) -> dict[str, object]:
    """The /status section: the bound, what is watched, and ``downs``, the nodes the last
    verdict named down (the same verdict the warnings, the gauges and the log show)."""
    if watch is None:
        return {"enabled": False, "watching": False, "left": [], "down": []}
    now = wall()
    return {
        "enabled": True,
        "watching": watch.started,
        "interval_s": watch.interval_s,
        "down_after_s": watch.down_after_s,
        "upstream_down_after_s": watch.upstream_down_after_s,
        "watched": len(watch.watched),
        "left": [
            {
                "rank": rank,
                "host": watch.hosts[rank],
                "since": round(now - for_s, 3),
                "for_s": round(for_s, 3),
            }
            for rank, for_s in watch.left().items()
        ],
        "down": [
            {
                "rank": d.rank,
                "host": d.host,
                "since": round(now - d.for_s, 3),
                "for_s": round(d.for_s, 3),
                "cause": d.cause,
                "detail": d.detail,
                "seen_by": d.seen_by,
            }
            for d in downs
        ],
    }


def warning(down: Down) -> str:
    """One line for /status warnings and `rallypoint status`."""
    cause = down.cause.replace("_", " ")
    return (
        f"{down.host} (rank {down.rank}) is down: nothing heard for {down.for_s:.0f} s "
        f"({cause}: {down.detail}; seen by {down.seen_by})"
    )
