"""The one frozen Settings value, built and checked from a mapping of flag or variable values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from rallypoint.core import names
from rallypoint.errors import ConfigError
from rallypoint.model import (
    DEFAULT_FRAMEWORKS,
    DEFAULT_JAX_PORT,
    DEFAULT_LOCAL_PORT,
    DEFAULT_MASTER_PORT,
    DEFAULT_PEER_PORT,
    DEFAULT_TF_PORT,
    DeriveOptions,
    OverrideSource,
)
from rallypoint.served import tfconfig

#: Under Slurm, with neither port set, a job's sidecars take the local and peer ports
#: JOB_PORT_BASE + 2 * (SLURM_JOB_ID mod JOB_PORT_PAIRS) and the next one: two jobs that share
#: a node (no containers) then listen apart, and every step of one job, its clients included,
#: computes the same pair (docs/configuration.md, "Ports"). Below the master port range and
#: the ephemeral range; 500 pairs, so jobs collide only when their ids are 500 apart.
JOB_PORT_BASE = 17800
JOB_PORT_PAIRS = 500

Scope = Literal["auto", "all", "master"]
MasterAddrMode = Literal["name", "ip"]


class Settings(msgspec.Struct, frozen=True):
    """Every knob of the sidecar; seconds everywhere, converted only at the adapters."""

    # Which provider reads the environment; None means auto-detect.
    provider: str | None = None

    # Listeners. The local API is loopback-only unless the operator asks otherwise.
    local_hosts: tuple[str, ...] = ("127.0.0.1", "::1")
    local_port: int = DEFAULT_LOCAL_PORT
    peer_host: str = "0.0.0.0"
    peer_port: int = DEFAULT_PEER_PORT
    #: A listener of its own that serves GET /metrics and nothing else, for a cluster's
    #: Prometheus (docs/monitoring.md); None: off, /metrics stays on the local API only.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"

    # Ports.
    #: Preferred master port (RALLYPOINT_MASTER_PORT); a user-set MASTER_PORT still wins.
    master_port: int | None = None
    default_master_port: int = DEFAULT_MASTER_PORT
    #: Range searched when the preferred port is taken; kept outside the ephemeral range.
    port_range: tuple[int, int] = (20000, 29999)
    #: Preferred TF worker port; when taken, the next free port in port_range.
    tf_port: int = DEFAULT_TF_PORT
    #: Preferred JAX coordinator port (master only, with jax served); a user-set
    #: JAX_COORDINATOR_ADDRESS's port still wins.
    jax_port: int = DEFAULT_JAX_PORT

    # Deadlines and backoff.
    deadline_s: float = 300.0
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    long_poll_s: float = 30.0
    resolve_timeout_s: float = 5.0
    resolve_workers: int = 16
    shutdown_grace_s: float = 3.0
    #: After ready, a keep-alive every this many seconds; a peer silent for 4 of them is
    #: named down (rendezvous/afterready/keepalive.py). 0: no keep-alive.
    keepalive_s: float = 3.0

    # Verification.
    resolve_scope: Scope = "auto"
    strict_self: bool = False
    allow_loopback: bool = False
    master_addr_mode: MasterAddrMode = "name"
    #: None (default): serve GLOO_SOCKET_IFNAME, the interface that routes to the master;
    #: True (--emit-ifname): NCCL_SOCKET_IFNAME too; False (--no-emit-ifname): neither.
    emit_ifname: bool | None = None

    # Connection checks (rendezvous/checks/connectivity.py): every connection of the job is tried.
    probe: bool = True
    probe_timeout_s: float = 2.0
    probe_workers: int = 64
    #: Measure throughput, retransmits and RTT on a ring of links (core/links.py); the path
    #: check (full-size segments on every probed pair) runs whenever probe is on.
    throughput: bool = True
    #: Bytes each way on a measured link, and the most one transfer may take.
    throughput_bytes: int = 1024 * 1024
    throughput_budget_s: float = 5.0
    #: A measured link slower than this (Mbit/s, either way) fails the check; None: off.
    min_link_mbps: float | None = None

    # What is served.
    frameworks: frozenset[str] = DEFAULT_FRAMEWORKS
    nproc_per_node: int = 1
    tf_layout: str = "workers"
    sets: tuple[tuple[str, str], ...] = ()  # --set KEY=VALUE, in order

    # Peers.
    token: str | None = None  # a secret: left out of repr() (below)
    mdns: bool = True
    mdns_interfaces: tuple[str, ...] = ()  # empty: every interface with an address
    #: Ranks per relay in the fan-out tree (core/fanout.py): None automatic, 0 no tree.
    relay_group_size: int | None = None

    # Logging.
    log_format: Literal["text", "json"] = "text"
    verbose: bool = False

    def __repr__(self) -> str:
        # The token must never reach a log line or a traceback through a repr.
        shown = ", ".join(f"{name}={value!r}" for name, value in self.__rich_repr__())
        return f"{type(self).__name__}({shown})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.__struct_fields__ if name != "token"]

    def own_name_rules(self) -> names.OwnNameRules:
        """What judging this node's own name takes from these settings (names.judge_own)."""
        return names.OwnNameRules(
            strict_self=self.strict_self,
            emit_ifname=self.emit_ifname is not False,
            jax="jax" in self.frameworks,
        )

    def derive_options(
        self,
        user: Mapping[str, tuple[str, OverrideSource]],
        *,
        master_ip: str | None = None,
        ifname: str | None = None,
    ) -> DeriveOptions:
        """What derivation needs from these settings; offline the preferred ports are shown."""
        return DeriveOptions(
            nproc_per_node=self.nproc_per_node,
            frameworks=self.frameworks,
            tf_layout=self.tf_layout,
            master_ip=master_ip if self.master_addr_mode == "ip" else None,
            ifname=ifname,
            nccl_ifname=self.emit_ifname is True,
            user=user,
            master_port=self.master_port,  # None: the provider's preferred port, else 29500
            tf_port=self.tf_port,
            jax_port=self.jax_port,
        )


_FIELDS = frozenset(Settings.__struct_fields__)
_DEFAULTS = Settings()


def from_mapping(values: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Settings:
    """Settings from values keyed by field name (absent: the default), checked as a whole.

    ``labels`` names where a field's value came from (a flag or a RALLYPOINT_* variable),
    for messages; a field without a label is named by its flag. ConfigError names the
    values at fault and the remedy.
    """
    unknown = set(values) - _FIELDS
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    given = dict(values)
    if "local_hosts" in given:
        given["local_hosts"] = _unique(given["local_hosts"]) or _DEFAULTS.local_hosts
    if "mdns_interfaces" in given:
        given["mdns_interfaces"] = _unique(given["mdns_interfaces"])
    if "peer_host" in given:
        given["peer_host"] = (given["peer_host"] or _DEFAULTS.peer_host).strip()
    if "frameworks" in given:
        given["frameworks"] = frozenset(given["frameworks"])
    if "sets" in given:
        given["sets"] = tuple(given["sets"])
    if "tf_layout" in given:
        try:
            given["tf_layout"] = tf_layout(given["tf_layout"])
        except ConfigError as exc:
            raise ConfigError(f"{_label(labels, 'tf_layout')}: {exc}") from exc
    settings = Settings(**given)
    _check(settings, set(values), labels)
    return settings


def job_ports(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """The (local, peer) ports of the Slurm job whose environment this is; None outside one."""
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job.isascii() or not job.isdigit():
        return None
    local = JOB_PORT_BASE + 2 * (int(job) % JOB_PORT_PAIRS)
    return local, local + 1


def tf_layout(text: str) -> str:
    """A TF_CONFIG layout as Settings holds it (trimmed, lower case); ConfigError if unknown."""
    layout = text.strip().lower()
    tfconfig.parse_layout(layout)
    return layout


def _check(settings: Settings, given: set[str], labels: Mapping[str, str] | None) -> None:
    """ConfigError for values that are fine alone but not together."""
    if settings.backoff_initial_s > settings.backoff_max_s:
        raise ConfigError(
            f"{_label(labels, 'backoff_initial_s')} {settings.backoff_initial_s:g} is above "
            f"{_label(labels, 'backoff_max_s')} {settings.backoff_max_s:g}: "
            "make the first delay the smaller one"
        )
    if "peer_port" in given and settings.local_port == settings.peer_port:
        raise ConfigError(
            f"--local-port and --peer-port are both {settings.local_port}: "
            "give them different ports"
        )
    _check_metrics(settings, given, labels)


def _check_metrics(settings: Settings, given: set[str], labels: Mapping[str, str] | None) -> None:
    """ConfigError for a metrics listener that could not work as asked."""
    port = settings.metrics_port
    if port is None:
        if "metrics_host" in given:
            raise ConfigError(
                f"{_label(labels, 'metrics_host')} is set but the metrics listener is off: "
                "set --metrics-port (RALLYPOINT_METRICS_PORT) too"
            )
        return
    for other in ("local_port", "peer_port"):
        if port == getattr(settings, other):
            raise ConfigError(
                f"{_label(labels, 'metrics_port')} {port} is also "
                f"{_label(labels, other)}: give the metrics listener a port of its own"
            )


def _label(labels: Mapping[str, str] | None, name: str) -> str:
    """Where a field's value came from: its label, else its flag."""
    return (labels or {}).get(name) or "--" + name.removesuffix("_s").replace("_", "-")


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
