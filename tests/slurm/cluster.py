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
cluster's work directory, so a fresh cluster starts from empty state and never touches a
Slurm installed on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import netns
from tests.support.netns import sh, wait_for

SUBNET = "10.214.0"
CONTROLLER = "head"
#: Compute nodes, in Slurm's order; ``gpu[07-09]`` is what SLURM_JOB_NODELIST shows.
NODES = ("gpu07", "gpu08", "gpu09")
NODELIST = "gpu[07-09]"
PARTITION = "gpu"
#: Every host's interface on the bridge (what GLOO_SOCKET_IFNAME should name).
IFNAME = netns.IFNAME
#: Which tag belongs to which live run (and its munged), so the sweeper spares live runs.
OWNERS_DIR = Path("/run/rallypoint-slurm")
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "sinfo")
#: The iptables rules of a host that vanished: nothing in, nothing out.
DROP_ALL = (("INPUT", "-j", "DROP"), ("OUTPUT", "-j", "DROP"))
#: Terminal job states (squeue/scontrol names).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
    }
)  # fmt: skip
_TAG_RE = re.compile(r"^(rps\d{1,3})(?:-|br$|[vp]\d)")


def run_tag() -> str:
    """This process's resource prefix: ``rps`` and the pid modulo 1000."""
    return f"rps{os.getpid() % 1000}"


def prerequisites() -> str | None:
    """Why a Slurm cluster cannot run here, or None when it can."""
    return netns.prerequisites(
        f"{run_tag()}-probe", DAEMONS, root_for="Slurm daemons in network namespaces"
    )


def base_environ() -> dict[str, str]:
    """The few variables a daemon or client needs; nothing else of the caller's leaks in."""
    return netns.base_environ()


@dataclass(frozen=True)
class Host:
    """One namespace of the cluster: the controller or a compute node."""

    name: str
    ns: str
    address: str
    veth: str


@dataclass(frozen=True)
class Job:
    """A finished (or abandoned) batch job: what scontrol and its output file say."""

    job_id: str
    state: str
    exit_code: str
    nodes: str
    batch_host: str
    output: str
    record: Mapping[str, str] = field(default_factory=dict)

    def lines(self, prefix: str) -> list[str]:
        """The output lines that start with prefix."""
        return [line for line in self.output.splitlines() if line.startswith(prefix)]

    def describe(self) -> str:
        return (
            f"job {self.job_id}: {self.state} exit {self.exit_code} on {self.nodes}\n"
            f"--- output ---\n{self.output}"
        )


class SlurmCluster:
    """slurmctld on ``head`` and one slurmd per compute node, each in its own namespace.

    A context manager that always cleans up: daemons, namespaces, links, the iptables rule
    and the /etc/netns directories go away on close(), and atexit does the same.
    """

    def __init__(self, workdir: Path, nodes: Sequence[str] = NODES) -> None:
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
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{address}\t{name}" for name, address in (pinned or {}).items()]
        lines += [f"{host.address}\t{host.name}" for host in self.hosts.values()]
        return "\n".join(lines) + "\n"

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
        work = self.workdir
        for sub in ("state", "log", "munge", "jobs", *(f"spool/{n}" for n in self.nodes)):
            (work / sub).mkdir(parents=True, exist_ok=True)
        (work / "munge").chmod(0o700)
        key = work / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={self.hosts[name].address} CPUs=2 State=UNKNOWN"
            for name in self.nodes
        )
        self.conf.write_text(
            SLURM_CONF.format(
                work=work,
                controller=CONTROLLER,
                controller_addr=self.hosts[CONTROLLER].address,
                socket=self.munge_socket,
                nodes=nodes,
                partition=PARTITION,
                nodelist=",".join(self.nodes),
            )
        )
        # Under `ip netns exec` /sys has no cgroup hierarchy: slurmd then refuses to start
        # unless a cgroup plugin is named. v1 loads and is never used by linuxproc/task none.
        (work / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (work / "plugstack.conf").write_text("")

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of Slurm's daemons and clients: its config file, nothing else."""
        env = base_environ()
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

    # --- clients and jobs -----------------------------------------------------------------

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
        done = subprocess.run(
            self.command(CONTROLLER, argv),
            capture_output=True,
            text=True,
            env=self.environ(env),
            cwd=cwd,
            timeout=timeout_s,
            check=False,
            start_new_session=True,
        )
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {said}")
        return done

    def job_dir(self, label: str) -> Path:
        """A fresh directory for one job: its script, its files, its output."""
        self._jobs += 1
        path = self.workdir / "jobs" / f"{self._jobs:02d}-{label}"
        path.mkdir(parents=True)
        return path

    def submit(
        self,
        script: str,
        workdir: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """sbatch the script text from workdir; return the job id."""
        path = workdir / "job.sh"
        path.write_text(script)
        argv = [
            "sbatch", "--parsable", f"--chdir={workdir}",
            f"--output={workdir / 'slurm-%j.out'}", *args, str(path),
        ]  # fmt: skip
        done = self.client(argv, env=env, cwd=workdir)
        return done.stdout.strip().split(";")[0]

    def job_record(self, job_id: str) -> dict[str, str]:
        """scontrol's record of a job as a dict ({} when unknown)."""
        done = self.client(["scontrol", "--oneliner", "show", "job", job_id], check=False)
        record: dict[str, str] = {}
        for item in done.stdout.split():
            key, sep, value = item.partition("=")
            if sep and key not in record:
                record[key] = value
        return record

    def wait_job(self, job_id: str, workdir: Path, timeout_s: float) -> Job:
        """Wait until the job ends; scancel it (and report what it printed) after timeout_s."""
        deadline = time.monotonic() + timeout_s
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            record = self.job_record(job_id)
            if record.get("JobState") in FINAL_STATES:
                break
            time.sleep(0.5)
        else:
            self.client(["scancel", job_id], check=False)
            wait_for(
                lambda: self.job_record(job_id).get("JobState") in FINAL_STATES,
                timeout_s=30,
                interval_s=0.2,
                what=f"job {job_id} cancelled",
            )
            record = self.job_record(job_id)
            record["JobState"] = f"{record.get('JobState')} (cancelled after {timeout_s:g} s)"
        out = workdir / f"slurm-{job_id}.out"
        # slurmstepd may still be flushing the last lines when the state turns final.
        text = ""
        for _ in range(10):
            text = out.read_text(errors="replace") if out.exists() else ""
            if text:
                break
            time.sleep(0.2)
        return Job(
            job_id=job_id,
            state=record.get("JobState", "UNKNOWN"),
            exit_code=record.get("ExitCode", "?"),
            nodes=record.get("NodeList", "?"),
            batch_host=record.get("BatchHost", "?"),
            output=text,
            record=record,
        )

    def run_job(
        self,
        script: str,
        label: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | Path] | None = None,
        timeout_s: float = 150.0,
    ) -> Job:
        """Submit script from a fresh job directory (with files copied in) and wait for it."""
        workdir = self.job_dir(label)
        for name, content in (files or {}).items():
            if isinstance(content, Path):
                shutil.copy(content, workdir / name)
            else:
                (workdir / name).write_text(content)
        job_id = self.submit(script, workdir, args=args, env=env)
        return self.wait_job(job_id, workdir, timeout_s)

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
        done = sh(["ip", "netns", "pids", self.hosts[name].ns], check=False)
        return [int(pid) for pid in done.stdout.split() if pid.isdigit()]

    # --- a node that vanishes ---------------------------------------------------------------

    def _netfilter(self, name: str, action: str, rules: Sequence[Sequence[str]]) -> None:
        """Insert (-I) or delete (-D) iptables rules in a host's own namespace.

        A namespace has its own netfilter tables: nothing of the machine's is touched, and
        deleting the namespace deletes the rules too.
        """
        for rule in rules:
            sh(["ip", "netns", "exec", self.hosts[name].ns, "iptables", action, *rule])

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
        for pid in self.strays(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._procs[f"slurmd-{name}"].wait(timeout=10)

    def revive(self, name: str) -> None:
        """Undo `vanish`: traffic passes again and a fresh slurmd registers the node.

        With ReturnToService=2 a node that was DOWN for not responding returns to service
        when it registers; the caller waits for it (`wait_idle`).
        """
        for pid in self.strays(name):  # anything left of the job the node ran
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
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
            for pid in self.strays(host.name) if (netns.NETNS_DIR / host.ns).exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.bridge.remove_host(host.ns, host.veth)
        self.bridge.close()
        (OWNERS_DIR / f"{self.tag}.munged").unlink(missing_ok=True)
        (OWNERS_DIR / self.tag).unlink(missing_ok=True)
        RUNS.release(self)


#: slurm.conf of the test cluster. Everything lives in the work directory; SlurmUser is
#: root so that nothing needs the slurm account's permissions on it. A node that stops
#: answering is DOWN after SlurmdTimeout (plus up to a third of it between pings), and its
#: batch jobs are requeued (JobRequeue=1; the guide's script also says --requeue); a batch
#: script that exits 75, `rallypoint run`'s status for a lost node, is requeued too.
SLURM_CONF = """\
ClusterName=rallypoint
SlurmctldHost={controller}({controller_addr})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={work}/state
SlurmdSpoolDir={work}/spool/%n
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/spool/%n/slurmd.pid
SlurmctldLogFile={work}/log/slurmctld.log
SlurmdLogFile={work}/log/slurmd-%n.log
PlugStackConfig={work}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
JobRequeue=1
RequeueExit=75
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName={partition} Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP
"""


# --- lifetime: atexit and the stale-resource sweeper ------------------------------------------

RUNS = netns.Runs(OWNERS_DIR, run_tag)
close_all = RUNS.close_all


def _is_munged(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "munged"
    except OSError:
        return False


def sweep_stale() -> list[str]:
    """Delete what dead runs left (daemons, namespaces, links, rules, files); list it."""
    removed = RUNS.sweep(_TAG_RE)
    if OWNERS_DIR.is_dir():
        for entry in sorted(OWNERS_DIR.iterdir()):
            tag = entry.name.removesuffix(".munged")
            if not RUNS.stale(tag):
                continue
            if entry.name.endswith(".munged"):
                with contextlib.suppress(ValueError, OSError):
                    pid = int(entry.read_text().strip())
                    if _is_munged(pid):
                        os.kill(pid, signal.SIGKILL)
                        removed.append(f"munged {pid}")
            entry.unlink(missing_ok=True)
    return removed
