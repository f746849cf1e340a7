"""Tier 5: a node lost mid-job; the others' `rallypoint run` exit 75 and Slurm requeues.

The guide's batch script (``#SBATCH --requeue``, ``rallypoint run -- torchrun train.py``)
runs a gloo all-reduce loop that only a stop ends (steady_train.py), with each node's
`run` status and the time it ended recorded in a file. Once every rank has all-reduced:

* gpu08 vanishes: its traffic is dropped, then every process of it is killed, slurmd
  included. The other nodes' sidecars name it lost after 4 keep-alive intervals (12 s),
  their `run` stops torchrun and exits 75, and slurmctld, once SlurmdTimeout passes, sets
  gpu08 DOWN and requeues the job for that node's failure;
* gpu08's sidecars are cut off (their peer port dropped) while every slurmd is fine: all
  three `run` exit 75, so do srun and the batch script, and RequeueExit=75 requeues it.

The measured times and what slurmctld logged are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest

from rallypoint import settings
from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import NODES
from tests.slurm.jobs import FINAL_STATES
from tests.slurm.recorded import Ended, ended, output, submit
from tests.support.netns import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

#: The node that vanishes: not the master (gpu07, the list's first node, which also runs
#: the batch script and srun).
VICTIM = "gpu08"
SURVIVORS = tuple(name for name in slurm_cluster.NODES if name != VICTIM)
#: How long a lost node takes to be named (4 keep-alives of 3 s, one more in flight) ...
LIVENESS_S = 15.0
#: ... plus `run`'s --grace before SIGKILL, the other survivors' stop before the next
#: attempt (the guide's --rejoin-timeout is 0: no wait for the lost node), and room for a
#: shared machine. Slurm names the node down 40-60 s after it went (conf.py).
STOP_BOUND_S = LIVENESS_S + 10.0 + 15.0
#: A node cut off hears none of the others: it waits the whole start bound of the next
#: attempt (--grace and 5 s) before it gives up.
CUT_BOUND_S = STOP_BOUND_S + 15.0
#: What `run` exits with when a node was lost (--lost-exit-code's default).
LOST_EXIT_CODE = 75
#: Torch starting six processes on two shared cores; then Slurm's own node-failure timer.
RUNNING_TIMEOUT_S = 180.0
REQUEUE_TIMEOUT_S = 180.0


def requeue_lines(slurm: slurm_cluster.SlurmCluster, job_id: str) -> list[str]:
    """What slurmctld logged about the job's end and requeue: the reason Slurm acted on.

    A node failure reads "requeue job JobId=N due to failure of node X"; RequeueExit reads
    "_job_complete: JobId=N WEXITSTATUS 75", then "Requeuing JobId=N".
    """
    log = slurm.workdir / "log" / "slurmctld.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    pattern = re.compile(rf"(equeu.*JobId={job_id}\b|JobId={job_id} WEXITSTATUS)")
    return [line for line in text.splitlines() if pattern.search(line)]


def wait_running(slurm: slurm_cluster.SlurmCluster, workdir: Path, job_id: str) -> None:
    """Until every rank has all-reduced once (the job runs on every node)."""

    def running() -> bool:
        state = slurm.job_record(job_id).get("JobState")
        assert state not in FINAL_STATES, output(workdir, job_id)
        return len(set(re.findall(r"RUNNING rank=(\d+)", output(workdir, job_id)))) == NODES

    wait_for(
        running,
        timeout_s=RUNNING_TIMEOUT_S,
        interval_s=0.5,
        what="every rank all-reducing",
        describe=lambda: output(workdir, job_id),
    )
    assert slurm.job_record(job_id).get("Restarts") == "0"


def wait_ended(
    workdir: Path, job_id: str, names: tuple[str, ...], since: float, bound_s: float
) -> dict[str, Ended]:
    """Every named node's `run` status once all of them ended; print how long each took."""

    def all_ended() -> dict[str, Ended] | None:
        found = {name: ended(workdir, name) for name in names}
        return None if None in found.values() else {k: v for k, v in found.items() if v}

    done = wait_for(
        all_ended,
        timeout_s=bound_s + 30,
        interval_s=0.2,
        what=f"`rallypoint run` ended on {', '.join(names)}",
        describe=lambda: output(workdir, job_id),
    )
    took = {name: round(end.at - since, 1) for name, end in done.items()}
    statuses = {name: end.status for name, end in done.items()}
    print(f"job {job_id}: `rallypoint run` ended after {took} s with {statuses}")
    assert all(seconds <= bound_s for seconds in took.values()), took
    return done


def first_failure_lines(job_text: str, host: str, rank: int) -> list[str]:
    """`run`'s last line on each node that stopped: the first failure, named, and the exit."""
    pattern = re.compile(
        rf"^rallypoint: first failure: {host} \(rank {rank}\) lost: .*; exit {LOST_EXIT_CODE}$"
    )
    return [line for line in job_text.splitlines() if pattern.match(line)]


def wait_requeued(slurm: slurm_cluster.SlurmCluster, job_id: str, since: float) -> dict[str, str]:
    """Until the job is back in the queue (PENDING, Restarts >= 1); print what Slurm says."""

    def requeued() -> dict[str, str] | None:
        record = slurm.job_record(job_id)
        restarted = int(record.get("Restarts", "0")) >= 1
        return record if restarted and record.get("JobState") == "PENDING" else None

    record = wait_for(
        requeued,
        timeout_s=REQUEUE_TIMEOUT_S,
        interval_s=1.0,
        what=f"job {job_id} requeued and pending",
        describe=lambda: f"{slurm.job_record(job_id)}\n{slurm.describe()}",
    )
    print(
        f"job {job_id}: pending again {time.time() - since:.1f} s after the fault:"
        f" Restarts={record.get('Restarts')} Reason={record.get('Reason')}"
        f" EligibleTime={record.get('EligibleTime')} nodes={slurm.node_states()}"
    )
    for line in requeue_lines(slurm, job_id):
        print(f"slurmctld: {line}")
    return record


def test_vanished_node_stops_the_others_with_75_and_slurm_requeues(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    """gpu08 vanishes mid-job: the others exit 75 in seconds; Slurm requeues on its failure."""
    workdir, job_id = submit(slurm, job_env, "vanish")
    vanished = False
    try:
        wait_running(slurm, workdir, job_id)
        started = time.time()
        slurm.vanish(VICTIM)
        vanished = True
        survivors = wait_ended(workdir, job_id, SURVIVORS, started, STOP_BOUND_S)
        text = output(workdir, job_id)
        assert {n: e.status for n, e in survivors.items()} == dict.fromkeys(
            SURVIVORS, LOST_EXIT_CODE
        ), text
        # Each survivor's last word names the node that vanished, and its exit status.
        assert len(first_failure_lines(text, VICTIM, 1)) == len(SURVIVORS), text
        wait_requeued(slurm, job_id, started)
        # Slurm requeued the job because gpu08 failed: it saw the node go, not a status.
        reasons = requeue_lines(slurm, job_id)
        assert any(f"failure of node {VICTIM}" in line for line in reasons), reasons
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(job_id)
        if vanished:
            slurm.revive(VICTIM)
            slurm.wait_idle(120)


def test_sidecars_cut_off_exit_75_and_requeue_exit_requeues(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    """gpu08's sidecar port is cut mid-job while Slurm sees nothing wrong with any node.

    Every node's `run` names a node lost (the others gpu08, gpu08 the master) and exits
    75; srun ends with 75, the batch script too, and RequeueExit=75 requeues the job: the
    path the guide relies on when the nodes themselves are fine.
    """
    workdir, job_id = submit(slurm, job_env, "cut-sidecar")
    # The job's sidecars' peer port (one pair per job): cutting it cuts them off, and nothing else.
    _, peer_port = settings.job_ports({"SLURM_JOB_ID": job_id}) or (0, 0)
    cut = False
    try:
        wait_running(slurm, workdir, job_id)
        started = time.time()
        slurm.cut_port(VICTIM, peer_port)
        cut = True
        nodes = wait_ended(workdir, job_id, slurm_cluster.NODES, started, CUT_BOUND_S)
        text = output(workdir, job_id)
        statuses = {name: end.status for name, end in nodes.items()}
        assert statuses == dict.fromkeys(slurm_cluster.NODES, LOST_EXIT_CODE), text
        record = wait_requeued(slurm, job_id, started)
        # No node failed: the batch script's exit 75 is what Slurm acted on.
        assert "down" not in " ".join(slurm.node_states().values()), slurm.describe()
        reasons = requeue_lines(slurm, job_id)
        assert not any("failure of node" in line for line in reasons), reasons
        assert any(f"WEXITSTATUS {LOST_EXIT_CODE}" in line for line in reasons), reasons
        assert any(line.endswith(f"Requeuing JobId={job_id}") for line in reasons), reasons
        assert record.get("ExitCode") == f"{LOST_EXIT_CODE}:0", record
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(job_id)
        if cut:
            slurm.cut_port(VICTIM, peer_port, action="-D")
