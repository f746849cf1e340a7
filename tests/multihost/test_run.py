"""`rallypoint run` on namespace hosts: a failure anywhere stops the real job everywhere.

Every node runs `rallypoint run -- python steps.py`: a gloo training loop that computes
(sleeps) and all-reduces 4 MiB per step, with a collective timeout of 30 minutes, the one
`run` has to beat. Each scenario asserts the job's fate on every node: who was stopped,
with which exit status, and that every node named the same first failure. The waits below
stop a hung test; the times they print are measured (bench/stop.py is the benchmark).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import steps
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.layout import PEER_PORT
from tests.support.cluster.nodes import Node
from tests.support.cluster.procs import Proc
from tests.support.netns import wait_for

pytestmark = pytest.mark.multihost

#: Three nodes: a master and two workers take every path (a failure, a loss, a stop seen
#: from the master and from a worker).
HOSTS = ("main1", "sub1", "sub2")
INTERVAL_S = 1.0
READY_S = 60.0
#: Long enough for torch's import and gloo's set-up on a loaded 2-core machine.
RUNNING_S = 120.0
#: The liveness bound at INTERVAL_S (4 intervals, one more to hear of it), with slack.
LOST_S = 5 * INTERVAL_S + 20.0
STEPS = Path(steps.__file__)


def start(make_cluster: MakeCluster, **kwargs: Any) -> Cluster:
    return make_cluster(hosts=HOSTS, args=("--keepalive", str(INTERVAL_S)), **kwargs).ready(READY_S)


def supervise(cluster: Cluster, *job_args: str, run_args: tuple[str, ...] = ()) -> dict[str, Proc]:
    """`rallypoint run -- steps.py ARGS` on every node."""
    argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60", *run_args]
    argv += ["--", sys.executable, str(STEPS), "--mib", "4", *job_args]
    return {node.name: node.spawn(argv, label="run") for node in cluster}


def lines(proc: Proc, kind: str) -> list[dict[str, Any]]:
    prefix = kind + " "
    return [json.loads(x[len(prefix) :]) for x in proc.log().splitlines() if x.startswith(prefix)]


def wait_running(cluster: Cluster, runs: dict[str, Proc], step: int = 0) -> None:
    """Every rank past ``step``'s all-reduce (gloo's full mesh is up everywhere)."""
    wait_for(
        lambda: all(any(s["step"] >= step for s in lines(p, "STEP")) for p in runs.values()),
        timeout_s=RUNNING_S,
        what=f"every rank past step {step}",
        describe=cluster.logs,
    )


def ends(runs: dict[str, Proc], names: tuple[str, ...], timeout_s: float) -> dict[str, int]:
    out = {}
    for name in names:
        try:
            out[name] = runs[name].wait(timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}'s run did not end: {runs[name].log()[-3000:]}")
    return out


def first_failure_line(proc: Proc) -> str:
    found = [x for x in proc.log().splitlines() if "rallypoint: first failure:" in x]
    assert found, proc.log()[-3000:]
    return found[-1]


def kill_node(node: Node) -> None:
    """The node vanishes: its link goes down first (no FIN, no RST), then every process dies."""
    node.link_down()
    pids = subprocess.run(
        ["ip", "netns", "pids", node.ns], capture_output=True, text=True, check=True
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def test_a_failed_rank_stops_every_other_node_with_its_status(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    # sub2 (rank 2) exits 3 after step 2; the others are in a 6 s compute phase then: the
    # stop must reach them before they find its closed connections themselves.
    runs = supervise(cluster, "--compute-s", "6", "--fail-rank", "2", "--fail-step", "2")
    try:
        wait_running(cluster, runs)
        codes = ends(runs, HOSTS, RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    assert codes == dict.fromkeys(HOSTS, 3), (codes, cluster.logs())
    failed_at = lines(runs["sub2"], "FAIL")[0]["at"]
    for name in ("main1", "sub1"):
        stopped = lines(runs[name], "SIGTERM")
        assert stopped, runs[name].log()[-3000:]
        print(f"{name}: job signalled {stopped[0]['at'] - failed_at:.3f} s after sub2 failed")
        line = first_failure_line(runs[name])
        assert "sub2 (rank 2) exited 3" in line and line.endswith("exit 3"), line
    # The failed node names itself: it is the first failure everywhere.
    assert "sub2 (rank 2) exited 3" in first_failure_line(runs["sub2"])
    for node in cluster:
        first = node.get("/job").json()["first"]
        assert (first["host"], first["state"], first["code"]) == ("sub2", "exited", 3)
    shown = cluster["sub1"].run([sys.executable, "-m", "rallypoint", "status"], timeout_s=30.0)
    assert "first failure: sub2 (rank 2) exited 3" in shown.stdout, shown.stdout


def test_a_lost_node_stops_the_others_with_the_requeue_status(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    # A job that ignores SIGTERM (blocked in a collective, or a handler that never returns)
    # is killed after the grace.
    runs = supervise(cluster, "--compute-s", "0.2", "--ignore-term", run_args=("--grace", "1"))
    try:
        wait_running(cluster, runs, step=2)
        killed_at = time.time()
        kill_node(cluster["sub2"])
        # Without run the survivors would block in all_reduce for gloo's 30 minutes.
        codes = ends(runs, ("main1", "sub1"), LOST_S)
    finally:
        for proc in runs.values():
            proc.kill()
        cluster["sub2"].link_up()
    assert codes == dict.fromkeys(("main1", "sub1"), 75), (codes, cluster.logs())
    for name in ("main1", "sub1"):
        line = first_failure_line(runs[name])
        assert "sub2 (rank 2) lost: nothing heard for" in line and line.endswith("exit 75"), line
        stopped = lines(runs[name], "SIGTERM")
        assert stopped, runs[name].log()[-3000:]
        print(f"{name}: job signalled {stopped[0]['at'] - killed_at:.3f} s after sub2 vanished")
        assert "did not stop within --grace 1s: SIGKILL" in runs[name].log()


def test_a_node_whose_sidecar_is_cut_off_stops_with_every_other_on_the_requeue_status(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    """sub2's peer port is cut both ways; the job's own traffic still flows.

    The master names sub2 lost first (its bound on a member is one interval shorter than
    sub2's on its upstream), so the others are stopped with 75 before sub2 stops anything.
    sub2's job then fails on their closed connections, and its `run` waits until its own
    sidecar names the master lost: the failure it could not hear of came first. Every node
    exits 75, whatever order the stops took.
    """
    cluster = start(make_cluster)
    runs = supervise(cluster, "--compute-s", "0.2")
    try:
        wait_running(cluster, runs, step=2)
        cluster["sub2"].cut_port(PEER_PORT)
        codes = ends(runs, HOSTS, LOST_S)
    finally:
        for proc in runs.values():
            proc.kill()
        cluster["sub2"].clear_faults()
    assert codes == dict.fromkeys(HOSTS, 75), (codes, cluster.logs())
    for name in ("main1", "sub1"):
        line = first_failure_line(runs[name])
        assert "sub2 (rank 2) lost: nothing heard for" in line and line.endswith("exit 75"), line
    line = first_failure_line(runs["sub2"])
    assert "main1 (rank 0) lost: nothing heard for" in line and line.endswith("exit 75"), line


def test_a_node_stopped_from_outside_stops_the_others_with_the_requeue_status(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    runs = supervise(cluster, "--compute-s", "0.5", run_args=("--lost-exit-code", "99"))
    try:
        wait_running(cluster, runs, step=1)
        runs["sub1"].signal(signal.SIGTERM)  # the scheduler stops one node (run's group only)
        codes = ends(runs, HOSTS, RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    # The node told to stop ends as its job did (SIGTERM: 143); the others with the flag's code.
    assert codes == {"sub1": 143, "main1": 99, "sub2": 99}, (codes, cluster.logs())
    for name in ("main1", "sub2"):
        line = first_failure_line(runs[name])
        assert "sub1 (rank 1) stopped from outside by SIGTERM" in line, line


def test_healthy_jobs_end_0_and_done_nodes_leaving_or_vanishing_stop_nobody(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    # sub1 writes its "checkpoint" for 3 liveness bounds after the last collective, while
    # every other node is done and goes away: sub2's container ends (SIGTERM: its sidecar
    # says goodbye), main1's whole node vanishes (SIGKILL: no goodbye).
    linger = str(3 * 5 * INTERVAL_S)
    runs = supervise(cluster, "--steps", "4", "--linger-rank", "1", "--linger-s", linger)
    try:
        done = ends(runs, ("main1", "sub2"), RUNNING_S)
        sidecar = cluster["sub2"].sidecar
        assert sidecar is not None
        sidecar.stop()
        wait_for(
            lambda: [x["host"] for x in cluster["sub1"].status()["liveness"]["left"]] == ["sub2"],
            timeout_s=10.0, what="sub2 shown left on sub1",
        )  # fmt: skip
        cluster["main1"].kill_sidecar()
        lingering = ends(runs, ("sub1",), RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    assert done == {"main1": 0, "sub2": 0}, cluster.logs()
    assert lingering == {"sub1": 0}, runs["sub1"].log()[-3000:]
    assert lines(runs["sub1"], "DONE") and not lines(runs["sub1"], "SIGTERM")
    status = cluster["sub1"].get("/job").json()
    assert status["first"] is None, status
    liveness = cluster["sub1"].status()["liveness"]
    # Left is shown as left; the vanished master, done, is down but not lost.
    assert [x["host"] for x in liveness["left"]] == ["sub2"], liveness
    assert [x["host"] for x in liveness["down"]] == ["main1"], liveness


def test_the_same_command_run_again_after_a_failure_completes_on_every_node(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    """A session that stays up can always run again: the sidecars are not restarted."""
    cluster = start(make_cluster)
    runs = supervise(cluster, "--compute-s", "0.5", "--fail-rank", "2", "--fail-step", "2")
    try:
        failed = ends(runs, HOSTS, RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    assert failed == dict.fromkeys(HOSTS, 3), (failed, cluster.logs())
    # The user starts the same command again on every node, with no fault.
    again = supervise(cluster, "--compute-s", "0.2", "--steps", "4")
    try:
        done = ends(again, HOSTS, RUNNING_S)
    finally:
        for proc in again.values():
            proc.kill()
    assert done == dict.fromkeys(HOSTS, 0), (done, cluster.logs())
    for name, proc in again.items():
        started = lines(proc, "START")
        assert [s["attempt"] for s in started] == [1], (name, proc.log()[-3000:])
        assert lines(proc, "DONE"), proc.log()[-3000:]
    view = cluster["sub1"].get("/job").json()
    assert view["attempt"] == 1 and view["first"] is None, view
    assert [(f["attempt"], f["host"], f["code"]) for f in view["attempts"]] == [(0, "sub2", 3)]


def test_restarts_bring_a_crashed_job_back_on_every_node_from_its_checkpoint(
    make_cluster: MakeCluster, torch_script: Any, tmp_path: Path
) -> None:
    cluster = start(make_cluster)
    checkpoint = str(tmp_path / "rank{rank}.step")
    runs = supervise(
        cluster,
        *("--compute-s", "0.3", "--steps", "6", "--checkpoint", checkpoint),
        *("--fail-rank", "2", "--fail-step", "2", "--fail-attempt", "0"),
        run_args=("--restarts", "2", "--grace", "2"),
    )
    try:
        codes = ends(runs, HOSTS, 2 * RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    assert codes == dict.fromkeys(HOSTS, 0), (codes, cluster.logs())
    failed_at = lines(runs["sub2"], "FAIL")[0]["at"]
    for name, proc in runs.items():
        started = lines(proc, "START")
        assert [s["attempt"] for s in started] == [0, 1], (name, proc.log()[-3000:])
        assert started[1]["from"] >= 1, started  # resumed, not from scratch
        assert "restarting: attempt 1 on every node (1 of --restarts 2)" in proc.log()
        print(f"{name}: attempt 1 set up {started[1]['at'] - failed_at:.3f} s after the crash")


def test_a_lost_node_that_comes_back_restarts_the_job_on_every_node(
    make_cluster: MakeCluster, torch_script: Any, tmp_path: Path
) -> None:
    """sub2 vanishes mid-job (link down, every process killed); its container is restarted
    5 s later: its sidecar rejoins the same session and its `run` starts again. Every node
    then runs the next attempt to its end, resuming from the checkpoint."""
    cluster = start(make_cluster)
    checkpoint = str(tmp_path / "rank{rank}.step")
    job_args = ("--compute-s", "0.3", "--steps", "12", "--checkpoint", checkpoint)
    run_args = ("--restarts", "1", "--rejoin-timeout", "120", "--grace", "1")
    runs = supervise(cluster, *job_args, run_args=run_args)
    victim = cluster["sub2"]
    try:
        # Past step 3 everywhere: every rank's checkpoint holds step 2 or later (a rank says
        # STEP before it saves it).
        wait_running(cluster, runs, step=3)
        kill_node(victim)
        time.sleep(5.0)
        victim.link_up()
        victim.start_sidecar()
        argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "120"]
        argv += [*run_args, "--", sys.executable, str(STEPS), "--mib", "4", *job_args]
        runs["sub2"] = victim.spawn(argv, label="run-again")
        back_at = time.time()
        codes = ends(runs, HOSTS, 2 * RUNNING_S)
    finally:
        for proc in runs.values():
            proc.kill()
    assert codes == dict.fromkeys(HOSTS, 0), (codes, cluster.logs())
    for name in ("main1", "sub1"):
        log = runs[name].log()
        assert "sub2 (rank 2) lost: nothing heard for" in first_failure_line(runs[name]), log
        started = lines(runs[name], "START")
        assert [s["attempt"] for s in started] == [0, 1], log[-3000:]
        assert started[1]["from"] >= 2, started
        print(f"{name}: attempt 1 set up {started[1]['at'] - back_at:.3f} s after sub2's run began")
    assert [s["attempt"] for s in lines(runs["sub2"], "START")] == [1], runs["sub2"].log()


def test_a_run_killed_and_started_again_names_its_node_and_restarts_the_job_everywhere(
    make_cluster: MakeCluster, torch_script: Any, tmp_path: Path
) -> None:
    """sub2's `run` is SIGKILLed mid-job (its job dies with it, nothing reports the end) and a
    new `run` starts there, as a container restarted on failure would. The others, in a
    compute phase that outlasts the news, are stopped naming sub2, and every node runs the
    next attempt to its end from the checkpoint."""
    cluster = start(make_cluster)
    checkpoint = str(tmp_path / "rank{rank}.step")
    job_args = ("--compute-s", "4", "--steps", "2", "--checkpoint", checkpoint)
    run_args = ("--restarts", "1", "--grace", "2")
    runs = supervise(cluster, *job_args, run_args=run_args)
    try:
        wait_running(cluster, runs, step=0)
        runs["sub2"].signal(signal.SIGKILL)  # run only: its job dies with it
        killed_at = time.time()
        argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60"]
        argv += [*run_args, "--", sys.executable, str(STEPS), "--mib", "4", *job_args]
        again = cluster["sub2"].spawn(argv, label="run-again")
        codes = ends({**runs, "sub2": again}, HOSTS, 2 * RUNNING_S)
    finally:
        for proc in [*runs.values(), again]:
            proc.kill()
    assert codes == dict.fromkeys(HOSTS, 0), (codes, cluster.logs())
    for name in ("main1", "sub1"):
        log = runs[name].log()
        line = first_failure_line(runs[name])
        assert "sub2 (rank 2) lost: its run ended without a report" in line, log[-3000:]
        assert not lines(runs[name], "ERROR"), log[-3000:]  # stopped, not failed on sub2
        stopped = lines(runs[name], "SIGTERM")
        print(f"{name}: job signalled {stopped[0]['at'] - killed_at:.3f} s after sub2's run died")
        assert [s["attempt"] for s in lines(runs[name], "START")] == [0, 1], log[-3000:]
    assert [s["attempt"] for s in lines(again, "START")] == [1], again.log()
