"""Clusters of Linux network namespaces running real sidecars, with faults to inject.

Importable without pytest so that benchmarks can drive the same clusters; the namespaces,
the bridge and the sweeper are tests/support/netns.py's. Each node gets an address in
``10.213.0.0/24`` (assigned only inside the namespaces, never routed anywhere). Nothing
leaves the bridge: there is no default route and the resolver points at the namespace's
own loopback.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from tests.support import netns
from tests.support.cluster.layout import FAMILIES, SUBNET, SUBNET6
from tests.support.cluster.nodes import Node
from tests.support.cluster.runs import RUNS, run_tag
from tests.support.netns import IFNAME


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
        netns.check_subnet(subnet)
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
        self.nodes = {name: self._node(index, name, subnet) for index, name in enumerate(hosts)}
        self._closed = False

    def _node(self, index: int, name: str, subnet: str) -> Node:
        """The index-th node: its namespace, its veth and its addresses on the bridge."""
        v4 = f"{subnet}.{index + 10}"
        v6 = f"{SUBNET6}:{index + 10}"
        return Node(
            cluster=self,
            name=name,
            index=index,
            ns=f"{self.tag}-{Cluster._serial}-{name}",
            address=v6 if self.family == "ipv6" else v4,
            veth=f"{self.id}v{index}",
            address6=v6 if self.family == "dual" else None,
        )

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
        # Pinned lines come first: glibc answers the first matching line for a name.
        lines = [(addr, name) for name, addr in entries.items() if addr is not None]
        for node in self:
            if node.name not in entries:
                lines.extend((address, node.name) for address in node.addresses)
        return netns.hosts_file(lines)

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

    def secret_environ(self) -> dict[str, str]:
        """The session secret the sidecars were given, which every process of a node gets
        too, as a container's environment gives it: `run` proves it on its writes."""
        keys = ("RALLYPOINT_TOKEN", "RALLYPOINT_TOKEN_FILE")
        return {k: v for k, v in self.sidecar_env.items() if k in keys}

    def start_all(self, args: Sequence[str] = ()) -> None:
        """Start a sidecar on every node, in orchestrator order."""
        for node in self:
            node.start_sidecar(args)

    def wait_all_ready(self, timeout_s: float) -> dict[str, dict[str, str]]:
        """Wait until every node serves /env; return name -> env."""
        deadline = time.monotonic() + timeout_s
        return {node.name: node.wait_ready(max(0.1, deadline - time.monotonic())) for node in self}

    def ready(self, timeout_s: float) -> Cluster:
        """Start every sidecar and wait until every node serves /env; this cluster."""
        self.start_all()
        self.wait_all_ready(timeout_s)
        return self

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
