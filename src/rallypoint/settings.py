"""The one frozen Settings value, built once in cli.py from flags and RALLYPOINT_* variables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rallypoint.model import (
    DEFAULT_FRAMEWORKS,
    DEFAULT_JAX_PORT,
    DEFAULT_LOCAL_PORT,
    DEFAULT_MASTER_PORT,
    DEFAULT_PEER_PORT,
)

Scope = Literal["auto", "all", "master"]
MasterAddrMode = Literal["name", "ip"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of the sidecar; seconds everywhere, converted only at the adapters."""

    # Which provider reads the environment; None means auto-detect.
    provider: str | None = None

    # Listeners. The local API is loopback-only unless the operator asks otherwise.
    local_hosts: tuple[str, ...] = ("127.0.0.1", "::1")
    local_port: int = DEFAULT_LOCAL_PORT
    peer_host: str = "0.0.0.0"
    peer_port: int = DEFAULT_PEER_PORT

    # Ports.
    #: Preferred master port (RALLYPOINT_MASTER_PORT); a user-set MASTER_PORT still wins.
    master_port: int | None = None
    default_master_port: int = DEFAULT_MASTER_PORT
    #: Range searched when the preferred port is taken; kept outside the ephemeral range.
    port_range: tuple[int, int] = (20000, 29999)
    #: Preferred TF worker port; when taken, the next free port in port_range.
    tf_port: int = 2222
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

    # Verification.
    resolve_scope: Scope = "auto"
    strict_self: bool = False
    allow_loopback: bool = False
    master_addr_mode: MasterAddrMode = "name"
    #: None (default): serve GLOO_SOCKET_IFNAME, the interface that routes to the master;
    #: True (--emit-ifname): NCCL_SOCKET_IFNAME too; False (--no-emit-ifname): neither.
    emit_ifname: bool | None = None

    # Connection checks (connectivity.py): every connection the job will make is tried.
    probe: bool = True
    probe_timeout_s: float = 2.0
    probe_workers: int = 64

    # What is served.
    frameworks: frozenset[str] = DEFAULT_FRAMEWORKS
    nproc_per_node: int = 1
    tf_layout: str = "workers"
    sets: tuple[tuple[str, str], ...] = ()  # --set KEY=VALUE, in order

    # Peers.
    token: str | None = field(default=None, repr=False)
    mdns: bool = True
    mdns_interfaces: tuple[str, ...] = ()  # empty: every interface with an address

    # Logging.
    log_format: Literal["text", "json"] = "text"
    verbose: bool = False
