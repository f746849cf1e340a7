"""JAX's variables: the coordinator address, count, id and bind address, and user values."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.errors import ConfigError, OverrideError
from rallypoint.model import (
    DEFAULT_FRAMEWORKS,
    DEFAULT_JAX_PORT,
    ClusterDoc,
    ClusterSpec,
    DeriveOptions,
    Member,
    OverrideSource,
)
from rallypoint.served.derive import CONTRACT_KEYS, FRAMEWORK_OF, derive

HOSTS = ("main1", "sub1", "sub2")
JAX = frozenset({"jax"})
ALL = frozenset({"torch", "tf", "jax"})


def spec(rank: int, hosts: tuple[str, ...] = HOSTS) -> ClusterSpec:
    return ClusterSpec("explicit", hosts, rank, len(hosts), "s1")


def doc(hosts: tuple[str, ...] = HOSTS, jax_port: int | None = 8490) -> ClusterDoc:
    members = tuple(
        Member(
            rank=i,
            host=h,
            addresses=(f"10.0.0.{i + 1}",),
            tf_port=3000 + i,
            jax_port=jax_port if i == 0 else None,
        )
        for i, h in enumerate(hosts)
    )
    return ClusterDoc("s1", "gen-1", hosts[0], 29511, members)


def served(
    rank: int,
    *,
    online: bool = True,
    user: dict[str, tuple[str, OverrideSource]] | None = None,
    hosts: tuple[str, ...] = HOSTS,
    **options: Any,
) -> dict[str, str]:
    options.setdefault("frameworks", JAX)
    result = derive(
        spec(rank, hosts),
        doc(hosts) if online else None,
        DeriveOptions(user=user or {}, **options),
    )
    return result.as_dict()


def set_(**values: str) -> dict[str, tuple[str, OverrideSource]]:
    return {key: (value, "--set") for key, value in values.items()}


def test_jax_is_not_served_by_default() -> None:
    assert "jax" not in DEFAULT_FRAMEWORKS
    assert not any(key.startswith("JAX_") for key in served(1, frameworks=DEFAULT_FRAMEWORKS))


def test_every_jax_key_belongs_to_jax_and_is_in_the_contract() -> None:
    keys = [key for key in CONTRACT_KEYS if key.startswith("JAX_")]
    assert keys == [
        "JAX_COORDINATOR_ADDRESS",
        "JAX_COORDINATOR_BIND_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
    ]
    assert {FRAMEWORK_OF[key] for key in keys} == {"jax"}


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_one_process_per_node(rank: int) -> None:
    values = served(rank)
    assert values["JAX_COORDINATOR_ADDRESS"] == "main1:8490"
    assert values["JAX_NUM_PROCESSES"] == "3"
    assert values["JAX_PROCESS_ID"] == str(rank)
    # Only the master runs the coordinator, on every interface.
    assert values.get("JAX_COORDINATOR_BIND_ADDRESS") == ("[::]:8490" if rank == 0 else None)
    # jax alone serves none of torch's or TensorFlow's variables.
    assert "MASTER_ADDR" not in values and "TF_CONFIG" not in values


def test_several_processes_per_node_leave_the_id_to_the_launcher() -> None:
    values = served(1, nproc_per_node=2)
    assert values["JAX_NUM_PROCESSES"] == "6"
    assert "JAX_PROCESS_ID" not in values


def test_ipv6_master_is_bracketed() -> None:
    hosts = ("fd00::10", "fd00::11")
    values = served(1, hosts=hosts)
    assert values["JAX_COORDINATOR_ADDRESS"] == "[fd00::10]:8490"


def test_master_ip_mode_and_user_master_addr_move_the_coordinator_host() -> None:
    assert served(1, master_ip="10.0.0.1")["JAX_COORDINATOR_ADDRESS"] == "10.0.0.1:8490"
    values = served(1, frameworks=ALL, user=set_(MASTER_ADDR="fd00::7"))
    assert values["JAX_COORDINATOR_ADDRESS"] == "[fd00::7]:8490"
    # The coordinator keeps its own port whatever MASTER_PORT says.
    values = served(1, frameworks=ALL, user=set_(MASTER_PORT="29999"))
    assert values["JAX_COORDINATOR_ADDRESS"] == "main1:8490"


def test_offline_shows_the_preferred_port() -> None:
    assert served(0, online=False)["JAX_COORDINATOR_ADDRESS"] == f"main1:{DEFAULT_JAX_PORT}"
    assert served(0, online=False, jax_port=9000)["JAX_COORDINATOR_BIND_ADDRESS"] == "[::]:9000"


def test_a_master_without_a_coordinator_port_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no JAX coordinator port"):
        derive(spec(1), doc(jax_port=None), DeriveOptions(frameworks=JAX))
    # A user-set address needs none.
    user = set_(JAX_COORDINATOR_ADDRESS="coord:1234")
    result = derive(spec(1), doc(jax_port=None), DeriveOptions(frameworks=JAX, user=user))
    assert result.get("JAX_COORDINATOR_ADDRESS") == "coord:1234"


@pytest.mark.parametrize(
    ("user", "key", "expected"),
    [
        (set_(JAX_COORDINATOR_ADDRESS="10.1.2.3:7000"), "JAX_COORDINATOR_ADDRESS", "10.1.2.3:7000"),
        (
            set_(JAX_COORDINATOR_ADDRESS="[fd00::1]:7000"),
            "JAX_COORDINATOR_ADDRESS",
            "[fd00::1]:7000",
        ),
        (set_(JAX_NUM_PROCESSES="3"), "JAX_NUM_PROCESSES", "3"),
        (set_(JAX_PROCESS_ID="1"), "JAX_PROCESS_ID", "1"),
        # JAX_PROCESS_ID names the node rank: setting one sets the other.
        (set_(NODE_RANK="2"), "JAX_PROCESS_ID", "2"),
        (set_(JAX_PROCESS_ID="2"), "NODE_RANK", "2"),
    ],
)
def test_user_values_win(
    user: dict[str, tuple[str, OverrideSource]], key: str, expected: str
) -> None:
    assert served(1, user=user)[key] == expected


@pytest.mark.parametrize(
    ("user", "options", "match"),
    [
        (set_(JAX_COORDINATOR_ADDRESS="main1"), {}, r"JAX_COORDINATOR_ADDRESS.*'main1'"),
        (set_(JAX_COORDINATOR_ADDRESS="fd00::1:99"), {}, "must be in brackets"),
        (set_(JAX_COORDINATOR_ADDRESS="grpc://main1:1"), {}, "not host:port"),
        (set_(JAX_COORDINATOR_ADDRESS="main1:0"), {}, "not 1..65535"),
        (set_(JAX_COORDINATOR_BIND_ADDRESS="*:80"), {}, "JAX_COORDINATOR_BIND_ADDRESS"),
        (set_(JAX_NUM_PROCESSES="0"), {}, "JAX_NUM_PROCESSES='0'"),
        (set_(JAX_NUM_PROCESSES="2"), {}, "counts processes, not nodes"),
        (set_(JAX_PROCESS_ID="-1"), {}, "not a process id"),
        (set_(JAX_PROCESS_ID="3"), {}, "outside 3 nodes"),
        (set_(JAX_PROCESS_ID="2", NODE_RANK="1"), {}, "contradicts"),
        (set_(JAX_PROCESS_ID="0"), {"nproc_per_node": 2}, "per process by your launcher"),
    ],
)
def test_bad_user_values_name_the_value(
    user: dict[str, tuple[str, OverrideSource]], options: dict[str, Any], match: str
) -> None:
    with pytest.raises(OverrideError, match=match):
        served(1, user=user, **options)


def test_unknown_framework_names_it() -> None:
    with pytest.raises(ConfigError, match=r"unknown framework.*mxnet"):
        served(1, frameworks=frozenset({"jax", "mxnet"}))
