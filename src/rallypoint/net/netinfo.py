"""This host's addresses and the interface that routes to a peer, from the kernel, no extras.

IPv4 addresses come from the SIOCGIFCONF ioctl (every interface with an IPv4 address,
labelled aliases such as eth0:1 included), with `ip -o addr` as the fallback where the ioctl is
unavailable; IPv6 addresses come from /proc/net/if_inet6. Both calls block briefly: call them
at start-up, or in an executor.
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import subprocess

_SIOCGIFCONF = 0x8912
# struct ifreq: a 16-byte name and a union whose largest member (struct ifmap) holds two
# unsigned longs, so 40 bytes with 64-bit longs and 32 with 32-bit ones.
_IFNAMSIZ = 16
_IFREQ_SIZE = _IFNAMSIZ + (24 if struct.calcsize("L") == 8 else 16)
_IF_INET6_PATH = "/proc/net/if_inet6"
_IFA_F_DADFAILED = 0x08


def local_addresses() -> list[str]:
    """This host's IPv4 and IPv6 addresses: no loopback, link-local IPv6 only as a last resort.

    IPv4 first, then IPv6, each in the kernel's order, without duplicates.
    """
    usable: list[str] = []
    link_local: list[str] = []
    for _, address in _interface_addresses():
        ip = ipaddress.ip_address(address)
        if ip.is_loopback or ip.is_unspecified:
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.is_link_local:
            link_local.append(address)
        else:
            usable.append(address)
    return list(dict.fromkeys(usable or link_local))


def route_ifname(address: str) -> str | None:
    """The interface whose route reaches ``address`` (an IP literal); None if it cannot tell.

    Connecting a UDP socket sends nothing: the kernel only picks the route and the source
    address, which is then mapped back to its interface.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            # Port 9 is "discard"; any port works because nothing is sent.
            probe.connect((address, 9))
            source = str(probe.getsockname()[0]).split("%", 1)[0]
    except OSError:
        return None
    source_ip = ipaddress.ip_address(source)
    for ifname, local in _interface_addresses():
        if ipaddress.ip_address(local) == source_ip:
            return ifname
    return None


def mtu(ifname: str, sys_class_net: str = "/sys/class/net") -> int | None:
    """The MTU of interface ``ifname`` from sysfs; None when it cannot be read."""
    if not ifname or "/" in ifname or ifname.startswith("."):
        return None
    try:
        with open(f"{sys_class_net}/{ifname}/mtu", encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def rdma_visible(path: str = "/dev/infiniband") -> bool:
    """Whether RDMA devices are visible here (NCCL would then prefer InfiniBand/RoCE)."""
    try:
        return any(True for _ in os.scandir(path))
    except OSError:
        return False


def _interface_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every IPv4 and IPv6 address, loopback included."""
    try:
        pairs = _ipv4_ioctl()
    except OSError:
        pairs = [pair for pair in _ip_addr_show() if ":" not in pair[1]]
    return pairs + _ipv6_proc()


def _ipv4_ioctl() -> list[tuple[str, str]]:
    """IPv4 (interface, address) pairs from SIOCGIFCONF; OSError where it is unsupported."""
    size = 64 * _IFREQ_SIZE
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while True:
            buffer = array.array("B", bytes(size))
            pointer, _ = buffer.buffer_info()
            request = struct.pack("iL", size, pointer)
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request)
            used = struct.unpack("iL", answer)[0]
            # A full buffer may have been truncated: ask again with more room.
            if used < size:
                break
            size *= 2
    data = buffer.tobytes()[:used]
    pairs = []
    for offset in range(0, used - _IFREQ_SIZE + 1, _IFREQ_SIZE):
        name = data[offset : offset + _IFNAMSIZ].split(b"\0", 1)[0].decode("ascii", "replace")
        (family,) = struct.unpack_from("H", data, offset + _IFNAMSIZ)
        if family != socket.AF_INET:
            continue
        # struct sockaddr_in: family (2 bytes), port (2 bytes), then the address.
        raw = data[offset + _IFNAMSIZ + 4 : offset + _IFNAMSIZ + 8]
        pairs.append((_base_ifname(name), socket.inet_ntoa(raw)))
    return pairs


def _ipv6_proc(path: str = _IF_INET6_PATH) -> list[tuple[str, str]]:
    """IPv6 (interface, address) pairs from /proc/net/if_inet6; none when IPv6 is off."""
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read()
    except OSError:
        return []
    return parse_if_inet6(text)


def parse_if_inet6(text: str) -> list[tuple[str, str]]:
    """Parse /proc/net/if_inet6: hex address, ifindex, prefix, scope, flags, name per line."""
    pairs = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue
        hex_address, _, _, _, flags, ifname = fields
        try:
            address = ipaddress.IPv6Address(bytes.fromhex(hex_address))
            if int(flags, 16) & _IFA_F_DADFAILED:
                continue
        except ValueError:
            continue
        pairs.append((ifname, str(address)))
    return pairs


def _ip_addr_show() -> list[tuple[str, str]]:
    """(interface, address) pairs from `ip -o addr show`; none when ip is missing or fails."""
    ip_tool = shutil.which("ip")
    if ip_tool is None:
        return []
    try:
        done = subprocess.run(
            [ip_tool, "-o", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ip_addr(done.stdout)


def parse_ip_addr(text: str) -> list[tuple[str, str]]:
    """Parse `ip -o addr show`: "2: eth0    inet 10.0.0.2/24 brd ... scope global eth0"."""
    pairs = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in {"inet", "inet6"}:
            continue
        address = fields[3].split("/", 1)[0]
        try:
            ipaddress.ip_address(address)
        except ValueError:
            continue
        # Veth peers read "eth0@if12"; the interface name is the part before the "@".
        pairs.append((_base_ifname(fields[1].split("@", 1)[0]), address))
    return pairs


def _base_ifname(name: str) -> str:
    """The device name without an alias label ("eth0:1" -> "eth0"), as NCCL and gloo want it."""
    return name.split(":", 1)[0]
