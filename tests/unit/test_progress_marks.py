"""Each node's last progress mark (core/progress.py): kept newest per node, summed up in
constant size, and which node stopped first said only where the steps or the clocks tell it;
the marks on the wire and from `run` are untrusted (wire/alive.py, wire/jobstates.py)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.cli.status import job_lines
from rallypoint.core.progress import Mark, ProgressBook, Summary, behind, where
from rallypoint.errors import PeerMessageError
from rallypoint.wire import alive as wirealive
from rallypoint.wire import jobstates
from tests.support.shown import job_view

HOSTS = ("sub0", "sub1", "sub2", "sub3")


def test_a_node_keeps_its_newest_mark_and_a_later_attempt_replaces_an_earlier_one() -> None:
    book = ProgressBook()
    assert book.note(Mark(1, 0, 100.0, 5))
    assert not book.note(Mark(1, 0, 99.0, 4))  # an older mark that came late
    assert book.note(Mark(1, 1, 50.0, 1))  # the next attempt, whatever its time
    assert not book.note(Mark(1, 0, 200.0, 9))  # the earlier attempt is over
    assert book.of(1) == [Mark(1, 1, 50.0, 1)]
    assert book.of(0) == []


def test_the_summary_holds_the_two_oldest_and_the_newest_of_the_attempt() -> None:
    book = ProgressBook()
    for rank, at in enumerate((10.0, 7.0, 12.0, 9.0)):
        book.note(Mark(rank, 2, at, rank))
    book.note(Mark(4, 1, 1.0))  # another attempt: not in attempt 2's summary
    summary = book.summary(2)
    assert summary is not None
    assert (summary.marked, [m.rank for m in summary.oldest]) == (4, [1, 3])
    assert summary.newest is not None and summary.newest.rank == 2
    assert book.summary(5) is None


def test_a_node_at_an_earlier_step_is_behind_whatever_the_clocks() -> None:
    marks = (Mark(2, 0, 100.0, 11, "data", error_s=0.5), Mark(0, 0, 100.001, 12, "data"))
    line = behind(Summary(0, 4, marks, Mark(1, 0, 100.002, 12)), HOSTS)
    assert (
        line
        == "sub2 (rank 2) is behind: its last progress was step 11 (data), every other node's later"
    )


def test_a_mark_older_by_more_than_the_clocks_uncertainty_is_behind() -> None:
    marks = (Mark(3, 0, 100.0, 12, error_s=0.001), Mark(0, 0, 100.050, 12, error_s=0.002))
    line = behind(Summary(0, 4, marks, Mark(1, 0, 100.060, 12)), HOSTS)
    assert line.startswith("sub3 (rank 3) is behind: its last progress (step 12) is 50 ms older")


def test_marks_within_the_clocks_uncertainty_cannot_be_ordered_and_it_is_said() -> None:
    marks = (Mark(3, 0, 100.0, 12, error_s=0.02), Mark(0, 0, 100.030, 12, error_s=0.02))
    line = behind(Summary(0, 4, marks, marks[1]), HOSTS)
    assert line == (
        "which node stopped first cannot be told: the two oldest marks (sub3 (rank 3),"
        " sub0 (rank 0)) are 30 ms apart, within the clocks' uncertainty and the other"
        " nodes' spread (40 ms); 4 nodes' last progress spans 30 ms"
    )


def test_an_oldest_mark_no_farther_from_the_rest_than_they_spread_is_not_blamed() -> None:
    """Ranks that stopped in the same collective: marks 5, 9 and 14 ms after the oldest."""
    marks = (Mark(3, 0, 100.0, 12), Mark(0, 0, 100.005, 12))
    line = behind(Summary(0, 4, marks, Mark(1, 0, 100.014, 12)), HOSTS)
    assert line.startswith("which node stopped first cannot be told: the two oldest marks")
    assert (
        "5.0 ms apart, within the clocks' uncertainty and the other nodes' spread (9.0 ms)" in line
    )


def test_a_gap_under_half_a_phase_is_not_blamed_and_over_it_is() -> None:
    """The same 30 ms gap, in a job whose marks come every 200 ms and every 40 ms."""
    slow = (Mark(3, 0, 100.0, 12), Mark(0, 0, 100.030, 12, period_s=0.2))
    line = behind(Summary(0, 4, slow, slow[1]), HOSTS)
    assert "30 ms apart, less than half a phase of the job (100 ms)" in line
    fast = (Mark(3, 0, 100.0, 12), Mark(0, 0, 100.030, 12, period_s=0.04))
    assert behind(Summary(0, 4, fast, fast[1]), HOSTS).startswith("sub3 (rank 3) is behind")


def test_while_a_nodes_mark_is_not_known_nobody_is_blamed() -> None:
    marks = (Mark(2, 0, 90.0, 11), Mark(0, 0, 100.0, 12))
    line = behind(Summary(0, 3, marks, Mark(1, 0, 100.1, 12)), HOSTS)
    assert line == "which node stopped first cannot be told: 3 of 4 nodes' progress is known"


def test_nothing_is_said_with_fewer_than_two_marks() -> None:
    assert behind(None, HOSTS) == ""
    assert behind(Summary(0, 1, (Mark(0, 0, 1.0),), Mark(0, 0, 1.0)), HOSTS) == ""


def test_where_names_the_step_the_phase_and_the_local_rank() -> None:
    assert where(Mark(0, 0, 1.0, 1234, "data", 3)) == "step 1234 (data), local rank 3"
    assert where(Mark(0, 0, 1.0)) == "a touch"


def alive(**fields: object) -> bytes:
    return msgspec.json.encode({"session": "s", "rank": 1, "host": "sub1", **fields})


def test_a_keep_alive_carries_its_senders_mark_and_no_one_elses() -> None:
    mark = {"rank": 1, "attempt": 0, "at": 5.0, "step": 3, "phase": "data"}
    assert wirealive.parse_alive(alive(mark=mark)).mark == Mark(1, 0, 5.0, 3, "data")
    with pytest.raises(PeerMessageError, match=r"mark\.rank must be the sender's rank"):
        wirealive.parse_alive(alive(mark={**mark, "rank": 2}))


@pytest.mark.parametrize(
    "mark",
    [
        {"rank": 1, "attempt": 0, "at": -1.0},
        {"rank": 1, "attempt": 0, "at": 1.0, "phase": "two words"},
        {"rank": 1, "attempt": 0, "at": 1.0, "step": -3},
        {"rank": 1, "attempt": 0, "at": 1.0, "local_rank": 5000},
        {"rank": 1, "attempt": 0, "at": 1.0, "error_s": 1e9},
    ],
)
def test_a_mark_out_of_bounds_is_refused_naming_the_field(mark: dict[str, object]) -> None:
    with pytest.raises(PeerMessageError, match="keep-alive"):
        wirealive.parse_alive(alive(mark=mark))


def test_an_answer_carries_at_most_two_oldest_marks() -> None:
    three = [{"rank": r, "attempt": 0, "at": 1.0} for r in range(3)]
    body = msgspec.json.encode(
        {
            "session": "s",
            "rank": 0,
            "down": [],
            "total": 0,
            "progress": {"attempt": 0, "marked": 3, "oldest": three},
        }
    )
    with pytest.raises(PeerMessageError, match="keep-alive answer"):
        wirealive.parse_answer(body)


def test_runs_progress_report_round_trips_and_bad_ones_get_one_line() -> None:
    report = jobstates.ProgressReport(2, 1700000000.25, 1234, "checkpoint", 3)
    assert jobstates.parse_progress(jobstates.encode_progress(report)) == report
    for bad in (
        b"not json",
        b'{"at": 1.0}',
        b'{"attempt": 0, "at": 1.0, "phase": "a b"}',
        b"x" * 600,
    ):
        with pytest.raises(PeerMessageError, match="progress report") as caught:
            jobstates.parse_progress(bad)
        assert "\n" not in str(caught.value)


@given(st.binary(max_size=700))
def test_any_bytes_give_a_report_or_one_error(data: bytes) -> None:
    try:
        jobstates.parse_progress(data)
    except PeerMessageError as exc:
        assert str(exc).startswith("progress report")


def test_status_shows_each_nodes_last_mark_and_who_is_behind() -> None:
    mark = {"rank": 2, "host": "sub2", "where": "step 11 (data)", "age_s": 6.25}
    newest = {"rank": 0, "host": "sub0", "where": "step 12 (data)", "age_s": 0.1}
    job = {
        "counts": {"running": 2},
        "first": None,
        "nodes": [
            {"rank": 0, "host": "sub0", "state": "running", "what": "running"},
            {"rank": 2, "host": "sub2", "state": "running", "what": "running"},
        ],
        "progress": {
            "attempt": 0,
            "marked": 2,
            "oldest": [mark, newest],
            "newest": newest,
            "behind": "sub2 (rank 2) is behind",
            "nodes": [mark],
        },
    }
    assert job_lines(job_view(job)) == [
        "",
        "job: 2 running",
        "  progress: 2 nodes marked; oldest sub2 (rank 2), step 11 (data), 6.2 s ago;"
        " newest sub0 (rank 0), step 12 (data), 0.1 s ago",
        "  sub2 (rank 2) is behind",
        "  - sub0 (rank 0): running",
        "  - sub2 (rank 2): running, step 11 (data), 6.2 s ago",
    ]
