"""One node of a namespace cluster: a host name, an address, a hosts file, and processes.

A `Node` is a network namespace on the cluster's bridge (build.py builds them); its link
faults are faults.py's, its sockets and HTTP requests netio.py's.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support import commands
from tests.support.cluster.faults import LinkFaults
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.netio import Reply, http_get, netns_socket, tcp_connect
from tests.support.cluster.procs import Proc, base_environ, faketime_argv
from tests.support.cluster.runs import FAKETIME_PIDS, OWNERS_DIR
from tests.support.netns import ETC_NETNS, die_with_parent, in_namespace, wait_for, write_hosts

if TYPE_CHECKING:
    from tests.support.cluster.build import Cluster


@dataclass
class Node(LinkFaults):
    """One namespace: a host name, an address, a hosts file, processes, and link faults."""

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

    # processes -------------------------------------------------------------------------------

    def command(self, argv: Sequence[str], *, clock_offset_s: float | None = None) -> list[str]:
        """argv wrapped to run in this namespace with this node's host name.

        With ``clock_offset_s``, under `faketime_argv`: its wall clock shifted by that many
        seconds, its monotonic clocks not.
        """
        if clock_offset_s is not None:
            argv = faketime_argv(clock_offset_s, argv)
        return in_namespace(self.ns, self.name, argv)

    @property
    def tmpdir(self) -> Path:
        """This node's processes' TMPDIR, inside the cluster's directory."""
        return self.cluster.workdir / f"{self.name}.tmp"

    def environ(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """A child's environment: the base one, TMPDIR in the cluster's directory, the session
        secret (Cluster.secret_environ), then ``env``.

        torchrun leaves a log directory in TMPDIR at every start; in /tmp they piled up.
        """
        self.tmpdir.mkdir(exist_ok=True)
        full_env = base_environ()
        full_env["TMPDIR"] = str(self.tmpdir)
        full_env.update(self.cluster.secret_environ())
        full_env.update(env or {})
        return full_env

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
        full_env = self.environ(env)
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
        return commands.run(
            self.command(argv, clock_offset_s=clock_offset_s),
            env=self.environ(env),
            timeout_s=timeout_s,
            check=check,
            new_session=True,
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
