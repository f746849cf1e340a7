"""detect() dispatch and the explicit, mdns and single providers, from tables."""

from __future__ import annotations

import pytest

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers import NAMES, detect

Env = dict[str, str]


def fails(environ: Env, *fragments: str, provider: str | None = None) -> None:
    """Assert detect() raises a one-line ClusterSpecError containing every fragment."""
    with pytest.raises(ClusterSpecError) as info:
        detect(environ, provider)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


# --- auto-detection order -------------------------------------------------------------------

BACKENDAI = {"BACKENDAI_CLUSTER_HOSTS": "main1", "BACKENDAI_CLUSTER_HOST": "main1"}
SLURM = {"SLURM_JOB_NODELIST": "n1", "SLURM_NODEID": "0"}
K8S = {
    "JOB_COMPLETION_INDEX": "0",
    "RALLYPOINT_NNODES": "2",
    "RALLYPOINT_JOB": "t",
    "RALLYPOINT_SUBDOMAIN": "s",
}
MDNS = {"RALLYPOINT_DISCOVERY": "mdns", "RALLYPOINT_NNODES": "3"}
EXPLICIT = {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "0"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({**EXPLICIT, **BACKENDAI, **SLURM, **K8S}, "explicit"),
        ({**BACKENDAI, **SLURM, **K8S, **MDNS}, "backendai"),
        ({**SLURM, **K8S, **MDNS}, "slurm"),
        ({**K8S, "RALLYPOINT_DISCOVERY": "mdns"}, "kubernetes"),
        (MDNS, "mdns"),
        ({"HOSTNAME": "laptop"}, "single"),
        ({}, "single"),
        # Blank variables count as unset (compose's ${VAR:-} leaves them empty).
        ({"RALLYPOINT_HOSTS": "  ", "SLURM_JOB_NODELIST": ""}, "single"),
        # A StatefulSet-style name with the size set is Kubernetes ...
        (
            {"HOSTNAME": "trainer-1", "RALLYPOINT_NNODES": "2", "RALLYPOINT_SUBDOMAIN": "t"},
            "kubernetes",
        ),
        # ... unless the operator asked for mDNS discovery.
        ({"HOSTNAME": "trainer-1", **MDNS}, "mdns"),
        (
            {"HOSTNAME": "trainer-1", **MDNS, "RALLYPOINT_HOST_TEMPLATE": "trainer-{index}"},
            "kubernetes",
        ),
    ],
)
def test_auto_detection_order(environ: Env, expected: str) -> None:
    assert detect(environ).provider == expected


def test_names_are_the_detection_order() -> None:
    assert NAMES == ("explicit", "backendai", "slurm", "kubernetes", "mdns", "single")


@pytest.mark.parametrize("name", ["explicit", "EXPLICIT", " explicit "])
def test_named_provider_skips_detection(name: str) -> None:
    spec = detect({**BACKENDAI, "RALLYPOINT_HOSTS": "x,y", "RALLYPOINT_NODE_RANK": "1"}, name)
    assert (spec.provider, spec.hosts, spec.rank) == ("explicit", ("x", "y"), 1)


def test_named_provider_reads_even_without_its_marker() -> None:
    fails({}, "RALLYPOINT_HOSTS is not set", provider="explicit")
    fails({}, "RALLYPOINT_NNODES is not set", provider="mdns")
    fails({}, "BACKENDAI_CLUSTER_HOSTS", provider="backendai")
    fails({}, "SLURM_JOB_NODELIST", provider="slurm")


def test_auto_is_auto_detection() -> None:
    assert detect(MDNS, "auto") == detect(MDNS)


def test_unknown_provider_lists_the_valid_names() -> None:
    fails({}, "'nomad'", *NAMES, provider="nomad")


# --- explicit -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "hosts", "rank"),
    [
        ({"RALLYPOINT_HOSTS": "a,b,c", "RALLYPOINT_NODE_RANK": "0"}, ("a", "b", "c"), 0),
        ({"RALLYPOINT_HOSTS": "a,b,c", "RALLYPOINT_NODE_RANK": "2"}, ("a", "b", "c"), 2),
        ({"RALLYPOINT_HOSTS": " a , b ", "HOSTNAME": "b"}, ("a", "b"), 1),
        # HOSTNAME matches case-insensitively, and by short name when that is unique.
        ({"RALLYPOINT_HOSTS": "Node1,node2", "HOSTNAME": "NODE1"}, ("Node1", "node2"), 0),
        (
            {"RALLYPOINT_HOSTS": "n1.lab.example,n2.lab.example", "HOSTNAME": "n2"},
            ("n1.lab.example", "n2.lab.example"),
            1,
        ),
        # The master moves to rank 0; the others keep their list order.
        (
            {"RALLYPOINT_HOSTS": "a,b,c,d", "RALLYPOINT_MASTER": "c", "RALLYPOINT_NODE_RANK": "0"},
            ("c", "a", "b", "d"),
            1,
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b,c,d", "RALLYPOINT_MASTER": "c", "RALLYPOINT_NODE_RANK": "2"},
            ("c", "a", "b", "d"),
            0,
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b,c,d", "RALLYPOINT_MASTER": "c", "RALLYPOINT_NODE_RANK": "3"},
            ("c", "a", "b", "d"),
            3,
        ),
        # IP literals: IPv6 with or without brackets, canonicalised so every node agrees.
        (
            {"RALLYPOINT_HOSTS": "fd00::1,[FD00:0::2],10.0.0.3", "RALLYPOINT_NODE_RANK": "1"},
            ("fd00::1", "fd00::2", "10.0.0.3"),
            1,
        ),
        (
            {
                "RALLYPOINT_HOSTS": "fd00::1,fd00::2",
                "RALLYPOINT_MASTER": "[fd00::2]",
                "RALLYPOINT_NODE_RANK": "1",
            },
            ("fd00::2", "fd00::1"),
            0,
        ),
        ({"RALLYPOINT_HOSTS": "solo", "RALLYPOINT_NNODES": "1", "HOSTNAME": "solo"}, ("solo",), 0),
    ],
)
def test_explicit(environ: Env, hosts: tuple[str, ...], rank: int) -> None:
    spec = detect(environ)
    assert (spec.provider, spec.hosts, spec.rank, spec.nnodes) == (
        "explicit",
        hosts,
        rank,
        len(hosts),
    )
    assert spec.loopback_ok is (len(hosts) == 1)


def test_explicit_session_is_shared_and_overridable() -> None:
    first = detect({"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "0"})
    second = detect({"RALLYPOINT_HOSTS": "a,b", "HOSTNAME": "b"})
    other = detect({"RALLYPOINT_HOSTS": "a,c", "RALLYPOINT_NODE_RANK": "0"})
    assert first.session == second.session != other.session
    assert first.session.startswith("explicit-")
    named = detect({"RALLYPOINT_HOSTS": "a,b", "HOSTNAME": "a", "RALLYPOINT_SESSION": "run-7"})
    assert named.session == "run-7"


def test_explicit_facts_keep_the_written_position() -> None:
    spec = detect(
        {"RALLYPOINT_HOSTS": "a,b,c", "RALLYPOINT_MASTER": "b", "RALLYPOINT_NODE_RANK": "0"}
    )
    assert dict(spec.facts) == {"position": "0", "master_position": "1"}


@pytest.mark.parametrize(
    ("environ", "fragments"),
    [
        (
            {"RALLYPOINT_HOSTS": "a,,b", "RALLYPOINT_NODE_RANK": "0"},
            ["RALLYPOINT_HOSTS", "empty entry"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b,", "RALLYPOINT_NODE_RANK": "0"},
            ["RALLYPOINT_HOSTS", "empty entry"],
        ),
        ({"RALLYPOINT_HOSTS": "a,A", "RALLYPOINT_NODE_RANK": "0"}, ["'A'", "more than once"]),
        (
            {"RALLYPOINT_HOSTS": "fd00::1,fd00:0::1", "RALLYPOINT_NODE_RANK": "0"},
            ["'fd00::1'", "more than once"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,-b", "RALLYPOINT_NODE_RANK": "0"},
            ["RALLYPOINT_HOSTS", "'-b'", "RFC 1123"],
        ),
        ({"RALLYPOINT_HOSTS": "a,b-", "RALLYPOINT_NODE_RANK": "0"}, ["'b-'", "RFC 1123"]),
        ({"RALLYPOINT_HOSTS": "a,b_c", "RALLYPOINT_NODE_RANK": "0"}, ["'b_c'", "RFC 1123"]),
        ({"RALLYPOINT_HOSTS": "a," + "x" * 64, "RALLYPOINT_NODE_RANK": "0"}, ["RFC 1123"]),
        (
            {"RALLYPOINT_HOSTS": "a," + ".".join(["x" * 60] * 5), "RALLYPOINT_NODE_RANK": "0"},
            ["longer than 253"],
        ),
        ({"RALLYPOINT_HOSTS": "a,b.", "RALLYPOINT_NODE_RANK": "0"}, ["'b.'", "trailing dot"]),
        (
            {"RALLYPOINT_HOSTS": "a,10.0.0.256", "RALLYPOINT_NODE_RANK": "0"},
            ["'10.0.0.256'", "looks like a number"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,123", "RALLYPOINT_NODE_RANK": "0"},
            ["'123'", "looks like a number"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,0x7f000001", "RALLYPOINT_NODE_RANK": "0"},
            ["'0x7f000001'", "looks like a number"],
        ),
        ({"RALLYPOINT_HOSTS": "a,fe80::1%eth0", "RALLYPOINT_NODE_RANK": "0"}, ["zone id"]),
        (
            {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "2"},
            ["RALLYPOINT_NODE_RANK='2'", "from 0 to 1"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "-1"},
            ["RALLYPOINT_NODE_RANK='-1'", "not a decimal"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "one"},
            ["RALLYPOINT_NODE_RANK='one'"],
        ),
        ({"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "\u0661"}, ["RALLYPOINT_NODE_RANK"]),
        ({"RALLYPOINT_HOSTS": "a,b"}, ["cannot tell which node", "RALLYPOINT_NODE_RANK"]),
        ({"RALLYPOINT_HOSTS": "a,b", "HOSTNAME": "c"}, ["HOSTNAME='c'", "RALLYPOINT_NODE_RANK"]),
        ({"RALLYPOINT_HOSTS": "n1.x,n1.y", "HOSTNAME": "n1"}, ["HOSTNAME='n1'", "uniquely"]),
        (
            {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "0", "RALLYPOINT_MASTER": "c"},
            ["RALLYPOINT_MASTER='c'", "not one of"],
        ),
        (
            {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "0", "RALLYPOINT_NNODES": "3"},
            ["RALLYPOINT_NNODES=3", "2 node(s)"],
        ),
        (
            {
                "RALLYPOINT_HOSTS": "a,b",
                "RALLYPOINT_NODE_RANK": "0",
                "RALLYPOINT_SESSION": "bad id",
            },
            ["RALLYPOINT_SESSION='bad id'"],
        ),
        (
            {
                "RALLYPOINT_HOSTS": "a,b",
                "RALLYPOINT_NODE_RANK": "0",
                "RALLYPOINT_SESSION": "x" * 129,
            },
            ["RALLYPOINT_SESSION"],
        ),
    ],
)
def test_explicit_errors(environ: Env, fragments: list[str]) -> None:
    fails(environ, *fragments)


def test_explicit_rejects_a_list_too_large_to_be_real() -> None:
    fails({"RALLYPOINT_HOSTS": "," * 70000, "RALLYPOINT_NODE_RANK": "0"}, "at most 65536")


# --- mdns -----------------------------------------------------------------------------------


def test_mdns_has_no_hosts_until_discovery() -> None:
    spec = detect({"RALLYPOINT_DISCOVERY": "MDNS", "RALLYPOINT_NNODES": "5"})
    assert (spec.provider, spec.hosts, spec.rank, spec.nnodes) == ("mdns", (), -1, 5)
    assert spec.session == "rallypoint"
    named = detect({**MDNS, "RALLYPOINT_SESSION": "lab-a"})
    assert named.session == "lab-a"


@pytest.mark.parametrize(
    ("environ", "fragments"),
    [
        ({**MDNS, "RALLYPOINT_NNODES": "0"}, ["RALLYPOINT_NNODES='0'", "from 1 to"]),
        ({**MDNS, "RALLYPOINT_NNODES": "70000"}, ["RALLYPOINT_NNODES='70000'"]),
        ({**MDNS, "RALLYPOINT_NNODES": "two"}, ["RALLYPOINT_NNODES='two'"]),
        ({**MDNS, "RALLYPOINT_SESSION": "-x"}, ["RALLYPOINT_SESSION='-x'"]),
    ],
)
def test_mdns_errors(environ: Env, fragments: list[str]) -> None:
    fails(environ, *fragments)


def test_mdns_forced_with_another_discovery_is_refused() -> None:
    fails({"RALLYPOINT_DISCOVERY": "dns", "RALLYPOINT_NNODES": "2"}, "'dns'", provider="mdns")


# --- single ---------------------------------------------------------------------------------


def test_single_is_one_loopback_node() -> None:
    spec = detect({"HOSTNAME": "laptop"})
    assert spec == ClusterSpec(
        provider="single",
        hosts=("127.0.0.1",),
        rank=0,
        nnodes=1,
        session="single",
        loopback_ok=True,
    )
    assert spec.master == spec.host == "127.0.0.1"
    assert detect({"RALLYPOINT_NNODES": "1"}).provider == "single"


@pytest.mark.parametrize(
    ("environ", "fragments"),
    [
        ({"RALLYPOINT_NNODES": "4"}, ["RALLYPOINT_NNODES=4", "RALLYPOINT_HOSTS"]),
        ({"RALLYPOINT_NNODES": "x"}, ["RALLYPOINT_NNODES='x'"]),
        ({"RALLYPOINT_DISCOVERY": "mdns"}, ["RALLYPOINT_DISCOVERY=mdns needs RALLYPOINT_NNODES"]),
        ({"RALLYPOINT_DISCOVERY": "consul", "RALLYPOINT_NNODES": "1"}, ["'consul'", "'mdns'"]),
    ],
)
def test_single_refuses_settings_that_announce_a_cluster(
    environ: Env, fragments: list[str]
) -> None:
    fails(environ, *fragments)
