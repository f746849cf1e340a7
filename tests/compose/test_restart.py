"""Tier 4: docker/compose.yaml restarts the job in place, on a real Docker engine.

* A crash: sub2's stand-in trainer exits 3 after its first exchange in attempt 0
  (TRAINER_CRASH_HOST). `rallypoint run` (RALLYPOINT_RESTARTS) starts attempt 1 on every
  node inside the same containers: every trainer exits 0 and no container was restarted.
* A trainer container that dies: sub1's `run`, its trainer container's PID 1, is SIGKILLed
  from the host mid-job (as the kernel's OOM killer would; `docker kill` is a manual stop
  that no restart policy undoes). `restart: on-failure` starts the container again; its
  new `run` names the node lost in attempt 0, the others stop, and every node runs
  attempt 1 to its end.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.compose import engine

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]

FILE = engine.DOCKER_DIR / "compose.yaml"
NODES = ("main1", "sub1", "sub2")
TRAINERS = tuple(f"{node}-trainer" for node in NODES)
#: Each attempt's "training" after the first exchange: long enough to kill a run mid-job.
HOLD_S = 20
#: Until every trainer is mid-job, and until every one ended after the restart.
MID_JOB_TIMEOUT_S = 240.0
END_TIMEOUT_S = 300.0
TRAINING = "rallypoint-trainer-training "
RESTARTING = "rallypoint: restarting: attempt 1 on every node (1 of --restarts 2)"


@pytest.fixture
def session(
    request: pytest.FixtureRequest, tools: tuple[str, list[str]]
) -> Iterator[engine.ComposeSession]:
    docker, compose = tools
    variables = {"TRAINER_HOLD_S": str(HOLD_S), **getattr(request, "param", {})}
    project = engine.ComposeSession(docker=docker, compose=compose, file=FILE, variables=variables)
    try:
        yield project
    finally:
        project.down()


def ended(session: engine.ComposeSession) -> dict[str, tuple[int, int, str]]:
    """service -> (exit code, restart count, logs) once every trainer has exited for good."""
    states: dict[str, tuple[int, int, str]] = {}

    def missing() -> str | None:
        for service in TRAINERS:
            state = session.state(service)
            if state["Status"] != "exited" or state["Restarting"]:
                return f"{service} is {state['Status']}"
            states[service] = (state["ExitCode"], session.restarts(service), "")
        return None

    engine.wait_until("every trainer exited", missing, END_TIMEOUT_S)
    return {s: (code, count, session.container_logs(s)) for s, (code, count, _) in states.items()}


@pytest.mark.parametrize("session", [{"TRAINER_CRASH_HOST": "sub2"}], indirect=True)
def test_a_crash_restarts_the_job_in_place_on_every_node(session: engine.ComposeSession) -> None:
    with session.logs_on_failure():
        session.up()
        results = ended(session)
        assert {s: r[:2] for s, r in results.items()} == dict.fromkeys(TRAINERS, (0, 0)), results
        for service, (_, _, logs) in results.items():
            assert RESTARTING in logs, f"{service}:\n{logs}"
            assert "first failure: sub2 (rank 2) exited 3" in logs, f"{service}:\n{logs}"
            assert engine.parse_summary(logs) is not None, f"{service}:\n{logs}"
        assert "rallypoint-trainer-crashed sub2 with 3" in results["sub2-trainer"][2]
        attempts = session.sidecar_status("main1")["job"]["attempts"]
        assert [(a["attempt"], a["host"], a["code"]) for a in attempts] == [(0, "sub2", 3)]


def test_a_trainer_container_restarted_on_failure_rejoins_the_next_attempt(
    session: engine.ComposeSession,
) -> None:
    with session.logs_on_failure():
        session.up()
        engine.wait_until("every trainer mid-job", lambda: not_mid_job(session), MID_JOB_TIMEOUT_S)
        os.kill(session.state("sub1-trainer")["Pid"], signal.SIGKILL)  # `run`, PID 1 in there
        results = ended(session)
        codes = {s: r[:2] for s, r in results.items()}
        assert codes == {"main1-trainer": (0, 0), "sub1-trainer": (0, 1), "sub2-trainer": (0, 0)}
        for service in ("main1-trainer", "sub2-trainer"):
            logs = results[service][2]
            assert "first failure: sub1 (rank 1) lost: its run ended without a report" in logs, logs
            assert RESTARTING in logs and engine.parse_summary(logs) is not None, logs
        # The restarted container's logs hold both runs: the killed one, then attempt 1's.
        assert engine.parse_summary(results["sub1-trainer"][2]) is not None
        job = session.sidecar_status("sub2")["job"]
        assert job["attempt"] == 1, job
        assert [(a["host"], a["state"]) for a in job["attempts"]] == [("sub1", "lost")], job


def not_mid_job(session: engine.ComposeSession) -> str | None:
    for service in TRAINERS:
        if TRAINING not in session.container_logs(service):
            return f"{service} has not logged its first exchange"
    return None
