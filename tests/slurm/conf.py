"""The Slurm configuration of the test cluster, written into its work directory.

Everything Slurm reads or writes (slurm.conf, state, spool, logs, pid files, munge's key
and socket) lives in the work directory, so a fresh cluster starts from empty state and
never touches a Slurm installed on the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PARTITION = "gpu"


def write_config(
    conf: Path, controller: tuple[str, str], nodes: Mapping[str, str], munge_socket: Path
) -> None:
    """slurm.conf at ``conf``, and beside it Slurm's directories and files and munge's key;
    ``controller`` is (name, address), ``nodes`` name -> address."""
    work = conf.parent
    for sub in ("state", "log", "munge", "jobs", *(f"spool/{n}" for n in nodes)):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / "munge").chmod(0o700)
    key = work / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    lines = "\n".join(
        f"NodeName={name} NodeAddr={address} CPUs=2 State=UNKNOWN"
        for name, address in nodes.items()
    )
    conf.write_text(
        SLURM_CONF.format(
            work=work,
            controller=controller[0],
            controller_addr=controller[1],
            socket=munge_socket,
            nodes=lines,
            partition=PARTITION,
            nodelist=",".join(nodes),
        )
    )
    # Under `ip netns exec` /sys has no cgroup hierarchy: slurmd then refuses to start
    # unless a cgroup plugin is named. v1 loads and is never used by linuxproc/task none.
    (work / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    (work / "plugstack.conf").write_text("")


#: slurm.conf of the test cluster. Everything lives in the work directory; SlurmUser is
#: root so that nothing needs the slurm account's permissions on it. A node that stops
#: answering is DOWN after SlurmdTimeout (less up to a third of it between pings: 40-60 s,
#: well after `run` has exited 75 on the others, as with Slurm's default of 300 s), and its
#: batch jobs are requeued (JobRequeue=1; the guide's script also says --requeue); a batch
#: script that exits 75, `rallypoint run`'s status for a lost node, is requeued too.
SLURM_CONF = """\
ClusterName=rallypoint
SlurmctldHost={controller}({controller_addr})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={work}/state
SlurmdSpoolDir={work}/spool/%n
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/spool/%n/slurmd.pid
SlurmctldLogFile={work}/log/slurmctld.log
SlurmdLogFile={work}/log/slurmd-%n.log
PlugStackConfig={work}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
JobRequeue=1
RequeueExit=75
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName={partition} Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP
"""
