"""The Backend.AI provider against the variable sets Backend.AI injects into containers."""

from __future__ import annotations

import pytest

from rallypoint.errors import ClusterSpecError
from rallypoint.providers import detect
from tests.support.providers import assert_one_line_error

Env = dict[str, str]

SESSION_ID = "3f1c2a9e-7b1d-4a64-9a0e-5f2b1c9d8e71"


def container(hosts: str, own: str, local_rank: int, replicas: str, **extra: str) -> Env:
    """One container's environment the way Backend.AI sets it (role and idx from its name)."""
    role = own.rstrip("0123456789")
    environ = {
        "BACKENDAI_SESSION_ID": SESSION_ID,
        "BACKENDAI_SESSION_NAME": "llama-ft",
        "BACKENDAI_KERNEL_ID": "9a0e5f2b-1c9d-4e71-8f1c-2a9e7b1d4a64",
        "BACKENDAI_CLUSTER_SIZE": str(len(hosts.split(","))),
        "BACKENDAI_CLUSTER_HOSTS": hosts,
        "BACKENDAI_CLUSTER_REPLICAS": replicas,
        "BACKENDAI_CLUSTER_HOST": own,
        "BACKENDAI_CLUSTER_ROLE": role,
        "BACKENDAI_CLUSTER_IDX": own[len(role) :],
        "BACKENDAI_CLUSTER_LOCAL_RANK": str(local_rank),
        "HOSTNAME": own,
    }
    environ.update(extra)
    return environ


# Every container of each session: (own host, LOCAL_RANK as Backend.AI assigns it).
SESSIONS = [
    ("main1,sub1,sub2,sub3", "main:1,sub:3", [("main1", 0), ("sub1", 1), ("sub2", 2), ("sub3", 3)]),
    ("sub1,main1,sub2", "main:1,sub:2", [("main1", 0), ("sub1", 1), ("sub2", 2)]),
    ("sub2,sub1,main1", "main:1,sub:2", [("main1", 0), ("sub1", 1), ("sub2", 2)]),
    # Ten subs: numeric order (sub2 before sub10), not string order.
    (
        "sub10,sub9,sub8,sub7,sub6,sub5,sub4,sub3,sub2,sub1,main1",
        "main:1,sub:10",
        [("main1", 0)] + [(f"sub{i}", i) for i in range(1, 11)],
    ),
]


@pytest.mark.parametrize(("hosts", "replicas", "members"), SESSIONS)
def test_every_container_computes_the_same_cluster(
    hosts: str, replicas: str, members: list[tuple[str, int]]
) -> None:
    specs = [detect(container(hosts, own, rank, replicas)) for own, rank in members]
    ordered = tuple(own for own, _ in sorted(members, key=lambda member: member[1]))
    for spec, (own, local_rank) in zip(specs, members, strict=True):
        assert spec.provider == "backendai"
        assert spec.hosts == ordered
        assert spec.master == "main1"
        assert spec.host == own
        # In a default session the served rank equals Backend.AI's own LOCAL_RANK.
        assert spec.rank == local_rank
        assert spec.session == f"backendai-{SESSION_ID}"
        assert dict(spec.facts)["local_rank"] == str(local_rank)
    assert len({spec.hosts for spec in specs}) == 1


def test_facts_and_preferred_port() -> None:
    environ = container(
        "sub1,main1,sub2", "sub2", 2, "main:1,sub:2", BACKENDAI_DIST_MASTER_PORT="29600"
    )
    spec = detect(environ)
    assert spec.preferred_port == 29600
    assert dict(spec.facts) == {
        "role": "sub",
        "idx": "2",
        "local_rank": "2",
        "session_id": SESSION_ID,
    }


def test_single_container_session() -> None:
    spec = detect(container("main1", "main1", 0, "main:1"))
    assert (spec.hosts, spec.rank, spec.loopback_ok) == (("main1",), 0, True)


def test_minimal_variables_are_enough() -> None:
    spec = detect({"BACKENDAI_CLUSTER_HOSTS": "sub1,main1", "HOSTNAME": "sub1"})
    assert (spec.hosts, spec.rank) == (("main1", "sub1"), 1)
    assert spec.session.startswith("backendai-")
    by_role = detect(
        {
            "BACKENDAI_CLUSTER_HOSTS": "sub1,main1",
            "BACKENDAI_CLUSTER_ROLE": "main",
            "BACKENDAI_CLUSTER_IDX": "1",
        }
    )
    assert by_role.rank == 0


def test_other_roles_follow_main_by_role_then_index() -> None:
    # Model-serving sessions use "worker" containers beside main1.
    environ = container("worker2,main1,worker1", "worker1", 1, "main:1,worker:2")
    spec = detect(environ)
    assert (spec.hosts, spec.rank) == (("main1", "worker1", "worker2"), 1)


def test_custom_host_names_need_the_master_named() -> None:
    hosts = "trainer-b,trainer-a"
    environ = {
        "BACKENDAI_CLUSTER_HOSTS": hosts,
        "BACKENDAI_CLUSTER_HOST": "trainer-a",
        "BACKENDAI_CLUSTER_ROLE": "sub",
    }
    with pytest.raises(ClusterSpecError, match="names no main container"):
        detect(environ)
    spec = detect({**environ, "RALLYPOINT_MASTER": "trainer-b"})
    assert (spec.hosts, spec.rank) == (("trainer-b", "trainer-a"), 1)


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"BACKENDAI_CLUSTER_SIZE": "4"}, ["BACKENDAI_CLUSTER_SIZE=4", "3 node(s)"]),
        ({"BACKENDAI_CLUSTER_SIZE": "three"}, ["BACKENDAI_CLUSTER_SIZE='three'"]),
        ({"BACKENDAI_CLUSTER_HOSTS": "sub1,main1,sub1"}, ["'sub1'", "more than once"]),
        ({"BACKENDAI_CLUSTER_HOSTS": "sub1,main1,sub_2"}, ["BACKENDAI_CLUSTER_HOSTS", "'sub_2'"]),
        (
            {
                "BACKENDAI_CLUSTER_HOSTS": "sub1,main1,main2",
                "BACKENDAI_CLUSTER_REPLICAS": "main:2,sub:1",
            },
            ["2 main containers"],
        ),
        (
            {"BACKENDAI_CLUSTER_HOSTS": "sub1,main1,main2", "BACKENDAI_CLUSTER_REPLICAS": ""},
            ["names 2 main containers", "RALLYPOINT_MASTER"],
        ),
        (
            {"BACKENDAI_CLUSTER_HOSTS": "sub1,sub3,sub2", "BACKENDAI_CLUSTER_REPLICAS": "sub:3"},
            ["names no main container", "RALLYPOINT_MASTER"],
        ),
        ({"BACKENDAI_CLUSTER_REPLICAS": "main:1,sub:3"}, ["adds up to 4", "lists 3"]),
        ({"BACKENDAI_CLUSTER_REPLICAS": "main:1,worker:2"}, ["does not match the roles"]),
        (
            {"BACKENDAI_CLUSTER_REPLICAS": "main:1,sub"},
            ["BACKENDAI_CLUSTER_REPLICAS='main:1,sub'", "role:count"],
        ),
        ({"BACKENDAI_CLUSTER_REPLICAS": "main:1,main:1,sub:1"}, ["role:count"]),
        ({"BACKENDAI_CLUSTER_REPLICAS": "main:1,sub:x"}, ["bad count 'x'"]),
        ({"BACKENDAI_CLUSTER_HOST": "sub9"}, ["BACKENDAI_CLUSTER_HOST='sub9'", "not one of"]),
        ({"BACKENDAI_CLUSTER_ROLE": "main"}, ["BACKENDAI_CLUSTER_ROLE='main'", "'sub2'"]),
        ({"BACKENDAI_CLUSTER_IDX": "1"}, ["BACKENDAI_CLUSTER_IDX=1", "'sub2'"]),
        ({"BACKENDAI_CLUSTER_IDX": "0"}, ["BACKENDAI_CLUSTER_IDX='0'", "from 1"]),
        (
            {"BACKENDAI_CLUSTER_LOCAL_RANK": "3"},
            ["BACKENDAI_CLUSTER_LOCAL_RANK='3'", "from 0 to 2"],
        ),
        (
            {"BACKENDAI_DIST_MASTER_PORT": "0"},
            ["BACKENDAI_DIST_MASTER_PORT='0'", "from 1 to 65535"],
        ),
        ({"BACKENDAI_DIST_MASTER_PORT": "65536"}, ["BACKENDAI_DIST_MASTER_PORT='65536'"]),
        ({"BACKENDAI_SESSION_ID": "not a uuid!"}, ["BACKENDAI_SESSION_ID='not a uuid!'"]),
        ({"RALLYPOINT_MASTER": "sub1"}, ["RALLYPOINT_MASTER='sub1'", "main container 'main1'"]),
        ({"RALLYPOINT_MASTER": "other"}, ["RALLYPOINT_MASTER='other'", "not one of"]),
    ],
)
def test_contradictions_are_errors(change: Env, fragments: list[str]) -> None:
    environ = container("sub1,main1,sub2", "sub2", 2, "main:1,sub:2")
    environ.update(change)
    assert_one_line_error(environ, fragments)


def test_main_role_on_a_host_that_is_not_master_is_an_error() -> None:
    environ = {
        "BACKENDAI_CLUSTER_HOSTS": "head,node",
        "BACKENDAI_CLUSTER_HOST": "node",
        "BACKENDAI_CLUSTER_ROLE": "main",
        "RALLYPOINT_MASTER": "head",
    }
    with pytest.raises(ClusterSpecError, match="contradicts the main container 'head'"):
        detect(environ)


def test_unknown_container_without_host_variables() -> None:
    with pytest.raises(ClusterSpecError, match="BACKENDAI_CLUSTER_HOST"):
        detect({"BACKENDAI_CLUSTER_HOSTS": "main1,sub1", "HOSTNAME": "elsewhere"})
