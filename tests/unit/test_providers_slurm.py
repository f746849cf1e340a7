"""The Slurm provider: node lists from hostlist expressions, this node from SLURM_NODEID."""

from __future__ import annotations

import pytest

from rallypoint.providers import detect
from tests.support.providers import assert_one_line_error

Env = dict[str, str]

# What `env | grep SLURM` shows inside a four-node job step.
JOB = {
    "SLURM_JOB_ID": "200505",
    "SLURM_JOBID": "200505",
    "SLURM_JOB_NAME": "test-multi-nodes",
    "SLURM_JOB_NODELIST": "gnode[10,20,25,37]",
    "SLURM_NODELIST": "gnode[10,20,25,37]",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "1(x4)",
    "SLURM_CLUSTER_NAME": "ada",
    "SLURM_LOCALID": "0",
}
NODES = ("gnode10", "gnode20", "gnode25", "gnode37")


@pytest.mark.parametrize("rank", range(4))
def test_every_node_of_a_job(rank: int) -> None:
    environ = {
        **JOB,
        "SLURM_NODEID": str(rank),
        "SLURM_PROCID": str(rank),
        "SLURMD_NODENAME": NODES[rank],
    }
    spec = detect(environ)
    assert (spec.provider, spec.hosts, spec.rank, spec.nnodes) == ("slurm", NODES, rank, 4)
    assert spec.session == "slurm-200505"
    assert dict(spec.facts) == {"job_id": "200505", "nodelist": "gnode[10,20,25,37]"}


@pytest.mark.parametrize(
    ("environ", "hosts", "rank"),
    [
        (
            {"SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]", "SLURM_NODEID": "2"},
            ("rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"),
            2,
        ),
        (
            {"SLURM_JOB_NODELIST": "gpu[01-02,07],login1", "SLURMD_NODENAME": "gpu07"},
            ("gpu01", "gpu02", "gpu07", "login1"),
            2,
        ),
        (
            {"SLURM_JOB_NODELIST": "gpu[01-02]", "HOSTNAME": "gpu02.cluster.example"},
            ("gpu01", "gpu02"),
            1,
        ),
        ({"SLURM_JOB_NODELIST": "n[1]", "SLURM_NODEID": "0", "SLURM_NNODES": "1"}, ("n1",), 0),
    ],
)
def test_node_lists(environ: Env, hosts: tuple[str, ...], rank: int) -> None:
    spec = detect(environ)
    assert (spec.hosts, spec.rank) == (hosts, rank)


def test_session_without_a_job_id_is_shared() -> None:
    first = detect({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "0"})
    second = detect({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "1"})
    assert first.session == second.session
    assert first.session.startswith("slurm-")


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"SLURM_JOB_NODELIST": "gnode[10,20"}, ["SLURM_JOB_NODELIST='gnode[10,20'", "hostlist"]),
        (
            {"SLURM_JOB_NODELIST": "gnode[20-10]"},
            ["SLURM_JOB_NODELIST='gnode[20-10]'", "backwards"],
        ),
        ({"SLURM_JOB_NODELIST": "gnode[0-99999999]"}, ["SLURM_JOB_NODELIST", "more than 65536"]),
        ({"SLURM_JOB_NODELIST": "gnode[10,10,20,25]"}, ["'gnode10'", "more than once"]),
        ({"SLURM_JOB_NODELIST": "gnode_[1-4]"}, ["SLURM_JOB_NODELIST", "'gnode_1'"]),
        ({"SLURM_JOB_NODELIST": "[1-4]"}, ["SLURM_JOB_NODELIST", "'1'", "looks like a number"]),
        ({"SLURM_NNODES": "5"}, ["SLURM_NNODES=5", "4 node(s)"]),
        ({"SLURM_NNODES": "x"}, ["SLURM_NNODES='x'"]),
        ({"SLURM_NODEID": "4"}, ["SLURM_NODEID='4'", "from 0 to 3"]),
        ({"SLURM_NODEID": "1"}, ["SLURM_NODEID=1", "'gnode20'", "SLURMD_NODENAME='gnode10'"]),
        ({"SLURM_NODEID": "", "SLURMD_NODENAME": "gnode99"}, ["SLURMD_NODENAME='gnode99'"]),
        # Measured in a real step: the name is checked even when SLURM_NODEID is set.
        ({"SLURMD_NODENAME": "login1"}, ["SLURMD_NODENAME='login1'", "is not in"]),
        # `srun --nodes=2` in a 4-node job: SLURM_NNODES is the step's, the list the job's.
        ({"SLURM_NNODES": "2"}, ["SLURM_NNODES=2", "4 node(s)", "part of the job's nodes"]),
        ({"SLURM_NODEID": "", "SLURMD_NODENAME": ""}, ["cannot tell which node", "SLURM_NODEID"]),
        ({"SLURM_JOB_ID": "12 34"}, ["SLURM_JOB_ID='12 34'"]),
    ],
)
def test_errors(change: Env, fragments: list[str]) -> None:
    environ = {**JOB, "SLURM_NODEID": "0", "SLURMD_NODENAME": "gnode10", **change}
    assert_one_line_error(environ, fragments)
