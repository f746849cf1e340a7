"""Derivation: every served variable, frameworks, nproc, offline, user values and precedence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.errors import ConfigError, OverrideError, TFConfigError
from rallypoint.model import (
    DEFAULT_FRAMEWORKS,
    ClusterDoc,
    ClusterSpec,
    DeriveOptions,
    Env,
    Member,
    Override,
    OverrideSource,
)
from rallypoint.served.derive import CONTRACT_KEYS, FRAMEWORK_OF, derive, user_values

HOSTS = ("main1", "sub1", "sub2")


def spec(rank: int = 1, hosts: tuple[str, ...] = HOSTS, **kw: Any) -> ClusterSpec:
    return ClusterSpec(
        provider="explicit", hosts=hosts, rank=rank, nnodes=len(hosts), session="s1", **kw
    )


def doc(
    hosts: tuple[str, ...] = HOSTS, tf_ports: tuple[int | None, ...] | None = None
) -> ClusterDoc:
    ports = tf_ports if tf_ports is not None else tuple(3000 + i for i in range(len(hosts)))
    members = tuple(
        Member(rank=i, host=h, addresses=(f"10.0.0.{i + 1}",), tf_port=p)
        for i, (h, p) in enumerate(zip(hosts, ports, strict=True))
    )
    return ClusterDoc(
        session="s1", generation="gen-7", master_host=hosts[0], master_port=29511, members=members
    )


def env(
    rank: int = 1,
    online: bool = True,
    user: dict[str, tuple[str, OverrideSource]] | None = None,
    **options: Any,
) -> Env:
    return derive(spec(rank), doc() if online else None, DeriveOptions(user=user or {}, **options))


def set_(**values: str) -> dict[str, tuple[str, OverrideSource]]:
    return {key: (value, "--set") for key, value in values.items()}


def from_env(**values: str) -> dict[str, tuple[str, OverrideSource]]:
    return {key: (value, "environment") for key, value in values.items()}


TF_ONLINE = {
    "cluster": {"worker": ["main1:3000", "sub1:3001", "sub2:3002"]},
    "task": {"type": "worker", "index": 1},
}
ONE_PROC = {
    "MASTER_ADDR": "main1",
    "MASTER_PORT": "29511",
    "NNODES": "3",
    "NODE_RANK": "1",
    "PET_NNODES": "3",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "main1",
    "PET_MASTER_PORT": "29511",
    "PET_NPROC_PER_NODE": "1",
    "WORLD_SIZE": "3",
    "RANK": "1",
    "WORLD_RANK": "1",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "TF_CONFIG": json.dumps(TF_ONLINE, separators=(",", ":")),
    "RALLYPOINT_GENERATION": "gen-7",
}


def test_full_contract_online_one_process_per_node() -> None:
    result = env()
    assert result.as_dict() == ONE_PROC
    assert [key for key, _ in result.values] == [k for k in CONTRACT_KEYS if k in ONE_PROC]
    assert result.reserved is True
    assert result.overrides == ()


@pytest.mark.parametrize(
    ("options", "key", "expected"),
    [
        # nproc 1 vs 4
        ({"nproc_per_node": 4}, "WORLD_SIZE", "12"),
        ({"nproc_per_node": 4}, "PET_NPROC_PER_NODE", "4"),
        ({"nproc_per_node": 4}, "RANK", None),
        ({"nproc_per_node": 4}, "WORLD_RANK", None),
        ({"nproc_per_node": 4}, "LOCAL_RANK", None),
        ({"nproc_per_node": 4}, "LOCAL_WORLD_SIZE", None),
        ({"nproc_per_node": 4}, "NODE_RANK", "1"),
        ({"nproc_per_node": 1}, "WORLD_SIZE", "3"),
        # frameworks
        ({"frameworks": frozenset({"tf"})}, "MASTER_ADDR", None),
        ({"frameworks": frozenset({"tf"})}, "WORLD_SIZE", None),
        ({"frameworks": frozenset({"tf"})}, "PET_NNODES", None),
        ({"frameworks": frozenset({"tf"})}, "NNODES", "3"),
        ({"frameworks": frozenset({"tf"})}, "NODE_RANK", "1"),
        ({"frameworks": frozenset({"tf"})}, "RALLYPOINT_GENERATION", "gen-7"),
        ({"frameworks": frozenset({"tf"})}, "TF_CONFIG", ONE_PROC["TF_CONFIG"]),
        ({"frameworks": frozenset({"torch"})}, "TF_CONFIG", None),
        ({"frameworks": frozenset({"torch"})}, "MASTER_PORT", "29511"),
        ({"frameworks": frozenset()}, "NNODES", "3"),
        # master address as an IP
        ({"master_ip": "10.0.0.1"}, "MASTER_ADDR", "10.0.0.1"),
        ({"master_ip": "10.0.0.1"}, "PET_MASTER_ADDR", "10.0.0.1"),
        # interfaces
        ({}, "GLOO_SOCKET_IFNAME", None),
        ({}, "NCCL_SOCKET_IFNAME", None),
        ({"ifname": "eth1"}, "GLOO_SOCKET_IFNAME", "eth1"),
        # NCCL picks its own interface (and prefers InfiniBand): served only when asked.
        ({"ifname": "eth1"}, "NCCL_SOCKET_IFNAME", None),
        ({"ifname": "eth1", "nccl_ifname": True}, "NCCL_SOCKET_IFNAME", "eth1"),
        (
            {"ifname": "eth1", "nccl_ifname": True, "frameworks": frozenset({"tf"})},
            "NCCL_SOCKET_IFNAME",
            "eth1",
        ),
        ({"ifname": "eth1", "frameworks": frozenset({"tf"})}, "GLOO_SOCKET_IFNAME", None),
    ],
)
def test_each_variable(options: dict[str, Any], key: str, expected: str | None) -> None:
    assert env(**options).get(key) == expected


def test_served_keys_follow_frameworks() -> None:
    for frameworks in (frozenset({"torch"}), frozenset({"tf"}), frozenset()):
        result = env(frameworks=frameworks, ifname="eth0", nccl_ifname=True)
        for key, _ in result.values:
            owner = FRAMEWORK_OF[key]
            assert owner is None or owner in frameworks


@pytest.mark.parametrize(
    ("rank", "layout", "expected"),
    [
        (0, "workers", {"type": "worker", "index": 0}),
        (0, "chief", {"type": "chief", "index": 0}),
        (2, "chief", {"type": "worker", "index": 1}),
        (2, "evaluator", {"type": "evaluator", "index": 0}),
        (1, "ps:1", {"type": "worker", "index": 0}),
        (2, "ps:1", {"type": "ps", "index": 0}),
    ],
)
def test_tf_layouts(rank: int, layout: str, expected: dict[str, Any]) -> None:
    tf_config = json.loads(env(rank=rank, tf_layout=layout).get("TF_CONFIG") or "")
    assert tf_config["task"] == expected


def test_tf_ipv6_hosts_are_bracketed() -> None:
    hosts = ("fd00::1", "fd00::2")
    result = derive(spec(1, hosts), doc(hosts), DeriveOptions())
    tf_config = json.loads(result.get("TF_CONFIG") or "")
    assert tf_config["cluster"]["worker"] == ["[fd00::1]:3000", "[fd00::2]:3001"]
    assert result.get("MASTER_ADDR") == "fd00::1"


def test_member_without_tf_port_is_tfconfigerror() -> None:
    with pytest.raises(TFConfigError, match=r"node rank 2 \(sub2\) reported no TF worker port"):
        derive(spec(), doc(tf_ports=(3000, 3001, None)), DeriveOptions())


def test_member_without_tf_port_is_fine_without_tf() -> None:
    result = derive(
        spec(), doc(tf_ports=(None, None, None)), DeriveOptions(frameworks=frozenset({"torch"}))
    )
    assert result.get("TF_CONFIG") is None


@pytest.mark.parametrize(
    ("options", "preferred", "port", "tf_port"),
    [
        ({}, None, "29500", 2222),
        ({}, 31000, "31000", 2222),
        ({"master_port": 29600, "tf_port": 4000}, 31000, "29600", 4000),
    ],
)
def test_offline(options: dict[str, Any], preferred: int | None, port: str, tf_port: int) -> None:
    result = derive(spec(preferred_port=preferred), None, DeriveOptions(**options))
    assert result.reserved is False
    assert result.get("MASTER_PORT") == port
    assert result.get("PET_MASTER_PORT") == port
    assert result.get("RALLYPOINT_GENERATION") == "offline"
    tf_config = json.loads(result.get("TF_CONFIG") or "")
    assert tf_config["cluster"]["worker"] == [f"{h}:{tf_port}" for h in HOSTS]


# --- user values --------------------------------------------------------------------------


def test_user_values_picks_only_contract_keys_and_set_wins() -> None:
    environ = {"MASTER_PORT": "1111", "HOME": "/root", "SECRET": "x", "NNODES": "  "}
    found = user_values(environ, [("MASTER_PORT", "2222"), ("RANK", "1"), ("RANK", "2")])
    assert found == {"MASTER_PORT": ("2222", "--set"), "RANK": ("2", "--set")}
    assert user_values(environ, []) == {"MASTER_PORT": ("1111", "environment")}


@pytest.mark.parametrize("key", ["HOME", "master_port", "TF_CONFIG ", ""])
def test_set_of_a_non_contract_key_is_override_error(key: str) -> None:
    with pytest.raises(OverrideError, match="--set"):
        user_values({}, [(key, "1")])


@pytest.mark.parametrize(
    ("user", "key", "expected", "derived"),
    [
        (set_(MASTER_PORT="1234"), "MASTER_PORT", "1234", "29511"),
        (set_(MASTER_PORT="1234"), "PET_MASTER_PORT", "1234", None),
        (from_env(PET_MASTER_PORT="1234"), "MASTER_PORT", "1234", None),
        (set_(MASTER_ADDR="10.1.1.1"), "PET_MASTER_ADDR", "10.1.1.1", None),
        (set_(MASTER_ADDR="fd00::9"), "MASTER_ADDR", "fd00::9", "main1"),
        (set_(NNODES="4"), "WORLD_SIZE", "4", None),
        (set_(NNODES="4"), "PET_NNODES", "4", None),
        (set_(NODE_RANK="2"), "RANK", "2", None),
        (set_(RANK="2"), "NODE_RANK", "2", None),
        (set_(WORLD_RANK="2"), "PET_NODE_RANK", "2", None),
        (set_(PET_NNODES="1:4"), "PET_NNODES", "1:4", "3"),
        (set_(PET_NNODES="1:4"), "NNODES", "3", None),
        (set_(PET_NPROC_PER_NODE="2"), "WORLD_SIZE", "6", None),
        (set_(PET_NPROC_PER_NODE="gpu"), "WORLD_SIZE", None, None),
        (set_(PET_NPROC_PER_NODE="gpu"), "RANK", None, None),
        (set_(WORLD_SIZE="3"), "WORLD_SIZE", "3", "3"),
        (set_(LOCAL_RANK="0"), "LOCAL_RANK", "0", "0"),
        (set_(RALLYPOINT_GENERATION="pinned"), "RALLYPOINT_GENERATION", "pinned", "gen-7"),
        (set_(NCCL_SOCKET_IFNAME="^docker,lo"), "NCCL_SOCKET_IFNAME", "^docker,lo", None),
        (set_(GLOO_SOCKET_IFNAME="eth0,eth1"), "GLOO_SOCKET_IFNAME", "eth0,eth1", None),
        (
            set_(TF_CONFIG='{"cluster":{"worker":["x:1"]},"task":{"type":"worker","index":0}}'),
            "TF_CONFIG",
            '{"cluster":{"worker":["x:1"]},"task":{"type":"worker","index":0}}',
            ONE_PROC["TF_CONFIG"],
        ),
    ],
)
def test_user_value_wins_and_is_reported(
    user: dict[str, tuple[str, OverrideSource]], key: str, expected: str | None, derived: str | None
) -> None:
    result = env(user=user)
    assert result.get(key) == expected
    (set_key,) = user
    value, source = user[set_key]
    if set_key == key:
        assert Override(key, value, derived, source) in result.overrides
    assert [o.key for o in result.overrides] == [set_key]


def test_set_wins_over_environment_end_to_end() -> None:
    found = user_values({"MASTER_PORT": "1111"}, [("MASTER_PORT", "2222")])
    result = env(user=found)
    assert result.get("MASTER_PORT") == "2222"
    assert result.overrides == (Override("MASTER_PORT", "2222", "29511", "--set"),)


def test_offline_user_value_reports_offline_derivation() -> None:
    result = env(online=False, user=set_(MASTER_PORT="1234"))
    assert result.overrides == (Override("MASTER_PORT", "1234", "29500", "--set"),)


def test_user_value_of_a_framework_not_served_is_a_warning() -> None:
    result = env(user=from_env(MASTER_ADDR="x1"), frameworks=frozenset({"tf"}))
    assert result.get("MASTER_ADDR") is None
    assert result.overrides == ()
    assert any("MASTER_ADDR" in warning and "torch" in warning for warning in result.warnings)


def test_user_tf_config_is_served_even_when_derivation_would_fail() -> None:
    value = '{"cluster":{"worker":["x:1"]},"task":{"type":"worker","index":0}}'
    result = derive(
        spec(), doc(tf_ports=(None, None, None)), DeriveOptions(user=set_(TF_CONFIG=value))
    )
    assert result.get("TF_CONFIG") == value
    assert result.overrides == (Override("TF_CONFIG", value, None, "--set"),)


BAD = [
    # (key, value, a word of the problem)
    ("MASTER_PORT", "0", "port"),
    ("MASTER_PORT", "65536", "port"),
    ("MASTER_PORT", "http", "port"),
    ("MASTER_PORT", " 29500", "port"),
    ("MASTER_PORT", "-1", "port"),
    ("PET_MASTER_PORT", "1e3", "port"),
    ("NNODES", "0", "count"),
    ("NNODES", "two", "count"),
    ("WORLD_SIZE", "-3", "count"),
    ("LOCAL_WORLD_SIZE", "", "count"),
    ("NODE_RANK", "-1", "rank"),
    ("RANK", "1.0", "rank"),
    ("LOCAL_RANK", "٣", "rank"),
    ("PET_NNODES", "4:1", "node count"),
    ("PET_NNODES", "0", "node count"),
    ("PET_NPROC_PER_NODE", "0", "process count"),
    ("PET_NPROC_PER_NODE", "many", "process count"),
    ("MASTER_ADDR", "bad_host", "host name"),
    ("MASTER_ADDR", "[fd00::1]", "host name"),
    ("MASTER_ADDR", "", "host name"),
    ("PET_MASTER_ADDR", "a b", "host name"),
    ("TF_CONFIG", "{}", "TF_CONFIG.cluster"),
    (
        "TF_CONFIG",
        '{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":-1}}',
        "TF_CONFIG.task.index",
    ),
    ("RALLYPOINT_GENERATION", "has space", "generation"),
    ("NCCL_SOCKET_IFNAME", "eth0,", "interface"),
    ("GLOO_SOCKET_IFNAME", "averyveryverylongname", "interface"),
]


@pytest.mark.parametrize("source", ["environment", "--set"])
@pytest.mark.parametrize(("key", "value", "problem"), BAD)
def test_bad_user_value_names_key_source_and_value(
    key: str, value: str, problem: str, source: OverrideSource
) -> None:
    with pytest.raises(OverrideError) as info:
        env(user={key: (value, source)})
    message = str(info.value)
    assert message.startswith(f"{key}={value!r} from ")
    assert ("the environment" if source == "environment" else "--set") in message
    assert problem in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("user", "options", "match"),
    [
        (set_(MASTER_PORT="1", PET_MASTER_PORT="2"), {}, "contradicts MASTER_PORT"),
        (set_(NODE_RANK="0", RANK="1"), {}, "contradicts NODE_RANK"),
        (set_(MASTER_ADDR="a1", PET_MASTER_ADDR="b1"), {}, "contradicts MASTER_ADDR"),
        (set_(NODE_RANK="3"), {}, "outside 3 nodes"),
        (set_(NNODES="1"), {}, "outside 1 nodes"),
        (set_(PET_NNODES="4:8"), {}, "does not include NNODES=3"),
        (set_(WORLD_SIZE="3"), {"nproc_per_node": 4}, "WORLD_SIZE counts processes"),
        (set_(WORLD_SIZE="4"), {}, "WORLD_SIZE counts processes"),
        (set_(PET_NPROC_PER_NODE="gpu", WORLD_SIZE="4"), {}, "not a multiple"),
        (set_(RANK="1"), {"nproc_per_node": 4}, "set per process by torchrun"),
        (from_env(LOCAL_RANK="0"), {"nproc_per_node": 2}, "set per process by torchrun"),
        (set_(PET_NPROC_PER_NODE="auto", RANK="1"), {}, "set per process by torchrun"),
        (set_(LOCAL_WORLD_SIZE="2"), {}, "one process per node"),
        (set_(LOCAL_RANK="1"), {}, "one process per node"),
    ],
)
def test_inconsistent_user_values(
    user: dict[str, tuple[str, OverrideSource]], options: dict[str, Any], match: str
) -> None:
    with pytest.raises(OverrideError, match=match):
        env(user=user, **options)


def test_agreeing_aliases_are_fine() -> None:
    result = env(user=set_(MASTER_PORT="1234", PET_MASTER_PORT="01234"))
    assert (result.get("MASTER_PORT"), result.get("PET_MASTER_PORT")) == ("1234", "01234")


@pytest.mark.parametrize(
    ("make_spec", "options", "match"),
    [
        (lambda: spec(), {"frameworks": frozenset({"mxnet"})}, "unknown framework"),
        (lambda: spec(), {"nproc_per_node": 0}, "at least 1"),
        (lambda: spec(), {"tf_layout": "ring"}, "TF layout"),
        (lambda: ClusterSpec("mdns", (), -1, 3, "s"), {}, "no host list yet"),
        (lambda: ClusterSpec("explicit", HOSTS, 3, 3, "s"), {}, "inconsistent"),
    ],
)
def test_unusable_inputs_are_config_errors(
    make_spec: Any, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        derive(make_spec(), None, DeriveOptions(**options))


def test_doc_that_misses_a_rank_is_config_error() -> None:
    broken = doc()
    broken = ClusterDoc(broken.session, broken.generation, "main1", 1, broken.members[:2])
    with pytest.raises(ConfigError, match="every rank"):
        derive(spec(), broken, DeriveOptions())


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(CONTRACT_KEYS),
        st.tuples(st.text(max_size=30), st.sampled_from(["environment", "--set"])),
        max_size=4,
    ),
    st.sampled_from([1, 2]),
    st.booleans(),
)
def test_arbitrary_user_values_give_env_or_override_error(
    user: dict[str, tuple[str, OverrideSource]], nproc: int, online: bool
) -> None:
    try:
        result = env(user=user, online=online, nproc_per_node=nproc)
    except OverrideError as exc:
        assert "\n" not in str(exc)
        return
    served = result.as_dict()
    for key, (value, source) in user.items():
        if FRAMEWORK_OF[key] not in (None, *DEFAULT_FRAMEWORKS):
            # A framework not served (JAX, TF by default): said, not served.
            assert key not in served and any(w.startswith(f"{key} set in") for w in result.warnings)
            continue
        assert served[key] == value
        assert any(o.key == key and o.source == source for o in result.overrides)
    assert set(served) <= set(CONTRACT_KEYS)
