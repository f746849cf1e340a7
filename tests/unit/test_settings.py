"""Settings from a mapping: the checks every entry point gets, and the messages they give."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint import settings
from rallypoint.errors import ConfigError
from rallypoint.model import DEFAULT_MASTER_PORT, master_ports
from rallypoint.settings import Settings


def test_an_empty_mapping_gives_the_defaults() -> None:
    assert settings.from_mapping({}) == Settings()


def test_values_are_normalised() -> None:
    built = settings.from_mapping(
        {
            "local_hosts": ("a", "b", "a"),
            "mdns_interfaces": ("eth0", "eth0"),
            "peer_host": " 10.0.0.1 ",
            "frameworks": ("torch", "jax"),
            "sets": [("MASTER_PORT", "1")],
            "tf_layout": " PS:2 ",
        }
    )
    assert built.local_hosts == ("a", "b")
    assert built.mdns_interfaces == ("eth0",)
    assert built.peer_host == "10.0.0.1"
    assert built.frameworks == frozenset({"torch", "jax"})
    assert built.sets == (("MASTER_PORT", "1"),)
    assert built.tf_layout == "ps:2"


def test_no_local_host_means_the_loopback_default() -> None:
    assert settings.from_mapping({"local_hosts": ()}).local_hosts == Settings().local_hosts


@pytest.mark.parametrize(
    ("values", "labels", "message"),
    [
        (
            {"backoff_initial_s": 5.0, "backoff_max_s": 1.0},
            {},
            "--backoff-initial 5 is above --backoff-max 1: make the first delay the smaller one",
        ),
        (
            {"backoff_initial_s": 5.0},
            {"backoff_initial_s": "RALLYPOINT_BACKOFF_INITIAL"},
            "RALLYPOINT_BACKOFF_INITIAL 5 is above --backoff-max 2",
        ),
        (
            {"local_port": 9000, "peer_port": 9000},
            {},
            "--local-port and --peer-port are both 9000: give them different ports",
        ),
        ({"tf_layout": "ps:0"}, {}, "--tf-layout: TF layout 'ps:0' is unknown"),
        ({"tf_layout": "ring"}, {"tf_layout": "RALLYPOINT_TF_LAYOUT"}, "RALLYPOINT_TF_LAYOUT: "),
        ({"deadline": 3.0}, {}, "unknown setting(s) deadline"),
    ],
)
def test_bad_combinations_name_their_source(
    values: dict[str, Any], labels: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings.from_mapping(values, labels)
    assert str(caught.value).startswith(message)


def test_equal_ports_pass_when_the_peer_port_was_not_given() -> None:
    # Client commands have no --peer-port: their local port may be the peer default.
    built = settings.from_mapping({"local_port": Settings().peer_port})
    assert built.local_port == built.peer_port


def test_derive_options_carry_the_settings() -> None:
    built = Settings(master_addr_mode="ip", emit_ifname=True, master_port=1234, tf_port=2000)
    options = built.derive_options({}, master_ip="10.0.0.1", ifname="eth0")
    assert (options.master_ip, options.ifname, options.nccl_ifname) == ("10.0.0.1", "eth0", True)
    assert (options.master_port, options.tf_port) == (1234, 2000)
    assert Settings().derive_options({}, master_ip="10.0.0.1").master_ip is None


@pytest.mark.parametrize(
    ("preferred", "provider", "expected"),
    [
        (None, None, [DEFAULT_MASTER_PORT]),
        (None, 3333, [3333, DEFAULT_MASTER_PORT]),
        (1234, 3333, [1234, 3333, DEFAULT_MASTER_PORT]),
    ],
)
def test_master_port_precedence(
    preferred: int | None, provider: int | None, expected: list[int]
) -> None:
    assert master_ports(preferred, provider) == expected
