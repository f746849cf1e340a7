"""Tier 4: docker/compose.yaml restarts the job in place, on a real Docker engine.

One session takes both paths, one after the other on the same sidecars:

* A crash: sub2's stand-in trainer exits 3 after its first exchange in attempt 0
  (TRAINER_CRASH_HOST). `rallypoint run` (RALLYPOINT_RESTARTS) starts attempt 1 on every
  node inside the same containers.
* A trainer container that dies: mid attempt 1, sub1's `run`, its trainer container's PID
  1, is SIGKILLed from the host (as the kernel's OOM killer would; `docker kill` is a
  manual stop that no restart policy undoes). `restart: on-failure` starts the container
  again; its new `run` names the node lost in attempt 1, the others stop, and every node
  runs attempt 2 to its end: every trainer exits 0, only sub1's container was restarted.
"""

from __future__ import annotations

import json
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
RESTARTING_AGAIN = "rallypoint: restarting: attempt 2 on every node (2 of --restarts 2)"


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
def test_a_crash_then_a_trainer_container_restarted_on_failure_each_restart_the_job_in_place(
    session: engine.ComposeSession,
) -> None:
    with session.logs_on_failure():
        session.up()
        engine.wait_until(
            "every trainer mid-job in attempt 1", lambda: not_mid_job(session), MID_JOB_TIMEOUT_S
        )
        os.kill(session.state("sub1-trainer")["Pid"], signal.SIGKILL)  # `run`, PID 1 in there
        results = ended(session)
        codes = {s: r[:2] for s, r in results.items()}
        assert codes == {"main1-trainer": (0, 0), "sub1-trainer": (0, 1), "sub2-trainer": (0, 0)}
        for service in ("main1-trainer", "sub2-trainer"):
            logs = results[service][2]
            assert "first failure: sub2 (rank 2) exited 3" in logs, f"{service}:\n{logs}"
            lost = "first failure in attempt 1: sub1 (rank 1) lost: its run ended without a report"
            assert lost in logs, f"{service}:\n{logs}"
            assert RESTARTING in logs and RESTARTING_AGAIN in logs, f"{service}:\n{logs}"
            assert engine.parse_summary(logs) is not None, f"{service}:\n{logs}"
        assert "rallypoint-trainer-crashed sub2 with 3" in results["sub2-trainer"][2]
        # The restarted container's logs hold both runs: the killed one, then attempt 2's.
        assert engine.parse_summary(results["sub1-trainer"][2]) is not None
        for sidecar in ("main1", "sub2"):
            job = session.sidecar_status(sidecar)["job"]
            assert job["attempt"] == 2, job
            firsts = [(a["attempt"], a["host"], a["state"]) for a in job["attempts"]]
            assert firsts == [(0, "sub2", "exited"), (1, "sub1", "lost")], job


def not_mid_job(session: engine.ComposeSession) -> str | None:
    """Which trainer has not logged its first exchange in attempt 1 yet."""
    for service in TRAINERS:
        said = [
            json.loads(line.partition(TRAINING)[2])
            for line in session.container_logs(service).splitlines()
            if TRAINING in line
        ]
        if not any(info.get("attempt") == 1 for info in said):
            return f"{service} has not logged its first exchange in attempt 1"
    return None
