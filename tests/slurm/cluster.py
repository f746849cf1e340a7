"""A real Slurm cluster on one machine: slurmctld and slurmd in network namespaces.

Importable without pytest. Needs root, ``ip`` (iproute2), ``unshare`` and Debian's Slurm
packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``; scripts/setup-system.sh
installs them); ``iptables`` when the host filters bridged frames (Docker hosts do).

Layout: a private bridge, and one namespace per host on it with an address in
``10.214.0.0/24`` that is never routed anywhere: the controller ``head`` (slurmctld; jobs
are submitted from there, as from a login node) and the compute nodes ``gpu07``,
``gpu08``, ``gpu09`` (one slurmd each). Every namespace has its own ``/etc/hosts``
(``/etc/netns/NS/hosts``, which ``ip netns exec`` bind-mounts), a resolver that answers
nothing, and its own host name (a UTS namespace), so the tasks of a job see what they
would see on a real cluster: ``SLURMD_NODENAME``, ``hostname`` and the hosts file agree.

All hosts share this machine's filesystem, so a job runs the same Python environment as
the tests. One ``munged`` with its own key and socket serves every namespace: its socket
is a file. Slurm's own files (slurm.conf, state, spool, logs, pid files) live in the
cluster's work directory (conf.py), so a fresh cluster starts from empty state and never
touches a Slurm installed on the machine. Batch jobs are jobs.py's, the sweeper runs.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.slurm.conf import write_config
from tests.slurm.jobs import BatchJobs
from tests.slurm.runs import OWNERS_DIR, RUNS, run_tag
from tests.support import commands, netns
from tests.support.netns import sh, wait_for

SUBNET = "10.214.0"
CONTROLLER = "head"
#: Compute nodes, in Slurm's order; ``gpu[07-09]`` is what SLURM_JOB_NODELIST shows.
NODES = ("gpu07", "gpu08", "gpu09")
NODELIST = "gpu[07-09]"
#: The iptables rules of a host that vanished: nothing in, nothing out.
DROP_ALL = (("INPUT", "-j", "DROP"), ("OUTPUT", "-j", "DROP"))


@dataclass(frozen=True)
class Host:
    """One namespace of the cluster: the controller or a compute node."""

    name: str
    ns: str
    address: str
    veth: str


class SlurmCluster(BatchJobs):
    """slurmctld on ``head`` and one slurmd per compute node, each in its own namespace.

    A context manager that always cleans up: daemons, namespaces, links, the iptables rule
    and the /etc/netns directories go away on close(), and atexit does the same.
    """

    def __init__(self, workdir: Path, nodes: Sequence[str] = NODES) -> None:
        netns.check_subnet(SUBNET)
        self.tag = run_tag()
        self.workdir = Path(workdir)
        self.bridge = netns.Bridge(f"{self.tag}br")
        names = (CONTROLLER, *nodes)
        self.hosts: dict[str, Host] = {
            name: Host(
                name=name,
                ns=f"{self.tag}-{name}",
                address=f"{SUBNET}.{10 + index}",
                veth=f"{self.tag}v{index}",
            )
            for index, name in enumerate(names)
        }
        self.nodes = tuple(nodes)
        self.conf = self.workdir / "slurm.conf"
        self.munge_socket = self.workdir / "munge" / "munge.socket"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._closed = False
        self._jobs = 0

    def __enter__(self) -> SlurmCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # --- set-up ---------------------------------------------------------------------------

    def up(self, ready_timeout_s: float = 90.0) -> None:
        """Build the network, write the configuration, start munged, slurmctld and slurmds."""
        if RUNS.is_open():
            # Resource names carry only the pid: a second cluster would reuse them.
            raise RuntimeError("one Slurm cluster per process: close the other first")
        RUNS.claim(self)
        try:
            self._network()
            self._files()
            self._start_munged()
            self._start_slurm()
            self.wait_idle(ready_timeout_s)
        except BaseException:
            self.close()
            raise

    def hosts_text(self, pinned: Mapping[str, str] | None = None) -> str:
        """The hosts file of a namespace: every host, with pinned lines first.

        glibc answers the first matching line, so a pinned ``127.0.1.1 gpu08`` line (what
        Debian's installer writes for the machine's own name) wins over the real address.
        """
        lines = [(address, name) for name, address in (pinned or {}).items()]
        lines += [(host.address, host.name) for host in self.hosts.values()]
        return netns.hosts_file(lines)

    def write_hosts(self, name: str, text: str) -> None:
        """Replace a namespace's hosts file in place (a bind mount follows the inode)."""
        netns.write_hosts(self.hosts[name].ns, text)

    def pin_own_name(self, name: str, address: str = "127.0.1.1") -> None:
        """Make a node's own name resolve to address on that node, as Debian does."""
        self.write_hosts(name, self.hosts_text({name: address}))

    def unpin_all(self) -> None:
        """Restore every namespace's hosts file."""
        for name in self.hosts:
            self.write_hosts(name, self.hosts_text())

    def _network(self) -> None:
        # The bridge's forward rule matters here too: srun's I/O comes back across it.
        self.bridge.up()
        for index, host in enumerate(self.hosts.values()):
            peer = f"{self.tag}p{index}"
            self.bridge.add_host(host.ns, host.veth, peer, [host.address], self.hosts_text())

    def _files(self) -> None:
        nodes = {name: self.hosts[name].address for name in self.nodes}
        controller = (CONTROLLER, self.hosts[CONTROLLER].address)
        write_config(self.conf, controller, nodes, self.munge_socket)

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of Slurm's daemons and clients: its config file, nothing else."""
        env = netns.base_environ()
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """argv wrapped to run on host name: its namespace and its host name."""
        return netns.in_namespace(self.hosts[name].ns, name, argv)

    def _spawn(self, label: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        log = self.workdir / "log" / f"{label}.out"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environ(),
                start_new_session=True,
                preexec_fn=netns.die_with_parent,
            )
        self._procs[label] = popen
        return popen

    def _start_munged(self) -> None:
        munge = self.workdir / "munge"
        popen = self._spawn(
            "munged",
            [
                "munged", "--foreground", "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )  # fmt: skip
        # The sweeper kills a dead run's munged: it is the one daemon outside the namespaces.
        (OWNERS_DIR / f"{self.tag}.munged").write_text(str(popen.pid))
        wait_for(
            lambda: self.munge_socket.exists() or popen.poll() is not None,
            timeout_s=30,
            interval_s=0.2,
            what="munged socket",
        )
        if popen.poll() is not None:
            raise RuntimeError(f"munged exited {popen.returncode}: {self.log('munged')}")

    def _start_slurm(self) -> None:
        self._spawn(
            "slurmctld", self.command(CONTROLLER, ["slurmctld", "-D", "-f", str(self.conf)])
        )
        for name in self.nodes:
            argv = ["slurmd", "-D", "-N", name, "-f", str(self.conf)]
            self._spawn(f"slurmd-{name}", self.command(name, argv))

    def wait_idle(self, timeout_s: float) -> None:
        """Wait until every compute node is idle in sinfo."""

        def idle() -> bool:
            for label, popen in self._procs.items():
                if popen.poll() is not None:
                    raise RuntimeError(f"{label} exited {popen.returncode}: {self.log(label)}")
            states = self.node_states()
            return len(states) == len(self.nodes) and set(states.values()) == {"idle"}

        wait_for(
            idle,
            timeout_s=timeout_s,
            interval_s=0.2,
            what="every node idle",
            describe=lambda: self.describe(),
        )

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo state ({} when slurmctld does not answer yet)."""
        done = self.client(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False)
        if done.returncode != 0:
            return {}
        states = {}
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    # --- clients (jobs.py submits batch jobs through them) ----------------------------

    def client(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
        timeout_s: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command on the controller (the login node)."""
        return commands.run(
            self.command(CONTROLLER, argv),
            env=self.environ(env),
            cwd=cwd,
            timeout_s=timeout_s,
            check=check,
            new_session=True,
        )

    # --- logs, teardown ---------------------------------------------------------------------

    def log(self, label: str, tail_lines: int = 30) -> str:
        for path in (self.workdir / "log" / f"{label}.log", self.workdir / "log" / f"{label}.out"):
            if path.exists() and path.stat().st_size:
                lines = path.read_text(errors="replace").splitlines()[-tail_lines:]
                return "\n".join(lines)
        return ""

    def describe(self) -> str:
        """sinfo, and the tail of every daemon's log, for failure reports."""
        states = self.node_states()
        chunks = [f"nodes: {states or 'slurmctld does not answer'}"]
        for label in ("slurmctld", *(f"slurmd-{n}" for n in self.nodes)):
            chunks.append(f"--- {label} ---\n{self.log(label, 15)}")
        return "\n".join(chunks)

    def strays(self, name: str) -> list[int]:
        """Pids of every process in a host's namespace."""
        return netns.namespace_pids(self.hosts[name].ns)

    # --- a node that vanishes ---------------------------------------------------------------

    def _netfilter(self, name: str, action: str, rules: Sequence[Sequence[str]]) -> None:
        """Insert (-I) or delete (-D) iptables rules in a host's own namespace.

        A namespace has its own netfilter tables: nothing of the machine's is touched, and
        deleting the namespace deletes the rules too.
        """
        inside = ["ip", "netns", "exec", self.hosts[name].ns]
        for rule in rules:
            sh([*inside, *netns.xtables("iptables", action, *rule)])

    def cut_port(self, name: str, port: int, action: str = "-I") -> None:
        """Drop every TCP packet to or from ``port`` on a host (``action="-D"`` undoes it)."""
        self._netfilter(name, action, netns.port_drop_rules(port))

    def vanish(self, name: str) -> None:
        """Make a compute node vanish as a machine that lost power does.

        Its traffic is dropped first, so no FIN or RST tells anyone: peers see silence. Then
        every process in its namespace is killed: slurmd (Slurm sees a node failure once
        SlurmdTimeout passes), slurmstepd, and the job's processes. `revive` undoes it.
        """
        self._netfilter(name, "-I", DROP_ALL)
        netns.kill_namespace(self.hosts[name].ns)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._procs[f"slurmd-{name}"].wait(timeout=10)

    def revive(self, name: str) -> None:
        """Undo `vanish`: traffic passes again and a fresh slurmd registers the node.

        With ReturnToService=2 a node that was DOWN for not responding returns to service
        when it registers; the caller waits for it (`wait_idle`).
        """
        netns.kill_namespace(self.hosts[name].ns)  # anything left of the job the node ran
        self._netfilter(name, "-D", DROP_ALL)
        argv = ["slurmd", "-D", "-N", name, "-f", str(self.conf)]
        self._spawn(f"slurmd-{name}", self.command(name, argv))

    def close(self) -> None:
        """Stop every daemon and delete everything up() created; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for popen in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
        for popen in self._procs.values():
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=5)
        for host in self.hosts.values():
            # slurmstepd and anything a job left behind outlive slurmd: they are in the
            # namespace, so this finds them all.
            if (netns.NETNS_DIR / host.ns).exists():
                netns.kill_namespace(host.ns)
            self.bridge.remove_host(host.ns, host.veth)
        self.bridge.close()
        (OWNERS_DIR / f"{self.tag}.munged").unlink(missing_ok=True)
        (OWNERS_DIR / self.tag).unlink(missing_ok=True)
        RUNS.release(self)
