"""Property tests: any environment gives a valid ClusterSpec or a ClusterSpecError."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers import NAMES, detect

LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

VARIABLES = [
    "HOSTNAME",
    "RALLYPOINT_HOSTS",
    "RALLYPOINT_NODE_RANK",
    "RALLYPOINT_MASTER",
    "RALLYPOINT_SESSION",
    "RALLYPOINT_NNODES",
    "RALLYPOINT_DISCOVERY",
    "RALLYPOINT_HOST_TEMPLATE",
    "RALLYPOINT_JOB",
    "RALLYPOINT_SUBDOMAIN",
    "RALLYPOINT_NAMESPACE",
    "BACKENDAI_CLUSTER_HOSTS",
    "BACKENDAI_CLUSTER_HOST",
    "BACKENDAI_CLUSTER_SIZE",
    "BACKENDAI_CLUSTER_ROLE",
    "BACKENDAI_CLUSTER_IDX",
    "BACKENDAI_CLUSTER_LOCAL_RANK",
    "BACKENDAI_CLUSTER_REPLICAS",
    "BACKENDAI_SESSION_ID",
    "BACKENDAI_DIST_MASTER_PORT",
    "SLURM_JOB_NODELIST",
    "SLURM_NODEID",
    "SLURM_NNODES",
    "SLURM_JOB_ID",
    "SLURMD_NODENAME",
    "JOB_COMPLETION_INDEX",
    "JOB_NAME",
    "POD_NAMESPACE",
]

# Values that look like what these variables usually hold, so the deep paths get exercised.
plausible = st.one_of(
    st.integers(-2, 70000).map(str),
    st.sampled_from(
        [
            "",
            "mdns",
            "main1",
            "sub1",
            "sub2",
            "main",
            "sub",
            "main1,sub1,sub2",
            "sub1,main1,sub2",
            "main:1,sub:2",
            "main:2,sub:1",
            "gpu[01-04,07],login1",
            "rack[1-2]-node[01-02]",
            "n[1-3",
            "a,b,c",
            "fd00::1,fd00::2",
            "[fd00::1],10.0.0.2",
            "trainer-1",
            "{job}-{index}.{subdomain}",
            "w{index}",
            "{index}",
            "{nope}",
            "x" * 300,
        ]
    ),
    st.from_regex(r"[a-z]{1,4}[0-9]{0,2}(,[a-z]{1,4}[0-9]{0,2}){0,4}", fullmatch=True),
    st.from_regex(
        r"[a-z]{1,3}\[[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,2})*\][a-z]{0,2}", fullmatch=True
    ),
    st.text(max_size=20),
)


def assert_valid(spec: ClusterSpec) -> None:
    """The invariants every consumer of a ClusterSpec relies on."""
    assert isinstance(spec, ClusterSpec)
    assert spec.provider in NAMES
    assert SESSION.fullmatch(spec.session), spec.session
    assert spec.preferred_port is None or 1 <= spec.preferred_port <= 65535
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.facts)
    if spec.provider == "mdns":
        assert spec.hosts == () and spec.rank == -1 and 1 <= spec.nnodes <= 65536
        return
    assert 1 <= spec.nnodes == len(spec.hosts) <= 65536
    assert 0 <= spec.rank < spec.nnodes
    assert len({host.lower() for host in spec.hosts}) == spec.nnodes
    for host in spec.hosts:
        if ":" in host:  # IPv6 literal, canonical and unbracketed
            assert not host.startswith("[")
            continue
        assert len(host) <= 253 and all(LABEL.fullmatch(label) for label in host.split("."))
    assert spec.master == spec.hosts[0]


def check(environ: dict[str, str], provider: str | None) -> None:
    try:
        spec = detect(environ, provider)
    except ClusterSpecError as exc:
        message = str(exc)
        assert message and "\n" not in message
        return
    assert_valid(spec)
    if provider is None:
        # Deterministic: the same environment always gives the same spec.
        assert detect(dict(environ)) == spec


providers = st.sampled_from([None, *NAMES])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=8), providers)
def test_arbitrary_environments(environ: dict[str, str], provider: str | None) -> None:
    check(environ, provider)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(VARIABLES), st.text(max_size=40), max_size=12), providers)
def test_known_variables_with_arbitrary_text(environ: dict[str, str], provider: str | None) -> None:
    check(environ, provider)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(VARIABLES), plausible, max_size=14), providers)
def test_known_variables_with_plausible_values(
    environ: dict[str, str], provider: str | None
) -> None:
    check(environ, provider)


# Valid environments of every provider: perturbing a few variables reaches the deep checks.
BASES: list[dict[str, str]] = [
    {"RALLYPOINT_HOSTS": "a,b,fd00::3", "RALLYPOINT_NODE_RANK": "1", "RALLYPOINT_MASTER": "b"},
    {
        "BACKENDAI_CLUSTER_HOSTS": "sub1,main1,sub2",
        "BACKENDAI_CLUSTER_HOST": "sub1",
        "BACKENDAI_CLUSTER_SIZE": "3",
        "BACKENDAI_CLUSTER_ROLE": "sub",
        "BACKENDAI_CLUSTER_IDX": "1",
        "BACKENDAI_CLUSTER_LOCAL_RANK": "1",
        "BACKENDAI_CLUSTER_REPLICAS": "main:1,sub:2",
        "BACKENDAI_SESSION_ID": "3f1c2a9e-7b1d-4a64-9a0e-5f2b1c9d8e71",
        "BACKENDAI_DIST_MASTER_PORT": "29500",
    },
    {
        "SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]",
        "SLURM_NODEID": "3",
        "SLURM_NNODES": "4",
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "rack2-node02",
    },
    {
        "JOB_COMPLETION_INDEX": "1",
        "HOSTNAME": "train-1",
        "RALLYPOINT_NNODES": "3",
        "RALLYPOINT_SUBDOMAIN": "svc",
    },
    {
        "HOSTNAME": "trainer-0",
        "RALLYPOINT_NNODES": "2",
        "RALLYPOINT_HOST_TEMPLATE": "{job}-{index}.t",
    },
    {"RALLYPOINT_DISCOVERY": "mdns", "RALLYPOINT_NNODES": "3", "RALLYPOINT_SESSION": "lab"},
]


def test_bases_are_valid() -> None:
    assert [detect(base).provider for base in BASES] == [
        "explicit",
        "backendai",
        "slurm",
        "kubernetes",
        "kubernetes",
        "mdns",
    ]


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(BASES),
    changes=st.dictionaries(
        st.sampled_from(VARIABLES), plausible | st.text(max_size=30), max_size=3
    ),
    dropped=st.sets(st.sampled_from(VARIABLES), max_size=2),
    provider=providers,
)
def test_perturbed_valid_environments(
    base: dict[str, str], changes: dict[str, str], dropped: set[str], provider: str | None
) -> None:
    environ = {key: value for key, value in {**base, **changes}.items() if key not in dropped}
    check(environ, provider)


@settings(max_examples=100, deadline=None)
@given(
    hosts=st.lists(
        st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    data=st.data(),
)
def test_explicit_nodes_agree_and_master_is_rank_zero(
    hosts: list[str], data: st.DataObject
) -> None:
    master = data.draw(st.sampled_from(hosts))
    base = {"RALLYPOINT_HOSTS": ",".join(hosts), "RALLYPOINT_MASTER": master}
    specs = [detect({**base, "RALLYPOINT_NODE_RANK": str(i)}) for i in range(len(hosts))]
    assert {spec.hosts for spec in specs} == {(master, *(h for h in hosts if h != master))}
    assert {spec.session for spec in specs} == {specs[0].session}
    assert sorted(spec.rank for spec in specs) == list(range(len(hosts)))
    for position, spec in enumerate(specs):
        assert spec.host == hosts[position]


@settings(max_examples=100, deadline=None)
@given(subs=st.integers(0, 20), data=st.data())
def test_backendai_any_list_order_gives_one_cluster(subs: int, data: st.DataObject) -> None:
    names = ["main1", *(f"sub{i}" for i in range(1, subs + 1))]
    listed = data.draw(st.permutations(names))
    common = {
        "BACKENDAI_CLUSTER_HOSTS": ",".join(listed),
        "BACKENDAI_CLUSTER_SIZE": str(len(names)),
        "BACKENDAI_CLUSTER_REPLICAS": f"main:1,sub:{subs}" if subs else "main:1",
    }
    for local_rank, own in enumerate(names):
        spec = detect(
            {
                **common,
                "BACKENDAI_CLUSTER_HOST": own,
                "BACKENDAI_CLUSTER_LOCAL_RANK": str(local_rank),
            }
        )
        assert spec.hosts == tuple(names)
        assert spec.rank == local_rank
