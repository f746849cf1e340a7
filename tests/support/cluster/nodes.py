"""Clusters of Linux network namespaces running real sidecars, with faults to inject.

Importable without pytest so that benchmarks can drive the same clusters; the namespaces,
the bridge and the sweeper are tests/support/netns.py's. Each node gets an address in
``10.213.0.0/24`` (assigned only inside the namespaces, never routed anywhere). Nothing
leaves the bridge: there is no default route and the resolver points at the namespace's
own loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import netns
from tests.support.netns import (
    ETC_NETNS,
    IFNAME,
    NETNS_DIR,
    die_with_parent,
    in_namespace,
    sh,
    wait_for,
    write_hosts,
)

SUBNET = "10.213.0"

#: Small timings so that every scenario finishes in seconds; scenarios and the
#: fault campaign add their own flags.
FAST_ARGS = (
    "--deadline", "25",
    "--backoff-initial", "0.05",
    "--backoff-max", "0.5",
    "--long-poll", "5",
    "--resolve-timeout", "2",
)  # fmt: skip
#: IPv6 clusters (family "ipv6" or "dual"): unique local addresses, one /64 per bridge.
SUBNET6 = "fd00:"
#: Address families a Cluster can be built with.
FAMILIES = ("ipv4", "ipv6", "dual")
#: Who owns which tag: one file per live run, so the sweeper leaves concurrent runs alone.
OWNERS_DIR = Path("/run/rallypoint-multihost")
LOCAL_PORT = 7780
PEER_PORT = 7781
_CLONE_NEWNET = 0x40000000
#: An Ethernet header: a frame is the IP packet plus this.
ETH_HLEN = 14
#: Offloads that let a veth carry frames bigger than the wire's (GSO/TSO super-packets, GRO
#: merges): the faults that judge frames by size turn these off on both ends of the link,
#: with every ``*-segmentation`` feature `ethtool -k` lists (TCP, UDP, tunnels ...).
OFFLOADS = frozenset(
    {"generic-segmentation-offload", "generic-receive-offload", "rx-gro-list",
     "large-receive-offload"}
)  # fmt: skip
#: Queue of the tbf shaper (`Node.shape`), as the time the queue takes to drain.
SHAPER_LATENCY = "100ms"
_TAG_RE = re.compile(r"^(rp\d{1,3})(?:-|c\d)")
#: Suffix of the file beside a run's owner file listing its faketime wrappers' pids.
FAKETIME_PIDS = ".faketime"


def run_tag() -> str:
    """The resource prefix of this process: ``rp`` and the pid modulo 1000."""
    return f"rp{os.getpid() % 1000}"


def prerequisites() -> str | None:
    """Why namespace clusters cannot run here, or None when they can."""
    return netns.prerequisites(f"{run_tag()}-probe")


# --- sockets and HTTP inside a namespace ------------------------------------------------------


def netns_socket(
    ns: str,
    family: socket.AddressFamily = socket.AF_INET,
    kind: socket.SocketKind = socket.SOCK_STREAM,
) -> socket.socket:
    """A socket created inside namespace ns; it stays there whichever thread uses it."""
    # setns(CLONE_NEWNET) switches only the calling thread, so a throwaway thread enters the
    # namespace, creates the socket and exits; the socket keeps its namespace for life.
    libc = ctypes.CDLL(None, use_errno=True)
    made: dict[str, Any] = {}

    def enter() -> None:
        try:
            with open(NETNS_DIR / ns, "rb") as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into {ns}: {os.strerror(code)}")
            made["sock"] = socket.socket(family, kind)
        except BaseException as exc:  # re-raised in the caller's thread
            made["error"] = exc

    worker = threading.Thread(target=enter, name=f"setns-{ns}")
    worker.start()
    worker.join()
    if "error" in made:
        raise made["error"]
    sock: socket.socket = made["sock"]
    return sock


class _NetnsHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection whose socket lives in a given network namespace."""

    def __init__(self, ns: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ns = ns

    def connect(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = netns_socket(self._ns, family)
        sock.settimeout(self.timeout)
        try:
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: status code, headers and body."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(ns: str, host: str, port: int, path: str, *, timeout_s: float = 5.0) -> Reply:
    """GET http://host:port/path from inside namespace ns; OSError when nothing answers."""
    conn = _NetnsHTTPConnection(ns, host, port, timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(), dict(resp.getheaders()))
    finally:
        conn.close()


def tcp_connect(ns: str, host: str, port: int, *, timeout_s: float = 2.0) -> str | None:
    """Try a TCP connect from inside ns: None on success, else the error text."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = netns_socket(ns, family)
    sock.settimeout(timeout_s)
    try:
        sock.connect((host, port))
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
    return None


# --- processes --------------------------------------------------------------------------------


def base_environ() -> dict[str, str]:
    """The few variables a child needs; nothing of the caller's environment leaks into nodes."""
    env = netns.base_environ(keep=("PYTHONPATH", "VIRTUAL_ENV"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proc:
    """A process started inside a node's namespace, in its own process group."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    popen: subprocess.Popen[bytes]
    #: Started under `faketime_argv`: ``pid`` is the wrapper, the program its child.
    faketime: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _reaped(self, timeout_s: float = 0.0) -> None:
        """After the exit of ``pid``: for a faketime wrapper, wait for its child and clean up.

        The wrapper dies of a signal at once, while the program it runs may still be
        shutting down: wait (up to timeout_s, then SIGKILL) until nothing of the process
        group is left, then remove the wrapper's shared memory, which it only removes on a
        normal exit.
        """
        if not self.faketime or self.popen.poll() is None:
            return
        if not _group_gone(self.popen.pid, timeout_s):
            self.signal(signal.SIGKILL)
            _group_gone(self.popen.pid, 5.0)
        for path in faketime_files(self.popen.pid):
            path.unlink(missing_ok=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def signal(self, signum: int = signal.SIGKILL) -> None:
        """Send signum to the whole process group (no-op once it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def kill(self, *, timeout_s: float = 10.0) -> None:
        """SIGKILL the process group and reap it."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout_s)
        self._reaped(timeout_s)

    def stop(self, *, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after grace_s; return the exit code."""
        self.signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.poll()
        self._reaped(grace_s)
        return code

    def wait(self, timeout_s: float) -> int:
        """Wait for exit; subprocess.TimeoutExpired if it takes longer."""
        code = self.popen.wait(timeout=timeout_s)
        self._reaped(timeout_s)
        return code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


# --- nodes and clusters -----------------------------------------------------------------------


@dataclass
class Node:
    """One namespace: a host name, an address, a hosts file, and processes."""

    cluster: Cluster
    name: str
    index: int
    ns: str
    address: str
    veth: str  # host side, in the root namespace: cutting it cuts this node off the bridge
    procs: list[Proc] = field(default_factory=list)
    sidecar: Proc | None = None
    #: The node's IPv6 address in a dual-stack cluster (in an IPv6-only one, ``address``).
    address6: str | None = None
    #: The link faults in force (kind -> what undoes it); `clear_faults` undoes them all.
    faults: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every cluster address of this node, IPv4 first."""
        return tuple(a for a in (self.address, self.address6) if a is not None and a != "")

    # hosts file ---------------------------------------------------------------------------

    @property
    def hosts_path(self) -> Path:
        return ETC_NETNS / self.ns / "hosts"

    def hosts(self) -> str:
        return self.hosts_path.read_text()

    def write_hosts(self, text: str) -> None:
        write_hosts(self.ns, text)

    def set_host_entries(self, entries: Mapping[str, str | None]) -> None:
        """Rewrite the node entries: name -> address, or None to drop the name entirely."""
        self.write_hosts(self.cluster.hosts_text(entries))

    def pin(self, host: str, address: str) -> None:
        """Make host resolve to address here (e.g. a Debian-style 127.0.1.1 line)."""
        self.set_host_entries({host: address})

    def unpin(self) -> None:
        """Restore the cluster's original hosts file."""
        self.write_hosts(self.cluster.hosts_text({}))

    def drop_host(self, host: str) -> None:
        """Make host unknown here."""
        self.set_host_entries({host: None})

    # links ----------------------------------------------------------------------------------

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
            self.inside([tool, "-w", "5", "-I", *rule])

    def undrop_incoming(self, *, check: bool = True) -> None:
        """Undo `drop_incoming`; no-op without one."""
        if "drop_incoming" not in self.faults:
            return
        tools, rule = self.faults.pop("drop_incoming")
        for tool in tools:
            sh(["ip", "netns", "exec", self.ns, tool, "-w", "5", "-D", *rule], check=check)
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
                self.inside([tool, "-w", "5", "-I", *rule])

    def uncut_port(self, *, check: bool = True) -> None:
        """Undo `cut_port`; no-op without one."""
        if "cut_port" not in self.faults:
            return
        tools, rules = self.faults.pop("cut_port")
        for tool in tools:
            for rule in rules:
                sh(["ip", "netns", "exec", self.ns, tool, "-w", "5", "-D", *rule], check=check)

    def clear_faults(self, *, check: bool = False) -> None:
        """Undo every fault of clamp_path_mtu, shape, drop_incoming and cut_port in force."""
        self.unclamp_path_mtu(check=check)
        self.unshape(check=check)
        self.undrop_incoming(check=check)
        self.uncut_port(check=check)

    # processes -------------------------------------------------------------------------------

    def command(self, argv: Sequence[str], *, clock_offset_s: float | None = None) -> list[str]:
        """argv wrapped to run in this namespace with this node's host name.

        With ``clock_offset_s``, under `faketime_argv`: its wall clock shifted by that many
        seconds, its monotonic clocks not.
        """
        if clock_offset_s is not None:
            argv = faketime_argv(clock_offset_s, argv)
        return in_namespace(self.ns, self.name, argv)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        label: str = "proc",
        clock_offset_s: float | None = None,
    ) -> Proc:
        """Start argv in this namespace, output to a log file, in its own process group."""
        log_path = self.cluster.workdir / f"{self.name}.{label}.{len(self.procs)}.log"
        full_env = base_environ()
        full_env.update(env or {})
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                self.command(argv, clock_offset_s=clock_offset_s),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        proc = Proc(
            f"{self.name}:{label}", tuple(argv), log_path, popen, clock_offset_s is not None
        )
        if proc.faketime:  # the sweeper removes its shared memory should this run die first
            with open(OWNERS_DIR / f"{self.cluster.tag}{FAKETIME_PIDS}", "a") as pids:
                pids.write(f"{popen.pid}\n")
        self.procs.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        check: bool = False,
        clock_offset_s: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv to completion in this namespace and capture its output."""
        full_env = base_environ()
        full_env.update(env or {})
        return subprocess.run(
            self.command(argv, clock_offset_s=clock_offset_s),
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout_s,
            check=check,
            start_new_session=True,
        )

    def start_sidecar(
        self,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        clock_offset_s: float | None = None,
    ) -> Proc:
        """Start `rallypoint serve` here with this node's orchestrator variables plus env.

        ``clock_offset_s`` shifts its wall clock (`faketime_argv`), e.g. 600 for a node
        whose clock is ten minutes ahead.
        """
        merged = dict(self.cluster.node_environ(self))
        merged.update(self.cluster.sidecar_env)
        merged.update(env or {})
        argv = [sys.executable, "-m", "rallypoint", "serve", *self.cluster.sidecar_args, *args]
        self.sidecar = self.spawn(argv, env=merged, label="sidecar", clock_offset_s=clock_offset_s)
        return self.sidecar

    def kill_sidecar(self) -> None:
        """SIGKILL the sidecar: no goodbye, no cleanup, like a crashed container."""
        if self.sidecar is not None:
            self.sidecar.kill()

    def start_port_thief(
        self, out: Path, first: Sequence[int], then: Sequence[int] = (), interval_s: float = 0.2
    ) -> Proc:
        """Start PORT_THIEF here; its state (held and tried ports) lands in out."""
        joined = [",".join(str(port) for port in ports) for ports in (first, then)]
        argv = [sys.executable, "-c", PORT_THIEF, str(out), *joined, str(interval_s)]
        return self.spawn(argv, label="thief")

    def try_bind(self, port: int, *, address: str = "0.0.0.0", reuse: bool = False) -> int:
        """Bind (and release) a TCP port in this namespace: 0 on success, else the errno."""
        sock = netns_socket(self.ns)
        try:
            if reuse:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
        except OSError as exc:
            return exc.errno or -1
        finally:
            sock.close()
        return 0

    # HTTP -----------------------------------------------------------------------------------

    def get(self, path: str, *, port: int = LOCAL_PORT, timeout_s: float = 5.0) -> Reply:
        """GET path from this node's own local API (127.0.0.1 inside its namespace)."""
        return http_get(self.ns, "127.0.0.1", port, path, timeout_s=timeout_s)

    def try_get(self, path: str, *, timeout_s: float = 5.0) -> Reply | None:
        """Like get, but None when nothing answers yet."""
        try:
            return self.get(path, timeout_s=timeout_s)
        except OSError:
            return None

    def readyz(self) -> Reply | None:
        return self.try_get("/readyz")

    def is_ready(self) -> bool:
        reply = self.readyz()
        return reply is not None and reply.status == 200

    def env(self) -> dict[str, str] | None:
        """The served env (JSON), or None while not ready / not answering."""
        reply = self.try_get("/env?format=json")
        if reply is None or reply.status != 200:
            return None
        served: dict[str, str] = reply.json()
        return served

    def status(self) -> dict[str, Any]:
        """The /status document; raises OSError when the sidecar does not answer."""
        doc: dict[str, Any] = self.get("/status").json()
        return doc

    def not_ready_reasons(self) -> list[dict[str, Any]] | None:
        """The reasons of a 503 from /env (code, message, host ...), or None if not a 503."""
        reply = self.try_get("/env?format=json")
        if reply is None or reply.status != 503:
            return None
        try:
            reasons: list[dict[str, Any]] = reply.json()["reasons"]
        except (ValueError, KeyError, TypeError):
            return [{"code": "unparsed", "message": reply.text}]
        return reasons

    def reasons(self) -> str:
        """What the sidecar says about not being ready (/readyz and /env), as one string."""
        parts: list[str] = []
        for path in ("/readyz", "/env?format=json"):
            reply = self.try_get(path)
            if reply is not None and reply.status != 200:
                parts.append(f"{path} {reply.status}: {reply.text.strip()}")
        return " | ".join(parts)

    def wait_ready(self, timeout_s: float) -> dict[str, str]:
        """Wait until /env serves; return it."""
        return wait_for(
            self.env,
            timeout_s=timeout_s,
            what=f"{self.name} ready",
            describe=lambda: self.describe(),
        )

    def wait_not_ready(self, timeout_s: float) -> Reply:
        """Wait until the local API answers 503 on /readyz; return that answer."""

        def probe() -> Reply | None:
            reply = self.readyz()
            return reply if reply is not None and reply.status == 503 else None

        return wait_for(
            probe, timeout_s=timeout_s, what=f"{self.name} not ready", describe=self.describe
        )

    def describe(self) -> str:
        state = "not started"
        if self.sidecar is not None:
            code = self.sidecar.returncode
            state = "running" if code is None else f"exited {code}"
        status = self.try_get("/status")
        shown = status.text.strip() if status is not None else "no answer on the local API"
        return f"{self.name} sidecar {state}; {self.reasons()} | /status: {shown}"

    def connect(self, host: str, port: int, *, timeout_s: float = 2.0) -> str | None:
        """TCP connect from this namespace: None on success, else the error."""
        return tcp_connect(self.ns, host, port, timeout_s=timeout_s)


#: A process that keeps taking ports the way an unrelated service would: a plain bind (no
#: SO_REUSEADDR), every other one listening. It grabs ``first`` at once, then one port of
#: ``then`` per interval, and after each step tries the MASTER_PORT the local sidecar
#: serves. It rewrites ``out`` (JSON: held, tried) atomically after every change.
PORT_THIEF = r"""
import json, os, signal, socket, sys, time, urllib.request
out, first, then, interval = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ports = lambda text: [int(p) for p in text.split(",") if p]
held, tried, socks = [], set(), []
def save():
    with open(out + ".tmp", "w") as f:
        json.dump({"held": held, "tried": sorted(tried)}, f)
    os.replace(out + ".tmp", out)
def grab(port):
    tried.add(port)
    if port in held:
        return
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        if len(held) % 2:
            s.listen()
    except OSError:
        s.close()
        return
    socks.append(s); held.append(port)
def served_port():
    try:
        with urllib.request.urlopen("http://127.0.0.1:7780/env?format=json", timeout=1) as r:
            return int(json.load(r)["MASTER_PORT"])
    except Exception:
        return None
signal.signal(signal.SIGTERM, lambda *a: (save(), sys.exit(0)))
for port in ports(first):
    grab(port)
save()
queue = ports(then)
while True:
    if queue:
        grab(queue.pop(0))
    master = served_port()
    if master is not None:
        grab(master)
    save()
    time.sleep(interval)
"""


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


def faketime_argv(offset_s: float, argv: Sequence[str]) -> list[str]:
    """argv under Debian's `faketime`, its wall clock ``offset_s`` seconds off (+ ahead).

    ``FAKETIME_DONT_FAKE_MONOTONIC=1``: only CLOCK_REALTIME and friends move; monotonic
    clocks (asyncio's timers, every timeout) are the machine's. ``-m`` is the thread-safe
    libfaketime (the sidecar and torch run threads). Children inherit it (LD_PRELOAD).

    Debian 12's libfaketime 0.9.10 has a bug with that setting (wolfcw/libfaketime#426):
    ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` fails with EINVAL, so Python 3.11's
    ``time.sleep`` raises ``OSError: [Errno 22]``; asyncio, threading waits, select and
    torch's store and gloo timeouts work. Without the setting, ``threading.Event.wait``
    with a timeout hangs and monotonic clocks jump to the epoch, so it stays.
    """
    if shutil.which("faketime") is None:
        raise RuntimeError("`faketime` is not on PATH (apt-get install faketime)")
    # Whole seconds as such; libfaketime reads a fraction's separator from the locale.
    whole = float(offset_s).is_integer()
    offset = f"{int(offset_s):+d}" if whole else f"{offset_s:+.6f}".rstrip("0")
    return ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-m", "-f", offset, *argv]


def faketime_files(pid: int) -> tuple[Path, Path]:
    """The POSIX shared memory and semaphore the faketime wrapper of pid creates."""
    return Path(f"/dev/shm/faketime_shm_{pid}"), Path(f"/dev/shm/sem.faketime_sem_{pid}")


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live (non-zombie) process is left in process group pgid."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    alive = True
                    break
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def read_json_file(path: Path) -> Any:
    """A JSON file's content, or None while it does not exist yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


class Cluster:
    """N namespaces on one private bridge; a context manager that always cleans up.

    ``hosts`` are the node names in orchestrator order (e.g. ``("sub1", "main1", "sub2")``);
    ``environ_for(cluster, node)`` returns the orchestrator variables of a node (default:
    Backend.AI). ``sidecar_args`` are passed to every `rallypoint serve`. ``family`` is
    ``ipv4`` (the default), ``ipv6`` (only ``fd00::/64`` addresses on the bridge) or
    ``dual`` (both; ``Node.address6`` holds the IPv6 one).
    """

    _serial = 0

    def __init__(
        self,
        hosts: Sequence[str],
        workdir: Path,
        *,
        session: str | None = None,
        sidecar_args: Sequence[str] = (),
        sidecar_env: Mapping[str, str] | None = None,
        environ_for: Callable[[Cluster, Node], Mapping[str, str]] | None = None,
        family: str = "ipv4",
        subnet: str = SUBNET,
    ) -> None:
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be unique and non-empty: {hosts!r}")
        if len(hosts) > 200:
            raise ValueError("at most 200 nodes fit the test subnet")
        Cluster._serial += 1
        self.tag = run_tag()
        self.id = f"{self.tag}c{Cluster._serial}"
        self.bridge = netns.Bridge(f"{self.id}br")
        if len(f"{self.id}v{len(hosts)}") > 15:
            raise ValueError(f"interface names for {self.id} exceed 15 characters")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.session = session or f"sess-{self.id}-{os.getpid()}"
        self.sidecar_args = tuple(sidecar_args)
        self.sidecar_env = dict(sidecar_env or {})
        self.environ_for = environ_for or backendai_environ
        self.hosts = tuple(hosts)
        self.family = family
        self.nodes: dict[str, Node] = {}
        for index, name in enumerate(hosts):
            v4 = f"{subnet}.{index + 10}"
            v6 = f"{SUBNET6}:{index + 10}"
            self.nodes[name] = Node(
                cluster=self,
                name=name,
                index=index,
                ns=f"{self.tag}-{Cluster._serial}-{name}",
                address=v6 if family == "ipv6" else v4,
                veth=f"{self.id}v{index}",
                address6=v6 if family == "dual" else None,
            )
        self._closed = False

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # setup --------------------------------------------------------------------------------

    def hosts_text(self, entries: Mapping[str, str | None]) -> str:
        """A hosts file listing every node, with entries overriding (None drops a name)."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        pinned = {name: addr for name, addr in entries.items() if addr is not None}
        # Pinned lines come first: glibc answers the first matching line for a name.
        lines += [f"{addr}\t{name}" for name, addr in pinned.items()]
        for node in self:
            if node.name in entries:
                continue
            lines.extend(f"{address}\t{node.name}" for address in node.addresses)
        return "\n".join(lines) + "\n"

    def up(self) -> None:
        """Create the bridge, namespaces, veths, addresses and hosts files."""
        RUNS.claim(self)
        try:
            self.bridge.up()
            for node in self:
                peer = f"{self.id}p{node.index}"
                self.bridge.add_host(node.ns, node.veth, peer, node.addresses, self.hosts_text({}))
        except BaseException:
            self.close()
            raise

    # orchestrator variables ----------------------------------------------------------------

    def node_environ(self, node: Node) -> Mapping[str, str]:
        return self.environ_for(self, node)

    def start_all(self, args: Sequence[str] = ()) -> None:
        """Start a sidecar on every node, in orchestrator order."""
        for node in self:
            node.start_sidecar(args)

    def wait_all_ready(self, timeout_s: float) -> dict[str, dict[str, str]]:
        """Wait until every node serves /env; return name -> env."""
        deadline = time.monotonic() + timeout_s
        return {node.name: node.wait_ready(max(0.1, deadline - time.monotonic())) for node in self}

    # teardown -------------------------------------------------------------------------------

    def logs(self, tail_lines: int = 40) -> str:
        """The tail of every process log, for failure reports."""
        chunks: list[str] = []
        for node in self:
            for proc in node.procs:
                lines = proc.log().splitlines()[-tail_lines:]
                chunks.append(f"--- {proc.name} (pid {proc.pid}, rc {proc.returncode}) ---")
                chunks.extend(lines)
        return "\n".join(chunks)

    def close(self) -> None:
        """Kill every process and delete everything up() created; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for node in self:
            for proc in node.procs:
                proc.kill()
        for node in self:
            # Every fault lives on the veth pair or in the namespace, both deleted next; undone
            # first all the same, so that nothing outlives a link that fails to go.
            node.clear_faults()
            self.bridge.remove_host(node.ns, node.veth)
        self.bridge.close()
        RUNS.release(self)


_ROLE_NAME = re.compile(r"([a-z]+?)(\d+)")


def _role(name: str) -> tuple[str, int]:
    match = _ROLE_NAME.fullmatch(name)
    return (match.group(1), int(match.group(2))) if match else (name, 1)


#: A factory of up clusters (the make_cluster fixture): hosts, args, env -> Cluster.
MakeCluster = Callable[..., Cluster]


def backendai_order(hosts: Sequence[str]) -> list[str]:
    """Backend.AI's kernel order: the ``main`` container first, then by role and index."""
    mains = [name for name in hosts if _role(name)[0] == "main"]
    rest = sorted((name for name in hosts if name not in mains), key=_role)
    return [*mains, *rest]


def backendai_environ(cluster: Cluster, node: Node) -> dict[str, str]:
    """Backend.AI's cluster variables for node, as its agent injects them into a container.

    Roles and indexes come from the names (``main1`` -> role main, index 1); LOCAL_RANK is
    0 for main1 and counts on through the other containers, the way Backend.AI numbers them.
    """
    role, idx = _role(node.name)
    roles: dict[str, int] = {}
    for name in cluster.hosts:
        roles[_role(name)[0]] = roles.get(_role(name)[0], 0) + 1
    return {
        "BACKENDAI_CLUSTER_HOSTS": ",".join(cluster.hosts),
        "BACKENDAI_CLUSTER_HOST": node.name,
        "BACKENDAI_CLUSTER_SIZE": str(len(cluster.hosts)),
        "BACKENDAI_CLUSTER_ROLE": role,
        "BACKENDAI_CLUSTER_IDX": str(idx),
        "BACKENDAI_CLUSTER_LOCAL_RANK": str(backendai_order(cluster.hosts).index(node.name)),
        "BACKENDAI_CLUSTER_REPLICAS": ",".join(f"{r}:{n}" for r, n in roles.items()),
        "BACKENDAI_SESSION_ID": cluster.session,
    }


def no_orchestrator(_cluster: Cluster, _node: Node) -> dict[str, str]:
    """No orchestrator variables at all: the nodes know only their count and session."""
    return {}


def mdns_cluster(make_cluster: MakeCluster, hosts: tuple[str, ...], nnodes: int) -> Cluster:
    """A cluster whose sidecars use RALLYPOINT_DISCOVERY=mdns on the bridge interface."""
    cluster = make_cluster(hosts=hosts)
    cluster.environ_for = no_orchestrator
    cluster.sidecar_env.update(
        {
            "RALLYPOINT_DISCOVERY": "mdns",
            "RALLYPOINT_NNODES": str(nnodes),
            "RALLYPOINT_SESSION": cluster.session,
            "RALLYPOINT_MDNS_INTERFACES": IFNAME,
        }
    )
    return cluster


# --- lifetime: atexit and the stale-resource sweeper ------------------------------------------

RUNS = netns.Runs(OWNERS_DIR, run_tag)
close_all = RUNS.close_all


def sweep_stale() -> list[str]:
    """Delete leftovers of dead runs (processes, namespaces, links, files, rules); list them."""
    removed = RUNS.sweep(_TAG_RE)
    if OWNERS_DIR.is_dir():
        for entry in OWNERS_DIR.iterdir():
            tag = entry.name.removesuffix(FAKETIME_PIDS)
            if tag == run_tag() or not RUNS.stale(tag):
                continue
            if entry.name != tag:  # a dead run's faketime wrappers: their shared memory
                pids = [int(p) for p in entry.read_text().split() if p.isdigit()]
                for path in (
                    f for pid in pids if not netns.pid_alive(pid) for f in faketime_files(pid)
                ):
                    if path.exists():
                        path.unlink(missing_ok=True)
                        removed.append(f"file {path}")
            entry.unlink(missing_ok=True)
    return removed
