"""The liveness bookkeeping and the keep-alive codec: who is named down, and bad messages."""

from __future__ import annotations

import json

import pytest

from rallypoint.cli.status import format_status
from rallypoint.core.jobs import JobState
from rallypoint.core.liveness import Down, Watch, status, warning
from rallypoint.errors import PeerMessageError
from rallypoint.wire import alive as wirealive
from rallypoint.wire import jobstates
from tests.support.shown import status_view

HOSTS = ("m", "a", "b", "c")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(rank: int = 0) -> tuple[Watch, Clock]:
    clock = Clock()
    return Watch(HOSTS, rank, 1.0, clock=clock), clock


def test_a_rank_silent_past_four_intervals_is_down_with_its_last_failure() -> None:
    w, clock = watch()
    w.track([1, 2, 3])
    clock.now += 3.9
    w.heard(1)
    assert w.own() == []
    clock.now += 0.2
    w.failed(2, "refused", "10.0.0.2:7781: refused")
    downs = w.own()
    assert [(d.rank, d.cause) for d in downs] == [(2, "refused"), (3, "silent")]
    assert downs[0].seen_by == "m" and downs[0].for_s == pytest.approx(4.1)
    w.heard(2)
    assert [d.rank for d in w.own()] == [3]


def test_only_silent_ranks_are_checked_and_unwatched_words_are_ignored() -> None:
    w, clock = watch()
    w.track([1, 2])
    clock.now += 2.0
    w.heard(1)
    w.heard(3)  # not watched
    assert w.to_check() == [2]
    assert w.ages([3]) == []


def test_a_relays_ages_count_as_heard_that_long_ago() -> None:
    w, clock = watch()
    w.track([1, 2])
    clock.now += 10.0
    w.heard(2, age_s=3.0)
    assert [d.rank for d in w.own()] == [1]
    w.heard(2, age_s=8.0)  # older news than we have: no change
    assert dict(w.ages([2]))[2] == pytest.approx(3.0)


def test_the_same_last_word_passed_on_late_keeps_the_silence_and_its_cause() -> None:
    # A relay's age of a dead member reaches us a transit time after it was measured, so
    # the member's last word looks a little newer at every keep-alive. It is not news: the
    # silence keeps growing and the cause our own check found stays.
    w, clock = watch()
    w.track([1])
    clock.now += 5.0
    w.failed(1, "refused", "10.0.0.1:7781: refused")
    for _ in range(3):
        clock.now += 0.05
        w.heard(1, age_s=dict(w.ages([1]))[1] - 0.01)  # measured 10 ms before it arrived
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "refused")]
    assert dict(w.ages([1]))[1] == pytest.approx(5.15)
    w.heard(1, age_s=0.2)  # the relay heard it again: news
    assert w.own() == [] and dict(w.ages([1]))[1] == pytest.approx(0.2)


def test_a_nodes_own_upstream_is_named_one_interval_after_its_members() -> None:
    # Cut between a worker and the master: the master names the worker at 4 intervals, the
    # worker names the master at 5, so the cluster's verdict comes before the worker's own.
    master, clock = watch(rank=0)
    worker = Watch(HOSTS, 2, 1.0, clock=clock)
    master.track([1, 2, 3])
    worker.track([], upstream=[0])
    assert master.next_change_s() == pytest.approx(4.0)
    assert worker.next_change_s() == pytest.approx(5.0)
    clock.now += 4.1
    master.heard(1)
    master.heard(3)
    assert [d.rank for d in master.own()] == [2] and worker.own() == []
    assert worker.next_change_s() == pytest.approx(0.9)
    clock.now += 1.0
    assert [d.rank for d in worker.own()] == [0]
    assert worker.next_change_s() is None
    assert status(worker)["upstream_down_after_s"] == 5.0


def test_unsettled_until_every_silent_node_is_heard_or_named() -> None:
    w, clock = watch(rank=2)
    w.track([3], upstream=[0])
    clock.now += 1.0
    assert w.unsettled_s() == 0.0  # nothing missed yet
    clock.now += 1.0
    w.heard(3)
    assert w.unsettled_s() == pytest.approx(3.0)  # the upstream: named at 5 s
    w.heard(0)
    assert w.unsettled_s() == 0.0
    clock.now += 4.5
    assert w.unsettled_s() == pytest.approx(0.5)  # rank 3, at 4 s past its last word
    clock.now += 1.0
    assert w.unsettled_s() == 0.0  # named down: settled


def test_a_verdict_waits_for_the_attempt_under_way_and_names_what_it_found() -> None:
    # The master's check of a node cut off began before the bound; under load its timeout
    # fires a moment after the bound. The verdict waits for it: "timed_out", not "silent".
    w, clock = watch()
    w.track([1])
    clock.now += 3.0
    with w.trying(1):
        clock.now += 1.1  # past the 4 s bound, the attempt still under way
        assert w.own() == []
        assert w.next_change_s() == pytest.approx(0.9)  # one interval past the bound at most
        assert w.unsettled_s() == pytest.approx(0.9)
        w.failed(1, "timed_out", "10.0.0.1:7781: timeout")
        assert [(d.rank, d.cause) for d in w.own()] == [(1, "timed_out")]
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "timed_out")]


def test_an_attempt_unanswered_one_interval_past_the_bound_is_named_silent() -> None:
    w, clock = watch()
    w.track([1])
    clock.now += 3.5
    with w.trying(1):
        clock.now += 1.4
        assert w.own() == []
        clock.now += 0.2  # 5.1 s: the attempt's own timeout is long over
        assert [(d.rank, d.cause) for d in w.own()] == [(1, "silent")]


def test_an_attempt_begun_after_the_verdict_does_not_take_it_back() -> None:
    # Named down with no attempt under way at the bound: a later attempt holds nothing back.
    w, clock = watch()
    w.track([1])
    clock.now += 4.5
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "silent")]
    with w.trying(1):
        assert [d.rank for d in w.own()] == [1]
    w.heard(1)
    assert w.own() == []


def test_a_verdict_keeps_the_cause_it_was_named_with_until_the_node_is_heard() -> None:
    w, clock = watch()
    w.track([1, 2])
    clock.now += 4.5
    w.failed(1, "timed_out", "10.0.0.1:7781: timeout")
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "timed_out"), (2, "silent")]
    # Later attempts fail otherwise (the neighbour entry expired): the verdict stands; a
    # "silent" one gives way to what an attempt finds.
    w.failed(1, "unreachable", "10.0.0.1:7781: no route")
    w.failed(2, "refused", "10.0.0.2:7781: refused")
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "timed_out"), (2, "refused")]
    w.heard(1)
    clock.now += 4.5
    w.failed(1, "unreachable", "10.0.0.1:7781: no route")
    assert [(d.rank, d.cause) for d in w.own()] == [(1, "unreachable"), (2, "refused")]


def test_the_view_adds_the_upstreams_findings_but_not_against_our_own_evidence() -> None:
    w, clock = watch(rank=3)
    w.track([0])
    far = Down(1, "a", 5.0, "timed_out", "x", "m")
    mine = Down(3, "c", 5.0, "refused", "x", "m")  # ourselves: never shown
    w.upstream(0, [far, mine])
    clock.now += 1.0
    view = w.view()
    assert [(d.rank, d.seen_by) for d in view] == [(1, "m")]
    assert view[0].for_s == pytest.approx(6.0)
    # Our upstream down: what it said last is not current.
    clock.now += 5.0
    assert [d.rank for d in w.view()] == [0]


def test_status_and_warning_name_who_since_and_why() -> None:
    w, clock = watch()
    w.track([1])
    clock.now += 5.0
    w.failed(1, "timed_out", "10.0.0.1:7781: timeout")
    section = status(w, w.view(), wall=lambda: 1000.0)
    assert section["down"] == [
        {"rank": 1, "host": "a", "since": 995.0, "for_s": 5.0, "cause": "timed_out",
         "detail": "10.0.0.1:7781: timeout", "seen_by": "m"}
    ]  # fmt: skip
    line = warning(w.view()[0])
    assert line.startswith("a (rank 1) is down") and "timed out" in line and "\n" not in line


def test_a_rank_that_said_goodbye_is_left_never_down_until_heard_again() -> None:
    w, clock = watch()
    w.track([1, 2])
    clock.now += 1.0
    w.leave(2)
    w.heard(2)  # its last keep-alive, sent before the goodbye, arriving after it
    clock.now += 10.0  # far past the bound
    w.heard(1)
    assert w.view() == [] and w.to_check() == [] and w.unsettled_s() == 0.0
    assert w.left() == {2: pytest.approx(10.0)}
    assert w.next_change_s() == pytest.approx(4.0)  # rank 1's bound only
    w.heard(2)  # a restarted sidecar: watched again
    assert w.left() == {}
    clock.now += 4.5
    assert [d.rank for d in w.view()] == [1, 2]


def test_a_goodbye_from_an_unwatched_rank_changes_nothing() -> None:
    w, _ = watch()
    w.track([1])
    w.leave(3)
    assert w.left() == {} and w.watched == {1}


def test_the_upstreams_left_nodes_are_shown_and_not_named_down() -> None:
    w, clock = watch(rank=3)
    w.track([0], upstream=[0])
    w.upstream(0, [Down(1, "a", 5.0, "refused", "x", "m")], left=[2, 3])
    clock.now += 1.0
    assert w.left() == {2: pytest.approx(1.0)}  # never ourselves
    assert [d.rank for d in w.view()] == [1]


def test_status_lists_the_nodes_that_left() -> None:
    w, clock = watch()
    w.track([1])
    w.leave(1)
    clock.now += 20.0
    section = status(w, w.view(), wall=lambda: 1000.0)
    assert section["left"] == [{"rank": 1, "host": "a", "since": 980.0, "for_s": 20.0}]
    assert section["down"] == []
    lines = format_status(status_view({"ready": True, "liveness": section})).splitlines()
    assert lines[-2:] == [
        "left:",
        "  - a (rank 1) said goodbye 20 s ago (its sidecar stopped on purpose; not down)",
    ]


def test_goodbye_fields_round_trip_and_are_bounded() -> None:
    alive = wirealive.Alive("s", 2, "b", leaving=True, left=(3, 4))
    assert wirealive.parse_alive(wirealive.encode_alive(alive)) == alive
    answer = wirealive.AliveAnswer("s", 0, (), 0, left=(1, 2))
    assert wirealive.parse_answer(wirealive.encode_answer(answer)).left == (1, 2)
    with pytest.raises(PeerMessageError, match=r"keep-alive: .*\$\.left"):
        wirealive.parse_alive(b'{"session": "s", "rank": 1, "host": "b", "left": [-1]}')
    with pytest.raises(PeerMessageError, match=r"keep-alive: .*\$\.leaving"):
        wirealive.parse_alive(b'{"session": "s", "rank": 1, "host": "b", "leaving": "yes"}')


def test_codec_round_trips() -> None:
    alive = wirealive.Alive("s", 2, "b", ((3, 1.5),))
    assert wirealive.parse_alive(wirealive.encode_alive(alive)) == alive
    answer = wirealive.AliveAnswer("s", 0, (Down(1, "a", 5.0, "refused", "d", "m"),), 1)
    assert wirealive.parse_answer(wirealive.encode_answer(answer)) == answer


def test_messages_carry_values_at_wire_precision_and_within_limits() -> None:
    job = JobState(2, "b", "lost", 1_700_000_000.123456, 1_700_000_001.98765, detail="x" * 400)
    alive = wirealive.Alive("s", 2, "b", ((3, 1.23456),), job=job, jobs=(job,))
    body = json.loads(wirealive.encode_alive(alive))
    assert body["heard"] == [[3, 1.235]] and body["first"] is None
    for carried in (body["job"], body["jobs"][0]):
        assert carried["started"] == 1_700_000_000.123 and carried["since"] == 1_700_000_001.988
        assert len(carried["detail"]) == jobstates.MAX_DETAIL and "code" not in carried
    assert alive.job is not None and alive.job.started == 1_700_000_000.123456  # kept exact
    downs = tuple(
        Down(r, f"n{r}", 1e9, "silent", "y" * 400, "m") for r in range(wirealive.MAX_DOWN + 3)
    )
    answer = wirealive.AliveAnswer("s", 0, downs, len(downs), counts={"running": 3})
    data = json.loads(wirealive.encode_answer(answer))
    assert len(data["down"]) == wirealive.MAX_DOWN and data["total"] == len(downs)
    assert data["down"][0]["for_s"] == wirealive.MAX_AGE_S
    assert len(data["down"][0]["detail"]) == wirealive.MAX_DETAIL
    assert data["counts"] == {"running": 3} and data["jobs"] is None
    assert wirealive.parse_answer(wirealive.encode_answer(answer)).counts == {"running": 3}


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        (b"[]", "Expected `object`, got `array`"),
        (b'{"session": "s", "rank": -1, "host": "b"}', r"\$\.rank"),
        (b'{"session": "s", "rank": 1, "host": "b", "heard": [[1, -2]]}', r"\$\.heard\[0\]\[1\]"),
        (b'{"session": "s", "rank": 1, "host": "b", "heard": {}}', r"\$\.heard"),
        (b'{"session": "s", "rank": 1, "host": "bad host!"}', "host must be a host name"),
    ],
)
def test_bad_keepalives_name_the_field(body: bytes, fault: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^keep-alive: .*{fault}"):
        wirealive.parse_alive(body)


@pytest.mark.parametrize(
    ("down", "fault"),
    [
        ('[{"rank": 1, "host": "a", "for_s": 1, "cause": "eaten", "detail": "", '
         '"seen_by": "m"}]', r"\$\.down\[0\]\.cause"),
        ('[{"rank": 1, "host": "a", "for_s": "1", "cause": "refused", "detail": "", '
         '"seen_by": "m"}]', r"\$\.down\[0\]\.for_s"),
        ('[{"rank": 1, "host": "a!", "for_s": 1, "cause": "refused", "detail": "", '
         '"seen_by": "m"}]', r"down\[0\]\.host must be"),
        ('[{"rank": 1, "host": "a", "for_s": 1, "cause": "refused", "detail": "", '
         '"seen_by": "m"}, {"rank": 2, "host": "b", "for_s": 1, "cause": "refused", '
         '"detail": "", "seen_by": "m"}]', "total must be at least"),
        ('"none"', r"\$\.down"),
    ],
)  # fmt: skip
def test_bad_answers_name_the_field(down: str, fault: str) -> None:
    body = f'{{"session": "s", "rank": 0, "total": 1, "down": {down}}}'.encode()
    with pytest.raises(PeerMessageError, match=f"^keep-alive answer: .*{fault}"):
        wirealive.parse_answer(body)
