"""Hosts as Linux network namespaces on one private bridge: shared by the multihost and Slurm tiers.

Importable without pytest (benchmarks drive the same clusters). Needs root, ``ip`` (iproute2
with ``ip netns``) and ``unshare``; ``iptables`` when the host filters bridged frames (Docker
hosts do). Each host is a namespace with one veth into the bridge, its addresses on ``eth0``,
``lo`` up, its own ``/etc/netns/NS/hosts`` and ``resolv.conf`` (``ip netns exec`` bind-mounts
them over ``/etc``) and, through `in_namespace`, its own host name in a UTS namespace.
Resource names start with a run tag, so the sweeper can tell a dead run's leftovers from a
live run's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from tests.support import commands

NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
IFNAME = "eth0"
PREFIX_LEN = 24
PREFIX_LEN6 = 64
_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def sh(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a short administrative command; raise with what it said when check fails."""
    return commands.run(argv, timeout_s=timeout, check=check, env=env)


def prerequisites(probe: str, tools: Sequence[str] = (), *, root_for: str = "") -> str | None:
    """Why namespaces (and ``tools``) cannot be used here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return f"{root_for or 'network namespaces'} need root"
    for tool in ("ip", "unshare", *tools):
        if shutil.which(tool) is None:
            hint = " (scripts/setup-system.sh installs it)" if tools else ""
            return f"`{tool}` is not on PATH{hint}"
    created = sh(["ip", "netns", "add", probe], check=False)
    if created.returncode != 0:
        return f"`ip netns add` failed: {created.stderr.strip()}"
    sh(["ip", "netns", "del", probe], check=False)
    return None


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the spawning thread dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    what: str = "condition",
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll until probe returns something truthy and return it; TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"; last seen: {describe()}" if describe is not None else ""
            raise TimeoutError(f"{what} not reached within {timeout_s:g} s{extra}")
        time.sleep(interval_s)


def namespace_pids(ns: str) -> list[int]:
    """Pids of every process in namespace ``ns`` (none once it is gone)."""
    done = sh(["ip", "netns", "pids", ns], check=False)
    return [int(pid) for pid in done.stdout.split() if pid.isdigit()]


def kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ``ns``."""
    for pid in namespace_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def base_environ(keep: Sequence[str] = ()) -> dict[str, str]:
    """PATH, HOME, locale and TMPDIR (plus ``keep``): nothing else of the caller's leaks in."""
    names = ("PATH", "HOME", "LANG", "LC_ALL", *keep, "TMPDIR")
    env = {key: os.environ[key] for key in names if key in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def in_namespace(ns: str, hostname: str, argv: Sequence[str]) -> list[str]:
    """argv wrapped to run in namespace ``ns`` under its own host name (a UTS namespace)."""
    return [
        "ip", "netns", "exec", ns,
        "unshare", "--uts",
        "sh", "-c", 'hostname "$0" && exec "$@"', hostname,
        *argv,
    ]  # fmt: skip


def hosts_file(entries: Iterable[tuple[str, str]]) -> str:
    """A hosts file: localhost (IPv4 and IPv6), then one line per (address, name) in order."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for address, name in entries]
    return "\n".join(lines) + "\n"


def write_hosts(ns: str, text: str) -> None:
    """Replace a namespace's hosts file in place.

    In place, not by rename: the namespace sees the file through a bind mount of its inode,
    and a renamed-over file would be invisible to processes already running.
    """
    with open(ETC_NETNS / ns / "hosts", "r+") as handle:
        handle.seek(0)
        handle.write(text)
        handle.truncate()


#: How long an iptables call waits for the xtables lock that another cluster's call holds
#: (tests side by side): without it the second call fails at once.
XTABLES_WAIT_S = "5"


def xtables(tool: str, *args: str) -> list[str]:
    """``tool`` (iptables or ip6tables) with ``args``, waiting for the xtables lock."""
    return [tool, "-w", XTABLES_WAIT_S, *args]


def port_drop_rules(port: int) -> list[list[str]]:
    """iptables rules (without the action) that drop every TCP packet to or from ``port``, in
    and out: a process listening there is cut off, the rest of the host's traffic is not."""
    return [
        [chain, "-p", "tcp", direction, str(port), "-j", "DROP"]
        for chain in ("INPUT", "OUTPUT")
        for direction in ("--dport", "--sport")
    ]


def host_off_link(ifname: str) -> None:
    """No address of the host on ``ifname`` (IPv6 disabled before it is up): a port only."""
    knob = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")
    if knob.exists():  # absent where the kernel has no IPv6: then there is nothing to do
        knob.write_text("1\n")


def host_addresses(ifname: str) -> list[str]:
    """The host's own addresses on ``ifname`` (``ip -j addr``), link-local included."""
    out = sh(["ip", "-j", "addr", "show", "dev", ifname]).stdout
    return [a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])]


#: Docker's default address pools (172.17-31 as /16s, 192.168 as /20s): a compose network
#: takes the next one, and while it exists Docker masquerades its subnet's traffic leaving
#: any other interface. With br_netfilter that includes the frames our bridges forward, and
#: masquerading to a bridge without an address drops them: every new connection between
#: namespace hosts on such a subnet vanishes while the compose tier runs beside.
DOCKER_POOLS = (ipaddress.ip_network("172.16.0.0/12"), ipaddress.ip_network("192.168.0.0/16"))


def check_subnet(prefix: str) -> None:
    """ValueError for a test subnet (its first three octets) inside Docker's default pools."""
    network = ipaddress.ip_network(f"{prefix}.0/24")
    for pool in DOCKER_POOLS:
        if network.overlaps(pool):
            raise ValueError(
                f"test subnet {network} is inside Docker's address pool {pool}: a compose "
                "network there would drop its traffic; use 10.x or 198.18.x (RFC 2544)"
            )


class Bridge:
    """A private bridge and the rule that lets it forward to itself; close() removes both."""

    def __init__(self, name: str) -> None:
        if len(name) > 15:
            raise ValueError(f"interface name {name} exceeds 15 characters")
        self.name = name
        self._forward_rule = False

    def up(self) -> None:
        # No multicast snooping: without an IGMP querier on the bridge it would stop
        # flooding mDNS (224.0.0.251, ff02::fb) to the ports after a while.
        sh(["ip", "link", "add", self.name, "type", "bridge", "mcast_snooping", "0"])
        # The host takes no part: no address on the bridge (not even IPv6 link-local), so
        # no mDNS announcer of the host's own (a user's sidecar) reaches the namespaces.
        host_off_link(self.name)
        sh(["ip", "link", "set", self.name, "up"])
        if shutil.which("iptables") is not None:
            # Docker sets FORWARD's policy to DROP, and with br_netfilter bridged frames
            # traverse it; this rule lets our bridge talk to itself and nothing else.
            sh(xtables("iptables", "-I", *self._forward_accept()))
            self._forward_rule = True

    def add_host(
        self, ns: str, veth: str, peer: str, addresses: Sequence[str], hosts_text: str
    ) -> None:
        """Namespace ``ns`` on this bridge: veth ``veth`` outside, ``peer`` renamed eth0 inside."""
        etc = ETC_NETNS / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_text)
        # Queries for unknown names go to the namespace's own loopback and fail at once,
        # instead of timing out or leaking to a real DNS server.
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        sh(["ip", "netns", "add", ns])
        sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
        sh(["ip", "link", "set", peer, "netns", ns])
        host_off_link(veth)
        sh(["ip", "link", "set", veth, "master", self.name, "up"])
        inside = ["ip", "-n", ns]
        sh([*inside, "link", "set", peer, "name", IFNAME])
        sh([*inside, "link", "set", "lo", "up"])
        # No duplicate address detection: addresses are unique by construction and DAD
        # would leave the link-local address tentative for the first seconds.
        sh(
            ["ip", "netns", "exec", ns, "sh", "-c",
             f"echo 0 > /proc/sys/net/ipv6/conf/{IFNAME}/accept_dad"],
            check=False,
        )  # fmt: skip
        for address in addresses:
            v6 = ":" in address
            length = PREFIX_LEN6 if v6 else PREFIX_LEN
            sh([*inside, "addr", "add", f"{address}/{length}", "dev", IFNAME,
                *(("nodad",) if v6 else ())])  # fmt: skip
        sh([*inside, "link", "set", IFNAME, "up"])
        if any(":" not in address for address in addresses):
            # mDNS needs a multicast route; unicast outside the subnet has none, on purpose.
            sh([*inside, "route", "add", "224.0.0.0/4", "dev", IFNAME])

    def _forward_accept(self) -> list[str]:
        """The FORWARD rule (without the action) that lets this bridge talk to itself."""
        return ["FORWARD", "-i", self.name, "-o", self.name, "-j", "ACCEPT"]

    def remove_host(self, ns: str, veth: str) -> None:
        sh(["ip", "link", "del", veth], check=False)
        sh(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)

    def close(self) -> None:
        sh(["ip", "link", "del", self.name], check=False)
        if self._forward_rule:
            sh(xtables("iptables", "-D", *self._forward_accept()), check=False)
            self._forward_rule = False


class Closable(Protocol):
    def close(self) -> None: ...


class Runs:
    """This process's open clusters (closed at exit) and the owners of other runs' tags.

    Each run writes its pid to ``owners/TAG``; a tag is stale when no live process other
    than this one owns it, or, for this process's own tag, when no cluster of it is open
    (what is left then comes from an earlier run whose pid ended in the same digits).
    """

    def __init__(self, owners: Path, own_tag: Callable[[], str]) -> None:
        self.owners = owners
        self.own_tag = own_tag
        self._live: list[Closable] = []
        self._lock = threading.Lock()
        self._atexit = False

    def is_open(self) -> bool:
        with self._lock:
            return bool(self._live)

    def claim(self, cluster: Closable) -> None:
        """Register ``cluster`` for closing at exit and mark its tag as ours."""
        with self._lock:
            self._live.append(cluster)
            if not self._atexit:
                atexit.register(self.close_all)
                self._atexit = True
        self.owners.mkdir(parents=True, exist_ok=True)
        (self.owners / self.own_tag()).write_text(str(os.getpid()))

    def release(self, cluster: Closable) -> None:
        with self._lock:
            if cluster in self._live:
                self._live.remove(cluster)

    def close_all(self) -> None:
        """Close every cluster this process still has open (atexit does this too)."""
        with self._lock:
            live = list(self._live)
        for cluster in live:
            cluster.close()

    def stale(self, tag: str) -> bool:
        if tag == self.own_tag():
            return not self.is_open()
        try:
            pid = int((self.owners / tag).read_text().strip())
        except (OSError, ValueError):
            return True
        return pid == os.getpid() or not pid_alive(pid)

    def sweep(self, tag_re: re.Pattern[str]) -> list[str]:
        """Delete stale namespaces (and their processes), links, rules and files; list them."""
        removed: list[str] = []

        def stale(name: str) -> bool:
            match = tag_re.match(name)
            return match is not None and self.stale(match.group(1))

        namespaces = sorted(NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []
        for entry in (entry for entry in namespaces if stale(entry.name)):
            kill_namespace(entry.name)
            sh(["ip", "netns", "del", entry.name], check=False)
            removed.append(f"netns {entry.name}")
        for link in json.loads(sh(["ip", "-j", "link", "show"]).stdout or "[]"):
            name = str(link.get("ifname", ""))
            if stale(name):
                sh(["ip", "link", "del", name], check=False)
                removed.append(f"link {name}")
        if shutil.which("iptables") is not None:
            for line in sh(xtables("iptables", "-S", "FORWARD"), check=False).stdout.splitlines():
                found = re.fullmatch(r"-A FORWARD -i (\S+) -o \1 -j ACCEPT", line.strip())
                if found and stale(found.group(1)):
                    sh(xtables("iptables", "-D", *line.split()[1:]), check=False)
                    removed.append(f"iptables rule for {found.group(1)}")
        if ETC_NETNS.is_dir():
            for entry in (entry for entry in ETC_NETNS.iterdir() if stale(entry.name)):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"dir {entry}")
        return removed
