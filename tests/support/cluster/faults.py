"""Faults on a node's link: cut, blackholed, a path-MTU black hole, shaped, lossy, a port cut.

`LinkFaults` is mixed into `Node` (nodes.py). Every fault it injects is remembered in the
node's ``faults`` (kind -> what undoes it), so `LinkFaults.clear_faults` undoes them all.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from tests.support import netns
from tests.support.cluster.layout import PEER_PORT
from tests.support.netns import IFNAME, sh

#: An Ethernet header: a frame is the IP packet plus this.
ETH_HLEN = 14
#: Offloads that let a veth carry frames bigger than the wire's (GSO/TSO super-packets, GRO
#: merges): the faults that judge frames by size turn these off on both ends of the link,
#: with every ``*-segmentation`` feature `ethtool -k` lists (TCP, UDP, tunnels ...).
OFFLOADS = frozenset(
    {"generic-segmentation-offload", "generic-receive-offload", "rx-gro-list",
     "large-receive-offload"}
)  # fmt: skip
#: Queue of the tbf shaper (`LinkFaults.shape`), as the time the queue takes to drain.
SHAPER_LATENCY = "100ms"


class LinkFaults(ABC):
    """The link faults of a node in namespace ``ns``, whose veth ``veth`` (host side, in the
    root namespace) plugs it into the bridge."""

    ns: str
    veth: str
    #: The link faults in force (kind -> what undoes it); `clear_faults` undoes them all.
    faults: dict[str, Any]

    @property
    @abstractmethod
    def addresses(self) -> tuple[str, ...]:
        """Every cluster address of this node, IPv4 first."""

    def inside(self, argv: Sequence[str]) -> None:
        """Run an administrative command (ip, iptables) inside this node's namespace."""
        sh(["ip", "netns", "exec", self.ns, *argv])

    def blackhole(self, address: str) -> None:
        """Drop everything this node sends to address (a route into nowhere)."""
        self.inside(["ip", "route", "add", "blackhole", f"{address}/32"])

    def unblackhole(self, address: str) -> None:
        self.inside(["ip", "route", "del", "blackhole", f"{address}/32"])

    def link_down(self) -> None:
        """Cut this node off the bridge (its interface stays up, frames go nowhere)."""
        sh(["ip", "link", "set", self.veth, "down"])

    def link_up(self) -> None:
        sh(["ip", "link", "set", self.veth, "up"])

    def _link_ends(self) -> tuple[tuple[list[str], str], tuple[list[str], str]]:
        """Both ends of this node's veth pair: (command prefix, device), inside first."""
        return (["ip", "netns", "exec", self.ns], IFNAME), ([], self.veth)

    def _offloads_off(self) -> None:
        """Turn off, on both ends of the link, every offload that carries oversize frames.

        A veth hands GSO/TSO super-packets to its peer whole, past any size check, and the
        kernel segments them later, by the sender's MSS. With these off, every frame that
        crosses the pair is a real one, as on a wire: the node's eth0 segments what it sends,
        the bridge-side veth what the bridge forwards to the node. Remembered per device, so
        `_offloads_restore` turns back on exactly what this turned off.
        """
        if "offloads" in self.faults:
            return
        changed: dict[str, list[str]] = {}
        self.faults["offloads"] = changed  # before the change: a failure half-way is undone too
        for prefix, dev in self._link_ends():
            listing = sh([*prefix, "ethtool", "-k", dev]).stdout
            names = [  # "name: on" exactly: not "[fixed]", not "off [requested on]"
                name
                for name in re.findall(r"^\s*([\w-]+): on$", listing, re.M)
                if name in OFFLOADS or name.endswith("-segmentation")
            ]
            changed[dev] = names
            if names:
                sh([*prefix, "ethtool", "-K", dev, *(w for n in names for w in (n, "off"))])

    def _offloads_restore(self, *, check: bool = True) -> None:
        """Turn back on what `_offloads_off` turned off, once no fault needs them off."""
        if "mtu_clamp" in self.faults or "drop_incoming" in self.faults:
            return
        changed: dict[str, list[str]] = self.faults.pop("offloads", {})
        for prefix, dev in self._link_ends():
            names = changed.get(dev, [])
            if names:
                argv = [*prefix, "ethtool", "-K", dev, *(w for n in names for w in (n, "on"))]
                sh(argv, check=check)

    def clamp_path_mtu(self, size: int) -> None:
        """A path-MTU black hole: IP packets over ``size`` bytes to or from here vanish.

        Every interface still says 1500 and TCP still agrees on an MSS of 1460, but frames
        longer than ``size`` (IP packet length, i.e. frame minus the Ethernet header) are
        dropped on the wire, in both directions, and nothing sends an ICMP "fragmentation
        needed": a TCP connection stalls at its first full-sized segment, while one with
        ``TCP_MAXSEG`` at most ``size - 40`` (IPv4; the timestamps option comes out of that
        MSS) passes. The drop is a tc ``bpf`` filter (classic BPF, direct action) at the
        ingress of both ends of the veth pair: the bridge-side veth sees what the node
        sends, the node's eth0 what it receives, each frame after segmentation (offloads
        off, `_offloads_off`), and a frame dropped there is lost on the wire for the sender.
        An MTU on the bridge port would let GSO super-packets through (and frames 4 bytes
        over it, the VLAN allowance); iptables OUTPUT sees TCP's GSO super-packets before
        segmentation, and a drop there is a local error the sending TCP knows about.
        """
        self.unclamp_path_mtu()
        self.faults["mtu_clamp"] = size
        self._offloads_off()
        for prefix, dev in self._link_ends():
            sh([*prefix, "tc", "qdisc", "add", "dev", dev, "clsact"])
            sh([*prefix, "tc", "filter", "add", "dev", dev, "ingress",
                "bpf", "da", "bytecode", drop_frames_over(size + ETH_HLEN)])  # fmt: skip

    def unclamp_path_mtu(self, *, check: bool = True) -> None:
        """Undo `clamp_path_mtu`: the filters go, the offloads come back; no-op without one."""
        if self.faults.pop("mtu_clamp", None) is None:
            return
        for prefix, dev in self._link_ends():
            sh([*prefix, "tc", "qdisc", "del", "dev", dev, "clsact"], check=check)
        self._offloads_restore(check=check)

    def shape(self, rate_mbit: float) -> None:
        """Shape this node's link to ``rate_mbit`` in both directions (tc tbf).

        One token bucket on the egress of the node's eth0 (what it sends) and one on the
        egress of the bridge-side veth (what the bridge forwards to it); the bucket holds
        5 ms at that rate, at least 16 KiB, and the queue SHAPER_LATENCY, beyond which tbf
        drops, like a bottleneck link's buffer. tbf segments GSO super-packets larger than
        its bucket, so offloads stay on. Measured: 4.7-4.8 Mbit/s for 5, 19.2 for 20.
        """
        if rate_mbit <= 0:
            raise ValueError(f"rate must be positive, got {rate_mbit!r} Mbit/s")
        self.unshape()
        burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 * 0.005))
        self.faults["shape"] = rate_mbit
        for prefix, dev in self._link_ends():
            sh([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{rate_mbit:g}mbit", "burst", str(burst),
                "latency", SHAPER_LATENCY])  # fmt: skip

    def unshape(self, *, check: bool = True) -> None:
        """Undo `shape` (the veth's default, no queue, comes back); no-op without one."""
        if self.faults.pop("shape", None) is None:
            return
        for prefix, dev in self._link_ends():
            sh([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], check=check)

    def drop_incoming(self, fraction: float) -> None:
        """Lose ``fraction`` of the TCP packets arriving on this node's link, at random.

        iptables (ip6tables for IPv6 addresses) ``-m statistic --mode random`` on INPUT
        inside the namespace, for eth0 only: loopback traffic is never dropped. Offloads
        are off as for `clamp_path_mtu`, so that a packet is a wire frame and not a GSO
        super-packet of up to 45 of them (the loss would otherwise come in bursts).
        """
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        self.undrop_incoming()
        self._offloads_off()
        rule = ["INPUT", "-i", IFNAME, "-p", "tcp", "-m", "statistic", "--mode", "random",
                "--probability", f"{fraction:.6f}", "-j", "DROP"]  # fmt: skip
        tools = self._filter_tools()
        self.faults["drop_incoming"] = (tools, rule)
        for tool in tools:
            self.inside(netns.xtables(tool, "-I", *rule))

    def undrop_incoming(self, *, check: bool = True) -> None:
        """Undo `drop_incoming`; no-op without one."""
        if "drop_incoming" not in self.faults:
            return
        tools, rule = self.faults.pop("drop_incoming")
        for tool in tools:
            sh(["ip", "netns", "exec", self.ns, *netns.xtables(tool, "-D", *rule)], check=check)
        self._offloads_restore(check=check)

    def _filter_tools(self) -> list[str]:
        """iptables for this node's IPv4 addresses, ip6tables for its IPv6 ones."""
        return sorted({"ip6tables" if ":" in a else "iptables" for a in self.addresses})

    def cut_port(self, port: int = PEER_PORT) -> None:
        """Drop every TCP packet to or from ``port`` on this node, both ways (the sidecars'
        peer port by default: the sidecar is cut off, the job's own traffic is not)."""
        self.uncut_port()
        rules = netns.port_drop_rules(port)
        tools = self._filter_tools()
        self.faults["cut_port"] = (tools, rules)
        for tool in tools:
            for rule in rules:
                self.inside(netns.xtables(tool, "-I", *rule))

    def uncut_port(self, *, check: bool = True) -> None:
        """Undo `cut_port`; no-op without one."""
        if "cut_port" not in self.faults:
            return
        tools, rules = self.faults.pop("cut_port")
        for tool in tools:
            for rule in rules:
                sh(["ip", "netns", "exec", self.ns, *netns.xtables(tool, "-D", *rule)], check=check)

    def clear_faults(self, *, check: bool = False) -> None:
        """Undo every fault of clamp_path_mtu, shape, drop_incoming and cut_port in force."""
        self.unclamp_path_mtu(check=check)
        self.unshape(check=check)
        self.undrop_incoming(check=check)
        self.uncut_port(check=check)


def drop_frames_over(length: int) -> str:
    """A tc ``bpf da bytecode`` program: drop frames longer than ``length`` bytes.

    Classic BPF (the kernel needs no eBPF loader or act_gact for it): load the frame
    length (at tc ingress cls_bpf sees the frame with its Ethernet header), return
    TC_ACT_SHOT (2) when it is longer, else TC_ACT_UNSPEC (-1, the filter chain goes on).
    """
    program = [
        (0x80, 0, 0, 0),  # ld len
        (0x25, 0, 1, length),  # jgt #length: next, else skip one
        (0x06, 0, 0, 2),  # ret #TC_ACT_SHOT
        (0x06, 0, 0, 0xFFFFFFFF),  # ret #TC_ACT_UNSPEC
    ]
    return ",".join([str(len(program)), *(" ".join(map(str, op)) for op in program)])
