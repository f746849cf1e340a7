"""Short runs of the fault campaign (campaign.py): every fault kind once, and the job and
restart kinds that nothing else in the suite runs on sidecars that went through faults,
invariants at 0.

The long runs (figures in docs/reliability.md) are the same code:
``python -m tests.multihost.campaign --rounds 200``.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import require
from tests.multihost.campaign import execute
from tests.multihost.injections import FAULTS
from tests.multihost.restarted import RESTART_KINDS
from tests.multihost.rounds import Options
from tests.multihost.supervised import JOB_KINDS, STOPPING

#: One of each fault but the two the relay test runs, in the order given (--cycle).
EVERY_FAULT = tuple(f for f in FAULTS if f not in ("kill_relay", "kill_worker"))
#: The supervised-job kinds that only the campaign runs on sidecars that went through faults:
#: a node lost, a sidecar restarted under a running job (its job marking progress under
#: --stall-timeout: no false stall), and a hang. A failed rank, a stop from outside and a
#: healthy job run on fresh sidecars in test_run.py, a long checkpoint in
#: tests/inprocess/test_attempts.py; the long runs (docs/reliability.md) take every kind.
#: Real torch jobs under `rallypoint run`, one every fourth round; the plain torch jobs
#: (the relay test runs one) are left out here.
SHORT_JOBS = ("job_lost", "job_sidecar_restart", "job_stall")
SUPERVISED_EVERY = 4
ROUNDS = len(EVERY_FAULT) + len(SHORT_JOBS)
#: The restart kinds only the campaign runs: a crash during the restart, a node lost for
#: good, a sidecar restarted mid-attempt. A crash and a lost node that comes back restart
#: on fresh sidecars in test_run.py, checkpoint included; the long runs take every kind.
SHORT_RESTARTS = ("restart_crash_twice", "restart_lost_for_good", "restart_sidecar")


def run(netns_session: str | None, options: Options) -> dict[str, object]:
    require(netns_session is None, f"multi-host tier: {netns_session}")
    lines: list[str] = []
    summary = execute(options, out=lines.append)
    assert lines[0].startswith("seed "), lines[:1]  # a run can always be replayed
    violations = summary["violations"]
    assert isinstance(violations, dict)
    assert sum(violations.values()) == 0, "\n".join(lines)
    return summary


def test_every_fault_and_the_campaigns_own_job_kinds_on_four_nodes_keep_every_invariant(
    tmp_path: Path, netns_session: str | None
) -> None:
    """Four nodes, the master and three workers, take every fault (`halves` splits the
    workers at random) and the job kinds above; the long runs in docs/reliability.md run
    five nodes and every kind."""
    assert set(SHORT_JOBS) <= set(JOB_KINDS) and len(SHORT_JOBS) == ROUNDS // SUPERVISED_EVERY
    options = Options(
        nodes=4,
        rounds=ROUNDS,
        seed=22,
        faults=EVERY_FAULT,
        cycle=True,
        job_every=0,
        supervised_every=SUPERVISED_EVERY,
        jobs=SHORT_JOBS,
        keep=tmp_path / "run",
    )
    summary = run(netns_session, options)
    assert summary["rounds"] == ROUNDS
    assert summary["faults"] == dict.fromkeys(EVERY_FAULT, 1)
    detected = summary["liveness_detection_s"]
    assert isinstance(detected, dict) and detected["n"] > 0  # liveness was really checked
    jobs = summary["supervised"]
    assert isinstance(jobs, dict)
    assert jobs["rounds"] == dict.fromkeys(SHORT_JOBS, 1)
    assert jobs["false_stops"] == 0
    # Every stopped node's stop was timed, in each kind that stops (the 3 others each).
    stops = jobs["stop_latency_s"]
    stopping = [kind for kind in SHORT_JOBS if kind in STOPPING]
    assert {kind: stops[kind]["n"] for kind in stops} == dict.fromkeys(stopping, 3)


def test_the_campaigns_own_restart_kinds_on_three_nodes_keep_every_invariant(
    tmp_path: Path, netns_session: str | None
) -> None:
    """`run --restarts` through a crash during the restart, a node lost for good and a
    sidecar restarted mid-attempt, one after another on the same sidecars: every job
    completes within its budget, attempts never overlap, every node agrees on each
    attempt's first failure. Three nodes (a master, two workers) take every path; the long
    runs in docs/reliability.md run five nodes and every kind. The sidecars keep the default
    keep-alive (3 s, a 12 s bound): a master sidecar killed and started again must be back
    within the product's own bound, which the campaign's 1.5 s leaves too thin on two cores
    shared with the rest of the suite (its restart took 8 s there once)."""
    options = Options(
        nodes=3,
        keepalive_s=3.0,
        rounds=len(SHORT_RESTARTS),
        seed=43,
        faults=EVERY_FAULT,
        cycle=True,
        job_every=0,
        supervised_every=1,
        jobs=SHORT_RESTARTS,
        keep=tmp_path / "run",
    )
    summary = run(netns_session, options)
    jobs = summary["supervised"]
    assert isinstance(jobs, dict)
    assert jobs["rounds"] == dict.fromkeys(SHORT_RESTARTS, 1)
    assert set(SHORT_RESTARTS) <= set(RESTART_KINDS)
    # All but the node lost for good completed, each on the sidecars of the rounds before.
    assert jobs["restarts_completed"] == len(SHORT_RESTARTS) - 1


def test_a_killed_relay_is_named_and_its_group_recovers(
    tmp_path: Path, netns_session: str | None
) -> None:
    options = Options(
        rounds=2,
        seed=7,
        faults=("kill_relay", "kill_worker"),
        relay_group=2,
        job_every=2,
        cycle=True,
        keep=tmp_path / "run",
    )
    summary = run(netns_session, options)
    assert summary["faults"] == {"kill_relay": 1, "kill_worker": 1}
    assert summary["jobs"] == {"run": 1, "completed": 1}
