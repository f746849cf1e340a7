"""The Slurm provider: the job's node list, expanded from its hostlist expression."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers import hostlist
from rallypoint.providers._common import (
    MAX_NODES,
    build,
    check_nnodes,
    choose_session,
    detected_by,
    find_host,
    get,
    get_int,
    host_name,
    hosts_session,
    session_id,
    show,
    unique,
)

NAME = "slurm"
NODELIST = "SLURM_JOB_NODELIST"
NODEID = "SLURM_NODEID"
NNODES = "SLURM_NNODES"
JOB_ID = "SLURM_JOB_ID"
NODENAME = "SLURMD_NODENAME"


#: True when SLURM_JOB_NODELIST is set and not blank.
detects = detected_by(NODELIST)


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """Nodes of the job allocation in SLURM_JOB_NODELIST order; the first is the master.

    This node is SLURM_NODEID (the node's index in the allocation), else SLURMD_NODENAME
    or HOSTNAME looked up in the list. SLURMD_NODENAME must be in the list and agree with
    SLURM_NODEID, and SLURM_NNODES with the list's length: srun sets both for the step, so
    this catches a step that runs on only part of the allocation.
    """
    expression = get(environ, NODELIST) or ""
    hosts = [host_name(NODELIST, host) for host in hostlist.expand(expression, variable=NODELIST)]
    unique(NODELIST, hosts)
    declared = get_int(environ, NNODES, minimum=1, maximum=MAX_NODES)
    if declared is not None and declared < len(hosts):
        # srun sets SLURM_NNODES (and SLURM_NODEID) for the step, SLURM_JOB_NODELIST for
        # the job: fewer means a step on part of the allocation, whose ranks would not
        # match the job's list and whose missing nodes would never join.
        raise ClusterSpecError(
            f"{NNODES}={declared} but {NODELIST}={show(expression)} names {len(hosts)} node(s):"
            " this step runs on part of the job's nodes; run it on all of them, or give it"
            " its own host list (RALLYPOINT_HOSTS, RALLYPOINT_NODE_RANK; docs/deploy/slurm.md)"
        )
    check_nnodes(environ, NNODES, len(hosts), NODELIST)

    node_id = get_int(environ, NODEID, minimum=0, maximum=len(hosts) - 1)
    nodename = get(environ, NODENAME)
    named = None if nodename is None else find_host(hosts, nodename)
    if nodename is not None and named is None:
        # slurmd sets both from the same allocation: a name outside the list means the
        # environment belongs to another job (carried into a container or a nested shell).
        raise ClusterSpecError(
            f"{NODENAME}={show(nodename)} is not in {NODELIST}={show(expression)}; run the"
            " sidecar in a step of this job (srun), with the environment Slurm gives it"
        )
    if node_id is not None and named is not None and node_id != named:
        raise ClusterSpecError(
            f"{NODEID}={node_id} points at {show(hosts[node_id])} but"
            f" {NODENAME}={show(nodename or '')} is another node; run one sidecar per node"
            " over the whole allocation (srun --ntasks-per-node=1)"
        )
    rank = node_id if node_id is not None else named
    if rank is None:
        hostname = get(environ, "HOSTNAME")
        rank = None if hostname is None else find_host(hosts, hostname)
        if rank is None:
            raise ClusterSpecError(
                f"cannot tell which node of {NODELIST}={show(expression)} this is; set {NODEID}"
                " (srun sets it)"
            )

    facts = [("nodelist", expression)]
    job_id = get(environ, JOB_ID)
    if job_id is None:
        session = hosts_session(environ, NAME, hosts)
    else:
        job_id = session_id(JOB_ID, job_id)
        facts.insert(0, ("job_id", job_id))
        session = choose_session(environ, f"slurm-{job_id}")
    return build(NAME, hosts, rank, session, facts=facts)
