"""Tier 4: one node of a running compose session goes away; `rallypoint run` stops the rest.

The trainers of docker/compose.yaml run under `rallypoint run` and are told to keep
"training" (TRAINER_HOLD_S) after their first exchange with the master. Once every
trainer is mid-job, one worker node is taken away, and every other trainer must exit
with the lost-node status (75) and name that node in its first-failure line.

A node here is two running containers, its sidecar and its trainer (they share the
sidecar's network namespace; the init has exited). Both are taken away:

* `stop`: `docker stop` of the trainer, then of the sidecar, the order in which
  `docker-compose stop` takes a node down (dependents first). The node's `run` gets
  the SIGTERM and tells the others it was stopped from outside.
* `kill`: `docker kill -s KILL` of both at once, no signal to handle: the others name
  the node lost once no keep-alive was answered for 4 intervals (12 s).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.compose import engine

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]

FILE = engine.DOCKER_DIR / "compose.yaml"
NODES = ("main1", "sub1", "sub2")
#: The worker node taken away.
VICTIM = "sub2"
#: EX_TEMPFAIL, `run`'s --lost-exit-code default: a node went away, start again.
LOST_EXIT_CODE = 75
#: Long enough that no trainer ends by itself during the test.
HOLD_S = 900
#: Until every trainer is mid-job: the rendezvous and three container starts.
MID_JOB_TIMEOUT_S = 240.0
#: docker stop's SIGKILL delay for the victim's trainer: `run` reports before it exits.
STOP_GRACE_S = 30
TRAINING = "rallypoint-trainer-training "
STOPPED = "rallypoint-trainer-stopped "


@dataclass(frozen=True)
class Removal:
    """One way of taking a node away, and what the others must then say of it."""

    name: str
    take_away: Callable[[engine.ComposeSession, str], None]
    #: The first-failure line's words after "HOST (rank R) ".
    what: str
    #: The victim trainer's own exit status, when it has one to check.
    victim_status: int | None
    #: Generous: seconds from the removal until every other trainer exited.
    bound_s: float


def _stop(session: engine.ComposeSession, node: str) -> None:
    # The trainer first: its `run` reports to its sidecar, which must still be there.
    session.stop([f"{node}-trainer", node], grace_s=STOP_GRACE_S)


def _kill(session: engine.ComposeSession, node: str) -> None:
    session.kill([f"{node}-trainer", node])


REMOVALS = [
    # The trainer handles the forwarded SIGTERM and exits 128+15.
    Removal("stop", _stop, "stopped from outside by SIGTERM", 128 + 15, 60.0),
    # Killed: 128+9 from docker; the others wait out the liveness bound (about 12-15 s).
    Removal("kill", _kill, "lost: ", 128 + 9, 90.0),
]


@pytest.fixture
def session(tools: tuple[str, list[str]]) -> Iterator[engine.ComposeSession]:
    """compose.yaml with trainers that hold, always torn down with down -v."""
    docker, compose = tools
    # A node taken away for good: no rejoin to wait for, no container started again.
    variables = {"TRAINER_HOLD_S": str(HOLD_S), "RALLYPOINT_REJOIN_TIMEOUT": "0",
                 "TRAINER_RESTART": "no"}  # fmt: skip
    project = engine.ComposeSession(docker=docker, compose=compose, file=FILE, variables=variables)
    try:
        yield project
    finally:
        project.down()


@pytest.mark.parametrize("removal", REMOVALS, ids=lambda r: r.name)
def test_other_trainers_exit_75_naming_the_node_taken_away(
    session: engine.ComposeSession, removal: Removal
) -> None:
    """Every other trainer is stopped by its `run`, exits 75 and names the node and rank."""
    survivors = [f"{node}-trainer" for node in NODES if node != VICTIM]
    with session.logs_on_failure():
        session.up()
        engine.wait_until("every trainer mid-job", lambda: _not_mid_job(session), MID_JOB_TIMEOUT_S)
        rank = _rank(session, VICTIM)

        began = time.time()
        removal.take_away(session, VICTIM)
        results = session.wait_trainers(survivors)
        took = {r.service: round(session.finished_at(r.service) - began, 1) for r in results}
        statuses = {r.service: r.exit_code for r in results}
        # The measured figures docs/deploy/compose.md quotes (pytest -rP shows them).
        print(f"{removal.name} {VICTIM}: survivors exited {took} s after, statuses {statuses}")

        for result in results:
            _check_survivor(result, removal, rank)
        slow = {service: s for service, s in took.items() if s > removal.bound_s}
        assert not slow, f"exited later than {removal.bound_s:.0f} s after the {removal.name}"
        if removal.victim_status is not None:
            (victim,) = session.wait_trainers([f"{VICTIM}-trainer"])
            assert victim.exit_code == removal.victim_status, victim.logs


def _not_mid_job(session: engine.ComposeSession) -> str | None:
    """None once every trainer logged its first exchange and every sidecar sees 3 running."""
    for node in NODES:
        if TRAINING not in session.container_logs(f"{node}-trainer"):
            return f"{node}-trainer has not logged its first exchange"
    for node in NODES:
        counts = session.sidecar_status(node)["job"].get("counts") or {}
        if counts.get("running") != len(NODES):
            return f"{node}'s sidecar counts jobs {counts}"
    return None


def _rank(session: engine.ComposeSession, node: str) -> int:
    """The node's rank as its sidecar's job view names it."""
    job = session.sidecar_status(node)["job"]
    assert job["host"] == node, job
    return int(job["rank"])


def _check_survivor(result: engine.TrainerResult, removal: Removal, rank: int) -> None:
    """75, the trainer itself stopped by SIGTERM, and one first-failure line naming the node."""
    assert result.exit_code == LOST_EXIT_CODE, f"{result.service}:\n{result.logs}"
    assert f"{STOPPED}{result.service.removesuffix('-trainer')} by SIGTERM" in result.logs, (
        result.logs
    )
    expected = re.compile(
        rf"^rallypoint: first failure: {VICTIM} \(rank {rank}\) {re.escape(removal.what)}"
        rf".*, [0-9.]+ s (before|after) this node's stop; exit {LOST_EXIT_CODE}$"
    )
    lines = [line for line in result.logs.splitlines() if expected.match(line)]
    assert len(lines) == 1, (
        f"{result.service}: no single line like {expected.pattern}:\n{result.logs}"
    )
    # The job never finished there: no summary line.
    assert result.summary is None, result.logs
