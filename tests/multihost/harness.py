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
#: IPv6 clusters (family "ipv6" or "dual"): unique local addresses, one /64 per bridge.
SUBNET6 = "fd00:"
#: Address families a Cluster can be built with.
FAMILIES = ("ipv4", "ipv6", "dual")
#: Who owns which tag: one file per live run, so the sweeper leaves concurrent runs alone.
OWNERS_DIR = Path("/run/rallypoint-multihost")
LOCAL_PORT = 7780
PEER_PORT = 7781
_CLONE_NEWNET = 0x40000000
_TAG_RE = re.compile(r"^(rp\d{1,3})(?:-|c\d)")


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

    @property
    def pid(self) -> int:
        return self.popen.pid

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

    def stop(self, *, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after grace_s; return the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.poll()

    def wait(self, timeout_s: float) -> int:
        """Wait for exit; subprocess.TimeoutExpired if it takes longer."""
        return self.popen.wait(timeout=timeout_s)

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

    # processes -------------------------------------------------------------------------------

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv wrapped to run in this namespace with this node's host name."""
        return in_namespace(self.ns, self.name, argv)

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, label: str = "proc"
    ) -> Proc:
        """Start argv in this namespace, output to a log file, in its own process group."""
        log_path = self.cluster.workdir / f"{self.name}.{label}.{len(self.procs)}.log"
        full_env = base_environ()
        full_env.update(env or {})
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                self.command(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        proc = Proc(f"{self.name}:{label}", tuple(argv), log_path, popen)
        self.procs.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv to completion in this namespace and capture its output."""
        full_env = base_environ()
        full_env.update(env or {})
        return subprocess.run(
            self.command(argv),
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout_s,
            check=check,
            start_new_session=True,
        )

    def start_sidecar(
        self, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None
    ) -> Proc:
        """Start `rallypoint serve` here with this node's orchestrator variables plus env."""
        merged = dict(self.cluster.node_environ(self))
        merged.update(self.cluster.sidecar_env)
        merged.update(env or {})
        argv = [sys.executable, "-m", "rallypoint", "serve", *self.cluster.sidecar_args, *args]
        self.sidecar = self.spawn(argv, env=merged, label="sidecar")
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
            if entry.name != run_tag() and RUNS.stale(entry.name):
                entry.unlink(missing_ok=True)
    return removed
