"""Which interfaces zeroconf listens on, and opening it there (IPv4 alone if IPv6 fails)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterable, Sequence

import ifaddr
from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncZeroconf

__all__ = ["Interfaces", "open_zeroconf", "resolve_interfaces"]

log = logging.getLogger(__name__)

#: Zeroconf's interface choice: every interface, or IPv4 addresses and IPv6 interface indexes.
Interfaces = InterfaceChoice | list[str | int]


def resolve_interfaces(entries: Sequence[str]) -> Interfaces:
    """Zeroconf's interface choice for interface names or addresses; () means every interface.

    IPv4 is given to zeroconf by address, IPv6 by interface index (IPV6_JOIN_GROUP
    wants an index). Unknown names are logged and skipped; ValueError when none is left.
    """
    adapters = {adapter.nice_name: adapter for adapter in ifaddr.get_adapters()}
    if not entries:
        return _default_interfaces(adapters.values())
    chosen: list[str | int] = []
    for entry in entries:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(entry)
            chosen.append(entry)
            continue
        adapter = adapters.get(entry)
        if adapter is None:
            log.warning("mdns_interface_unknown", extra={"interface": entry})
            continue
        chosen.extend(ip.ip for ip in adapter.ips if isinstance(ip.ip, str))
        if adapter.index is not None and any(isinstance(ip.ip, tuple) for ip in adapter.ips):
            chosen.append(adapter.index)
    if not chosen:
        raise ValueError(
            f"RALLYPOINT_MDNS_INTERFACES={','.join(entries)} names no usable interface"
        )
    return list(dict.fromkeys(chosen))


def _default_interfaces(adapters: Iterable[ifaddr.Adapter]) -> Interfaces:
    """Every IPv4 address, and IPv6 on every interface but loopback.

    IPv6 multicast has no route on ``lo`` (sends to ff02::fb from ::1 fail with
    ENETUNREACH on every announcement), while IPv4 multicast on 127.0.0.1 works and
    lets sidecars on one host see each other.
    """
    chosen: list[str | int] = []
    for adapter in adapters:
        v4 = [ip.ip for ip in adapter.ips if isinstance(ip.ip, str)]
        chosen.extend(v4)
        v6 = [ip.ip for ip in adapter.ips if isinstance(ip.ip, tuple)]
        loopback = any(address[0] == "::1" for address in v6) or adapter.nice_name == "lo"
        if v6 and not loopback and adapter.index is not None:
            chosen.append(adapter.index)
    return list(dict.fromkeys(chosen)) or InterfaceChoice.All


def open_zeroconf(choice: Interfaces) -> AsyncZeroconf:
    """Zeroconf on the chosen interfaces; "all" means IPv4 and IPv6 (IPv4 alone if IPv6 fails)."""
    if choice is not InterfaceChoice.All:
        # An explicit list says its own IP versions (zeroconf infers them from the entries).
        return AsyncZeroconf(interfaces=choice)
    try:
        return AsyncZeroconf(interfaces=choice, ip_version=IPVersion.All)
    except OSError as exc:
        # Hosts with IPv6 disabled fail the IPv6 socket; IPv4 alone still finds peers.
        log.info("mdns_ipv6_unavailable", extra={"error": repr(exc)})
        return AsyncZeroconf(interfaces=choice, ip_version=IPVersion.V4Only)
