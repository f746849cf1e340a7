"""The options that build Settings as data: flags, variables, defaults and rules, written once.

click's commands (options.py) declare them; the docs and tests read them too.
"""

from __future__ import annotations

from typing import Any, Final

from rallypoint.cli import rules
from rallypoint.model import DEFAULT_MASTER_PORT
from rallypoint.settings import Settings


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: A Spec's default when it has none: click then resolves None, () or False by kind.
UNSET: Final = _Unset()


class Spec:
    """One option: what click declares, from plain fields."""

    __slots__ = (
        "decl", "default", "dest_given", "envvar", "flags", "help", "is_flag", "metavar",
        "multiple", "name", "off_flags", "rule", "show_default",
    )  # fmt: skip

    def __init__(
        self,
        decl: str,
        help: str,
        *,
        dest: str | None = None,
        envvar: str | None = None,
        rule: rules.Rule | None = None,
        default: Any = UNSET,
        multiple: bool = False,
        is_flag: bool = False,
        show_default: str | None = None,
        metavar: str | None = None,
    ) -> None:
        flag, _, off_flag = decl.partition("/")
        self.decl, self.help = decl, help
        self.name = dest or flag.lstrip("-").replace("-", "_")
        self.dest_given = dest is not None
        self.flags, self.off_flags = (flag,), ((off_flag,) if off_flag else ())
        self.envvar = envvar or "RALLYPOINT_" + flag.lstrip("-").replace("-", "_").upper()
        self.is_flag = is_flag or bool(off_flag)
        self.rule = rule if rule is not None else (rules.Bool() if self.is_flag else None)
        self.default, self.multiple = default, multiple
        self.show_default, self.metavar = show_default, metavar


_S = Settings()
_PORT = rules.Int("port", 1, 65535, "a port number: use an integer 1-65535")
#: The local and peer ports' default: one pair per Slurm job (settings.job_ports).
_JOB_PORTS = "%d; under Slurm, one pair per SLURM_JOB_ID"

LOGGING = (
    Spec("--log-format", "Log format on stderr.", rule=rules.Choice(("text", "json")),
         default="text"),
    Spec("--verbose", "Debug logs, and a traceback with errors.", is_flag=True, default=False),
)  # fmt: skip
LOCAL = (
    Spec("--local-host", "Local API addresses (repeat or comma-separate).",
         show_default="127.0.0.1,::1", dest="local_hosts", envvar="RALLYPOINT_LOCAL_HOSTS",
         multiple=True, rule=rules.Words("HOST")),
    Spec("--local-port", "Local API port.", rule=_PORT, show_default=_JOB_PORTS % _S.local_port),
)  # fmt: skip
MDNS_INTERFACES = Spec(
    "--mdns-interface", "mDNS interfaces (repeat or comma-separate).", show_default="all",
    dest="mdns_interfaces", envvar="RALLYPOINT_MDNS_INTERFACES", multiple=True,
    rule=rules.Words("IFACE"),
)  # fmt: skip
_SECONDS = rules.Seconds()

#: The session secret: the sidecar signs peer messages with it, and `run` proves it on the
#: local API's writes (docs/api.md, "Writes").
TOKEN_FILE = Spec(
    "--token-file",
    "File with the session secret (RALLYPOINT_TOKEN: the secret itself).",
    metavar="FILE",
)
#: Every option of `serve`, `derive` and `demo`, in --help order.
SETTINGS = (
    Spec("--provider", "Cluster provider.", rule=rules.Provider(), show_default="detect"),
    *LOCAL,
    Spec("--peer-host", "Peer API address.", default=_S.peer_host, metavar="HOST"),
    Spec("--peer-port", "Peer API port.", rule=_PORT, show_default=_JOB_PORTS % _S.peer_port),
    Spec("--metrics-port", "Serve GET /metrics, and nothing else, on this port for a "
         "cluster's Prometheus.", rule=_PORT, show_default="off"),
    Spec("--metrics-host", "Address of the metrics listener (with --metrics-port).",
         rule=rules.Address(), show_default=f"{_S.metrics_host} and ::"),
    Spec("--master-port", "Preferred master port (a user-set MASTER_PORT still wins).",
         # model.master_ports
         show_default=f"BACKENDAI_DIST_MASTER_PORT, else {DEFAULT_MASTER_PORT}", rule=_PORT),
    Spec("--port-range", "Where to look when a preferred port is taken.",
         rule=rules.PortRange(), default="{}-{}".format(*_S.port_range)),
    Spec("--tf-port", "Preferred TF worker port.", rule=_PORT, default=_S.tf_port),
    Spec("--jax-port", "Preferred JAX coordinator port (master; with jax in --frameworks).",
         rule=_PORT, default=_S.jax_port),
    Spec("--deadline", "Seconds for the whole rendezvous.", rule=_SECONDS,
         default=_S.deadline_s),
    Spec("--backoff-initial", "First retry delay, seconds.", rule=_SECONDS,
         default=_S.backoff_initial_s),
    Spec("--backoff-max", "Longest retry delay, seconds.", rule=_SECONDS,
         default=_S.backoff_max_s),
    Spec("--long-poll", "Seconds a cluster long-poll stays open.", rule=_SECONDS,
         default=_S.long_poll_s),
    Spec("--keepalive", "After ready, seconds between keep-alives; a peer silent for 4 is "
         "named down (0: off).", rule=rules.Seconds(allow_zero=True), default=_S.keepalive_s),
    Spec("--resolve-timeout", "Seconds for one name lookup.", rule=_SECONDS,
         default=_S.resolve_timeout_s),
    Spec("--resolve-scope", "Peer names to verify (auto: all up to 64 nodes, else a sample).",
         rule=rules.Choice(("auto", "all", "master")), default=_S.resolve_scope),
    Spec("--strict-self/--no-strict-self",
         "Own name on loopback is fatal even when GLOO_SOCKET_IFNAME is served.",
         default=_S.strict_self),
    Spec("--allow-loopback/--no-allow-loopback", "Accept peer names on loopback (one host).",
         default=_S.allow_loopback),
    Spec("--master-addr", "Serve MASTER_ADDR as the master's name or its verified address.",
         dest="master_addr_mode", rule=rules.Choice(("name", "ip")),
         default=_S.master_addr_mode),
    Spec("--emit-ifname/--no-emit-ifname",
         "Serve NCCL_SOCKET_IFNAME besides GLOO_SOCKET_IFNAME / serve neither.",
         default=_S.emit_ifname, show_default="GLOO_SOCKET_IFNAME only"),
    Spec("--probe/--no-probe", "Try every connection the job will make before turning ready.",
         default=_S.probe),
    Spec("--probe-timeout", "Seconds for one connection probe.", rule=_SECONDS,
         default=_S.probe_timeout_s),
    Spec("--throughput/--no-throughput",
         "Measure throughput, retransmits and RTT on a ring of links (the path check stays).",
         default=_S.throughput),
    Spec("--min-link-mbps", "A measured link slower than this fails the check (Mbit/s).",
         rule=rules.Rate(), show_default="off"),
    Spec("--frameworks", "Frameworks whose variables are served.",
         rule=rules.Words("torch,tf,jax", ("torch", "tf", "jax")), default="torch,tf"),
    Spec("--nproc-per-node", "Processes per node (WORLD_SIZE = NNODES x N).",
         rule=rules.Int("N", 1, 1 << 16, "a process count: use an integer >= 1"),
         default=_S.nproc_per_node),
    Spec("--tf-layout", "TF_CONFIG layout.", rule=rules.TFLayout(), default=_S.tf_layout),
    Spec("--set", "Override a served variable (repeat; in the variable, one per line).",
         dest="sets", rule=rules.KeyValue(), multiple=True),
    TOKEN_FILE,
    Spec("--relay-group",
         "Ranks per relay in the fan-out tree (auto: sqrt(N) from 512 nodes; 0: none).",
         dest="relay_group_size", rule=rules.RelayGroup(), default="auto"),
    Spec("--mdns/--no-mdns", "Announce and browse over mDNS.", default=_S.mdns),
    MDNS_INTERFACES,
    *LOGGING,
)  # fmt: skip
