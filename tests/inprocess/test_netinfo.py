"""netinfo: this host's addresses and the interface that routes to an address."""

from __future__ import annotations

import ipaddress
import shutil
import socket

import pytest

from rallypoint.net import netinfo
from rallypoint.net.netinfo import local_addresses, parse_if_inet6, parse_ip_addr, route_ifname
from tests.conftest import require

IF_INET6 = """\
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
fd000000000000000000000000000002 04 40 00 82     eth0
20010db8000000000000000000000009 05 40 00 08     eth1
00000000000000000000000000000001 01 80 10 80       lo
not a line
"""

IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0@if12    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
4: eth0    inet 192.0.2.3/24 scope global secondary eth0:1\\       valid_lft forever
4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever
6: wg0    link/none
"""


def test_parse_if_inet6_skips_dad_failures_and_junk() -> None:
    assert parse_if_inet6(IF_INET6) == [
        ("eth0", "fe80::fc:ff:fe00:1"),
        ("eth0", "fd00::2"),
        ("lo", "::1"),
    ]


def test_parse_ip_addr() -> None:
    assert parse_ip_addr(IP_ADDR) == [
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("eth0", "192.0.2.2"),
        ("eth0", "192.0.2.3"),
        ("eth0", "fd00::2"),
    ]


def test_local_addresses_exclude_loopback() -> None:
    addresses = local_addresses()
    assert len(addresses) == len(set(addresses))
    for address in addresses:
        ip = ipaddress.ip_address(address)
        assert not ip.is_loopback
        assert not ip.is_unspecified


def test_local_addresses_prefer_non_link_local() -> None:
    addresses = local_addresses()
    parsed = [ipaddress.ip_address(a) for a in addresses]
    link_local = [ip for ip in parsed if ip.version == 6 and ip.is_link_local]
    # Link-local IPv6 appears only when nothing better exists.
    assert not link_local or len(link_local) == len(parsed)


def test_ioctl_agrees_with_ip_tool() -> None:
    require(shutil.which("ip") is not None, "the ip tool (iproute2) is not installed")
    from_ioctl = {address for _, address in netinfo._ipv4_ioctl()}
    from_ip = {address for _, address in netinfo._ip_addr_show() if ":" not in address}
    assert "127.0.0.1" in from_ioctl
    assert from_ioctl == from_ip


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.53"])
def test_route_to_loopback_is_lo(address: str) -> None:
    assert route_ifname(address) == "lo"


def test_route_to_ipv6_loopback_is_lo() -> None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.connect(("::1", 9))
    except OSError:
        require(False, "IPv6 loopback is not available on this host")
    assert route_ifname("::1") == "lo"


def test_route_to_an_own_address_names_its_interface() -> None:
    pairs = [(name, a) for name, a in netinfo._interface_addresses() if a in local_addresses()]
    require(bool(pairs), "this host has no non-loopback address")
    ifname, address = pairs[0]
    assert route_ifname(address) == ifname


def test_route_to_a_remote_network_is_an_interface_or_none() -> None:
    # With no default route a datagram connect fails; with one, some interface is named.
    result = route_ifname("198.51.100.1")
    assert result is None or result in {name for name, _ in netinfo._interface_addresses()}


def test_route_ifname_rejects_names() -> None:
    with pytest.raises(ValueError):
        route_ifname("localhost")
