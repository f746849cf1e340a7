"""A hang, named and stopped: a real gloo job whose one rank stops making progress.

Every node runs `rallypoint run --stall-timeout 5 -- steps.py --progress`: each step marks
RALLYPOINT_PROGRESS_FILE once its batch is loaded and once before the all-reduce, as
docs/run.md advises. sub2's rank hangs in its data phase of step 3 (``--stall 2:3``): the
others block in step 3's all-reduce, whose gloo timeout is 30 minutes. Every node must stop
within seconds of the bound, name sub2 (whose progress stopped first) as stalled, and leave
nothing of the job behind; the same job that keeps progressing, through a checkpoint longer
than the bound but within --stall-timeout-checkpoint, is never stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import steps
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.procs import Proc

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

HOSTS = ("main1", "sub1", "sub2")
READY_S = 60.0
#: torch's import and gloo's set-up on a loaded two-core machine, then the steps.
END_S = 240.0
STEPS = Path(steps.__file__)
STALL_S = 5
RUN = ("--stall-timeout", str(STALL_S), "--stall-timeout-checkpoint", "20", "--grace", "2")
#: 4 MiB all-reduced per step after 0.5 s of "compute".
JOB = ("--mib", "4", "--compute-s", "0.5", "--progress")


def start(make_cluster: MakeCluster) -> Cluster:
    return make_cluster(hosts=HOSTS, args=("--keepalive", "1")).ready(READY_S)


def supervise(cluster: Cluster, *job: str) -> dict[str, Proc]:
    argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60", *RUN]
    argv += ["--", sys.executable, str(STEPS), *JOB, *job]
    return {node.name: node.spawn(argv, label="run") for node in cluster}


def ended(runs: dict[str, Proc]) -> tuple[dict[str, int], dict[str, float]]:
    """Each run's status and when it ended (polled every 0.1 s)."""
    codes: dict[str, int] = {}
    at: dict[str, float] = {}
    deadline = time.monotonic() + END_S
    try:
        while len(codes) < len(runs):
            for name, proc in runs.items():
                if name not in codes:
                    try:
                        codes[name] = proc.wait(0.0)
                        at[name] = time.time()
                    except subprocess.TimeoutExpired:
                        pass
            if time.monotonic() > deadline:
                pytest.fail(f"a run did not end: {[p.log()[-2000:] for p in runs.values()]}")
            time.sleep(0.1)
    finally:
        for proc in runs.values():
            proc.kill()
    return codes, at


def job_lines(proc: Proc, kind: str) -> list[str]:
    return [x for x in proc.log().splitlines() if x.startswith(kind + " ")]


def left_in(cluster: Cluster) -> list[str]:
    """steps.py processes still alive in the nodes' namespaces."""
    found = []
    for node in cluster:
        pids = subprocess.run(
            ["ip", "netns", "pids", node.ns], capture_output=True, text=True, check=True
        ).stdout.split()
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(STEPS).encode() in cmdline:
                found.append(f"{node.name}:{pid}")
    return found


def test_a_rank_that_stops_progressing_is_named_stalled_and_stops_the_job_everywhere(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    runs = supervise(cluster, "--stall", "2:3")
    codes, at = ended(runs)
    assert codes == dict.fromkeys(HOSTS, 1), (codes, cluster.logs())
    stalled_at = json.loads(job_lines(runs["sub2"], "STALL")[0].split(" ", 1)[1])["at"]
    for name, proc in runs.items():
        log = proc.log()
        line = [x for x in log.splitlines() if x.startswith("rallypoint: first failure:")][-1]
        assert "sub2 (rank 2) stalled at step 2 (collective), no progress for" in line, log
        assert line.endswith("; exit 1"), line
        # Its progress stopped before its step 3 batch; the others marked step 3 (data).
        assert "rallypoint: sub2 (rank 2) is behind: its last progress was step 2" in log, log
        print(f"{name}: run ended {at[name] - stalled_at:.2f} s after sub2 stalled")
    for name in ("main1", "sub1"):
        # Blocked in the all-reduce, 30 minutes from gloo's own timeout: stopped by `run` (or,
        # as sub2's job went a moment before the stop arrived, by its closed connections).
        assert job_lines(runs[name], "SIGTERM") or job_lines(runs[name], "ERROR"), name
        assert at[name] - stalled_at < STALL_S + 30.0, (name, at[name] - stalled_at)
    for node in cluster:
        view = node.get("/job").json()
        assert (view["first"]["host"], view["first"]["state"]) == ("sub2", "stalled"), view
        assert view["progress"]["oldest"][0]["host"] == "sub2", view["progress"]
    assert left_in(cluster) == []


def test_a_job_that_keeps_progressing_is_never_stalled(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    # 16 steps of 0.5 s, past three times the bound, every step marked; after step 3 every
    # rank saves a checkpoint for 8 s (marked so): longer than the bound, within its own.
    codes, _ = ended(supervise(cluster, "--steps", "16", "--slow-save", "3:8"))
    assert codes == dict.fromkeys(HOSTS, 0), (codes, cluster.logs())
    # The master holds every node's last mark: each job's last step.
    master = next(node for node in cluster if node.name == "main1")
    marks = master.get("/job").json()["progress"]["nodes"]
    assert {(m["host"], m["step"]) for m in marks} == {(h, 15) for h in HOSTS}, marks


def test_when_every_rank_stops_at_once_the_node_to_blame_is_said_to_be_unknown(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    """Every rank hangs in step 3's data phase: their last marks (step 2, collective) are
    milliseconds apart, against a phase of 0.5 s. Every node stops and exits 1, and says
    that which node stopped first cannot be told instead of naming one."""
    cluster = start(make_cluster)
    runs = supervise(cluster, "--stall", "all:3")
    codes, _ = ended(runs)
    assert codes == dict.fromkeys(HOSTS, 1), (codes, cluster.logs())
    for proc in runs.values():
        log = proc.log()
        assert "stalled at step 2 (collective), no progress for" in log, log
        said = [x for x in log.splitlines() if "which node stopped first cannot be told" in x]
        assert said and said[0].startswith("rallypoint: which node stopped first"), log
        print(said[0])
        assert "is behind" not in log, log
    assert left_in(cluster) == []
