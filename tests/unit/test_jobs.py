"""core/jobs.py and wire/jobstates.py: job states, the first failure, exit statuses, wire form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.core import jobs
from rallypoint.core.jobs import JobBook, JobState
from rallypoint.errors import PeerMessageError
from rallypoint.wire import alive as wirealive
from rallypoint.wire import jobstates
from rallypoint.wire.fields import dump, load

HOSTS = ("main1", "sub1", "sub2", "sub3")


def state(rank: int, what: str, since: float = 10.0, **fields: object) -> JobState:
    return JobState(rank, HOSTS[rank], what, 1.0, since, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "job, failed, described, status",
    [
        (state(1, "exited", code=0), False, "exited 0", None),
        (state(1, "exited", code=3), True, "exited 3", 3),
        (state(1, "killed", signal=9), True, "killed by SIGKILL", 137),
        (state(1, "terminated", signal=15), True, "stopped from outside by SIGTERM", 75),
        (
            state(1, "lost", detail="nothing heard for 12 s"),
            True,
            "lost: nothing heard for 12 s",
            75,
        ),
        (state(1, "stopped"), False, "stopped by the cluster", None),
        (state(1, "running"), False, "running", None),
        (state(1, "killed", signal=99), True, "killed by signal 99", 227),
    ],
)
def test_each_state_says_whether_it_failed_what_happened_and_the_status(
    job: JobState, failed: bool, described: str, status: int | None
) -> None:
    assert job.failed is failed
    assert jobs.describe(job) == described
    if status is not None:
        assert jobs.exit_status(job) == status
        assert jobs.exit_status(job, lost_code=99) == (99 if status == 75 else status)


def test_the_first_failure_is_the_earliest_whatever_order_it_is_heard_in() -> None:
    late, early = state(1, "exited", 20.0, code=1), state(3, "killed", 15.0, signal=6)
    for order in ([late, early], [early, late]):
        book = JobBook(HOSTS)
        for job in order:
            assert book.note(job)
        assert book.first == early
        assert [j.rank for j in book.failures()] == [3, 1]


def test_a_stale_state_never_overtakes_a_newer_one_and_failures_stay() -> None:
    book = JobBook(HOSTS)
    book.note(state(2, "running", 5.0))
    book.note(state(2, "exited", 6.0, code=2))
    assert not book.note(state(2, "running", 7.0))  # late news of the same run
    assert book.state(2).state == "exited"
    book.note(JobState(2, "sub2", "running", 50.0, 50.0))  # a later run
    assert book.state(2).state == "running" and book.first is not None
    assert book.first.code == 2


def test_only_a_running_job_is_lost_and_a_lost_node_stays_lost() -> None:
    book = JobBook(HOSTS)
    assert book.lose(1, 9.0, "x") is None  # never heard of: nothing was running
    book.note(state(1, "exited", code=0))
    assert book.lose(1, 9.0, "x") is None  # done: its sidecar leaving stops nothing
    book.note(state(2, "running"))
    lost = book.lose(2, 9.0, "nothing heard for 12 s")
    assert lost is not None and book.first == lost
    assert not book.note(state(2, "running", 30.0))
    assert book.state(2).state == "lost"


@pytest.mark.parametrize(
    "first, rank, stops",
    [
        (None, 1, False),
        (state(2, "exited", code=1), 1, True),
        (state(1, "exited", code=1), 1, False),  # our own: the child already ended
        (state(1, "lost"), 1, True),  # named lost while cut off: the others stopped
    ],
)
def test_who_stops(first: JobState | None, rank: int, stops: bool) -> None:
    assert jobs.stops(first, rank) is stops


def test_the_attempt_count_only_goes_up_and_a_lower_one_is_no_news() -> None:
    """A restarted sidecar says -1 (or an older count) until it learns the cluster's back."""
    book = JobBook(HOSTS)
    assert book.learn_go(3) and book.go == 3
    version = book.version
    assert not book.learn_go(-1) and not book.learn_go(2)
    assert (book.go, book.version) == (3, version)
    # A state of an older attempt is kept as that node's news, never as the count.
    assert book.note(state(1, "exited", code=0, attempt=1))
    assert book.go == 3
    assert book.first is None  # and an old attempt's failure does not stop this one
    assert book.note(state(2, "exited", code=4, attempt=2))
    assert book.first is None and book.first_of(2) is not None


def test_counts_and_the_table_show_failures_first() -> None:
    book = JobBook(HOSTS)
    book.note(state(0, "running"))
    book.note(state(3, "exited", code=4))
    assert book.counts() == {**dict.fromkeys(jobs.JobStatus, 0), "waiting": 2, "running": 1,
                             "exited": 1}  # fmt: skip
    assert [j.rank for j in book.table(5)] == [3, 0]
    assert [j.rank for j in book.table(1)] == [3]


def test_the_line_names_node_rank_what_and_when() -> None:
    job = state(2, "exited", code=1)
    assert jobs.line(job, 0.42) == (
        "first failure: sub2 (rank 2) exited 1, 0.4 s before this node's stop"
    )
    assert jobs.line(job, None) == "first failure: sub2 (rank 2) exited 1"


# --- wire ------------------------------------------------------------------------------------


def test_states_and_reports_round_trip() -> None:
    job = JobState(2, "sub2", "lost", 1.5, 2.25, detail="nothing heard")
    assert load(dump(jobstates.cut(job)), JobState, 1024, "job") == job
    report = jobstates.Report("killed", 1234.5, None, 9)
    assert jobstates.parse_report(jobstates.encode_report(report)) == report
    alive = wirealive.Alive("s", 2, "sub2", job=job, jobs=(job,), first=job, jobs_seen=4)
    assert wirealive.parse_alive(wirealive.encode_alive(alive)) == alive
    answer = wirealive.AliveAnswer(
        "s", 0, (), 0, "abc123", job, 7, (job,), {"lost": 1, "running": 3}
    )
    assert wirealive.parse_answer(wirealive.encode_answer(answer)) == answer


@pytest.mark.parametrize(
    "body, fault",
    [
        (
            {"state": "lost", "started": 1},
            r"Expected one of starting, running, terminated, stopped, exited, killed, stalled - at "
            r"`\$\.state`",
        ),
        ({"state": "exited", "started": 1}, "an exited job needs its code"),
        ({"state": "killed", "started": 1}, "a killed job needs its signal"),
        ({"state": "exited", "started": 1, "code": 256}, r"<= 255 - at `\$\.code`"),
        ({"state": "running", "started": "soon"}, r"got `str` - at `\$\.started`"),
        ({"state": "running"}, "missing required field `started`"),
        ({"state": "killed", "started": 1, "signal": 0}, r">= 1 - at `\$\.signal`"),
        ({"state": "exited", "started": 1, "code": 0, "at": -1}, r">= 0.0 - at `\$\.at`"),
    ],
)
def test_bad_reports_name_the_field(body: dict[str, object], fault: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^job report: .*{fault}"):
        jobstates.parse_report(json.dumps(body).encode())


def test_a_keepalive_may_not_carry_another_node_s_own_job() -> None:
    body = json.loads(wirealive.encode_alive(wirealive.Alive("s", 2, "sub2")))
    body["job"] = json.loads(dump(jobstates.cut(state(1, "exited", code=1))))
    with pytest.raises(PeerMessageError, match="sender's rank"):
        wirealive.parse_alive(json.dumps(body).encode())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "rank": JSON | st.integers(-2, 5),
        "host": JSON | st.sampled_from(HOSTS),
        "state": JSON | st.sampled_from(list(jobs.JobStatus)),
        "started": JSON,
        "since": JSON,
        "code": JSON,
        "signal": JSON,
        "detail": JSON,
    },
)


@given(FIELDS)
def test_any_state_from_a_peer_is_a_state_or_a_clear_error(value: dict[str, object]) -> None:
    body = {"session": "s", "rank": 0, "down": [], "total": 0, "first": value}
    try:
        job = wirealive.parse_answer(json.dumps(body).encode()).first
    except PeerMessageError as exc:
        assert str(exc).startswith("keep-alive answer: ")
    else:
        assert job is not None and job.state in jobs.JobStatus and job.rank >= 0


@given(FIELDS)
def test_any_report_is_a_report_or_a_clear_error(value: dict[str, object]) -> None:
    try:
        report = jobstates.parse_report(json.dumps(value).encode())
    except PeerMessageError:
        return
    assert report.state in jobs.REPORTED


def test_an_earlier_attempts_first_failure_is_recalled_as_history_only() -> None:
    """A restarted node hears the earlier attempts' first failures from the others: they
    fill its list, and change no node's state nor the attempt under way."""
    book = JobBook(HOSTS)
    book.note(state(2, "running", since=30.0, attempt=2))
    assert book.go == 2
    lost = state(0, "lost", since=5.0, detail="its run ended without a report", attempt=1)
    assert book.recall(lost)
    assert not book.recall(lost)  # known already
    assert [(f.attempt, f.host) for f in book.firsts()] == [(1, "main1")]
    assert book.state(0).state == "waiting" and book.first is None
    # Never the attempt under way (or a later one): those come as states, and can stop jobs.
    assert not book.recall(state(1, "exited", since=31.0, code=3, attempt=2))
    assert not book.recall(state(1, "exited", since=31.0, code=0, attempt=0))  # no failure
    # An earlier failure of the same attempt takes the first place, as note() would.
    assert book.recall(state(3, "exited", since=4.0, code=1, attempt=1))
    assert book.first_of(1) is not None and book.first_of(1).host == "sub3"


def test_a_long_session_keeps_the_failures_of_the_attempts_it_keeps_only() -> None:
    """Every attempt of a session that restarts for ever fails: the book keeps the newest
    KEPT_ATTEMPTS attempts' failures, and a failure older than all of them is no news."""
    book = JobBook(HOSTS)
    attempts = jobs.KEPT_ATTEMPTS * 3
    for attempt in range(attempts):
        for rank in (1, 2):
            book.note(state(rank, "exited", since=10.0 + attempt, code=3, attempt=attempt))
    kept = {f.attempt for f in book.failures()}
    assert kept == set(range(attempts - jobs.KEPT_ATTEMPTS, attempts))
    assert len(book.failures()) == 2 * jobs.KEPT_ATTEMPTS
    assert [f.attempt for f in book.firsts()] == sorted(kept)
    assert not book.recall(state(3, "exited", since=1.0, code=3, attempt=0))
    assert len(book.failures()) == 2 * jobs.KEPT_ATTEMPTS
