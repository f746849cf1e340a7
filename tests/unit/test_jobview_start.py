"""`run` waiting for the next attempt's start: when the only nodes missing are lost, the
wait is --rejoin-timeout from then, not the whole bound (docs/run.md, "Restarts")."""

from __future__ import annotations

import time

import pytest

from rallypoint.cli import client, jobview
from rallypoint.wire.jobstates import JobView, ShownState

#: The bound of these waits: long beside the early end, short for a unit test.
BOUND_S = 3.0


def serve(monkeypatch: pytest.MonkeyPatch, counts: dict[str, int], start: int | None) -> None:
    """A sidecar whose job view never changes: these counts, this start."""
    own = ShownState(0, "n0", "starting", attempt=1)
    view = JobView(version=1, boot="b", start=start, counts=counts, own=own)

    def report_job(url: str, body: bytes, **_: object) -> JobView:
        return view

    def job(url: str, after: int | None = None, wait_s: float = 0.0) -> JobView:
        time.sleep(min(wait_s, 0.05))
        return view

    monkeypatch.setattr(client, "report_job", report_job)
    monkeypatch.setattr(client, "job", job)


def wait(rejoin_s: float | None) -> tuple[int | None, float]:
    began = time.monotonic()
    attempt = jobview.wait_start(
        "http://sidecar", time.time(), BOUND_S, stopped=lambda: False, say=lambda _: None,
        rejoin_s=rejoin_s,
    )  # fmt: skip
    return attempt, time.monotonic() - began


def test_a_restart_missing_only_lost_nodes_gives_up_after_the_rejoin_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serve(monkeypatch, {"starting": 3, "lost": 1, "waiting": 0}, None)
    attempt, took = wait(0.0)
    assert attempt is None
    assert took < BOUND_S / 2, took


@pytest.mark.parametrize(
    ("counts", "rejoin_s"),
    [
        # A node that is up but not starting yet: the whole bound (its stop takes --grace).
        ({"starting": 2, "stopped": 1, "lost": 1}, 0.0),
        # Nothing lost: the whole bound.
        ({"starting": 3, "stopped": 1}, 0.0),
        # The first attempt: no rejoin timeout applies.
        ({"starting": 3, "lost": 1}, None),
    ],
)
def test_otherwise_the_wait_runs_to_its_bound(
    monkeypatch: pytest.MonkeyPatch, counts: dict[str, int], rejoin_s: float | None
) -> None:
    serve(monkeypatch, counts, None)
    attempt, took = wait(rejoin_s)
    assert attempt is None
    assert took >= BOUND_S, took


def test_a_start_wins_over_a_lost_node(monkeypatch: pytest.MonkeyPatch) -> None:
    serve(monkeypatch, {"starting": 4}, 2)
    assert wait(0.0)[0] == 2


def test_waiting_for_lost_reads_the_counts() -> None:
    assert jobview.waiting_for_lost(JobView(counts={"starting": 1, "lost": 2}))
    assert not jobview.waiting_for_lost(JobView(counts={"starting": 1, "lost": 1, "exited": 1}))
    assert not jobview.waiting_for_lost(JobView(counts={"starting": 3, "lost": 0}))
    assert not jobview.waiting_for_lost(JobView())
