"""Tier 5: what a real cluster's nodes do to the guide's job: loopback names, held ports."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import run_guide
from tests.support.netns import IFNAME

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def test_own_names_on_127_0_1_1_with_a_pinned_interface(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    """Every node's own name on 127.0.1.1, as Debian's installer writes it.

    With two or more such nodes gloo's full mesh fails (docs/loopback.md). By default the
    sidecars serve GLOO_SOCKET_IFNAME and say in the job's output which name is on loopback,
    and the job completes.
    """
    for name in slurm_cluster.NODES:
        slurm.pin_own_name(name)
    job, lines = run_guide(slurm, "loopback", job_env)
    for line in lines:
        assert line["own_address"] == "127.0.1.1", line  # the situation was real
        assert line["env"]["GLOO_SOCKET_IFNAME"] == IFNAME, line
    # Each sidecar says which name is on loopback, in the job's output.
    warned = [
        line
        for line in job.output.splitlines()
        if "WARNING" in line and ("loopback" in line or "127.0.1.1" in line)
    ]
    for name in slurm_cluster.NODES:
        assert any(name in line for line in warned), job.describe()


#: A process a previous job left behind on the master node: it listens on 29500, as a hung
#: trainer's store would, and outlives the job in its own session.
LEFTOVER_JOB = """\
#!/bin/bash
#SBATCH --job-name=previous
#SBATCH --nodes=1
set -euo pipefail
setsid python3 -c '
import os, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29500))
s.listen()
with open("holder.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace("holder.tmp", "holder.pid")
time.sleep(3600)
' < /dev/null > holder.log 2>&1 &
for _ in $(seq 100); do [ -e holder.pid ] && break; sleep 0.1; done
[ -e holder.pid ] || { cat holder.log; exit 1; }
echo "holder $(cat holder.pid) holds 29500 on $(hostname)"
"""


def test_port_still_held_by_the_previous_job_on_the_master(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    """A previous job's leftover holds 29500 on gpu07: the next job is served another port."""
    master = slurm_cluster.NODES[0]
    previous = slurm.run_job(
        LEFTOVER_JOB, "previous", args=[f"--nodelist={master}"], env=job_env, timeout_s=60
    )
    assert previous.state == "COMPLETED", previous.describe()
    pid_file = Path(previous.record["WorkDir"]) / "holder.pid"
    holder = int(pid_file.read_text())
    try:
        # Slurm's linuxproc tracking lost it when its parent exited: it outlived the job.
        time.sleep(1)
        assert Path(f"/proc/{holder}").exists(), previous.describe()
        assert holder in slurm.strays(master)
        _, lines = run_guide(slurm, "after-previous", job_env)
        ports = {line["env"]["MASTER_PORT"] for line in lines}
        assert len(ports) == 1 and ports != {"29500"}, ports
        assert Path(f"/proc/{holder}").exists(), "the holder should still hold 29500"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)
