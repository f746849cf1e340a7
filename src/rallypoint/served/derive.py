"""Derive the served environment from the spec and the cluster document, user values first.

Which keys belong to which framework (``DeriveOptions.frameworks``):

* always: NNODES, NODE_RANK, RALLYPOINT_GENERATION, and with --emit-ifname
  NCCL_SOCKET_IFNAME when an interface is known (NCCL carries both torch's and
  TensorFlow's collectives, but picks its own interface and prefers InfiniBand);
* torch: MASTER_ADDR, MASTER_PORT, the PET_* defaults torchrun reads, WORLD_SIZE,
  RANK, WORLD_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE (the last four only with one
  process per node: otherwise torchrun sets them per process) and GLOO_SOCKET_IFNAME
  (by default: the interface that routes to the master, docs/loopback.md);
* tf: TF_CONFIG;
* jax: JAX_COORDINATOR_ADDRESS (the master's host and the coordinator port its sidecar
  holds), JAX_NUM_PROCESSES, JAX_PROCESS_ID (only with one process per node) and, on the
  master only, JAX_COORDINATOR_BIND_ADDRESS (``[::]:port``, every interface). JAX itself
  reads the two addresses; the count and the id go to ``jax.distributed.initialize``.

User values (environment or ``--set``) win, one fact at a time: MASTER_ADDR and
PET_MASTER_ADDR, MASTER_PORT and PET_MASTER_PORT, NNODES and PET_NNODES, and
NODE_RANK, PET_NODE_RANK, RANK and WORLD_RANK (one process per node) each name one
fact; a user value for one name serves all of them, and two names of one fact that
disagree are an OverrideError. WORLD_SIZE follows NNODES x nproc-per-node, and so does
JAX_NUM_PROCESSES; JAX_PROCESS_ID names the node rank with one process per node. The host
of JAX_COORDINATOR_ADDRESS follows MASTER_ADDR; its port is the coordinator's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from rallypoint.errors import ConfigError, OverrideError, TFConfigError
from rallypoint.model import (
    DEFAULT_JAX_PORT,
    FRAMEWORKS,
    ClusterDoc,
    ClusterSpec,
    DeriveOptions,
    Env,
    Override,
    OverrideSource,
    master_ports,
)
from rallypoint.served import overrides, tfconfig

#: Every variable that may ever be served, in the order it is served.
CONTRACT_KEYS: tuple[str, ...] = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NODE_RANK",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NPROC_PER_NODE",
    "WORLD_SIZE",
    "RANK",
    "WORLD_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "TF_CONFIG",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_BIND_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "RALLYPOINT_GENERATION",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)

#: The framework each key belongs to; None means served whatever the frameworks.
FRAMEWORK_OF: Mapping[str, str | None] = {
    "MASTER_ADDR": "torch",
    "MASTER_PORT": "torch",
    "NNODES": None,
    "NODE_RANK": None,
    "PET_NNODES": "torch",
    "PET_NODE_RANK": "torch",
    "PET_MASTER_ADDR": "torch",
    "PET_MASTER_PORT": "torch",
    "PET_NPROC_PER_NODE": "torch",
    "WORLD_SIZE": "torch",
    "RANK": "torch",
    "WORLD_RANK": "torch",
    "LOCAL_RANK": "torch",
    "LOCAL_WORLD_SIZE": "torch",
    "TF_CONFIG": "tf",
    "JAX_COORDINATOR_ADDRESS": "jax",
    "JAX_COORDINATOR_BIND_ADDRESS": "jax",
    "JAX_NUM_PROCESSES": "jax",
    "JAX_PROCESS_ID": "jax",
    "RALLYPOINT_GENERATION": None,
    "GLOO_SOCKET_IFNAME": "torch",
    "NCCL_SOCKET_IFNAME": None,
}

#: Served as RALLYPOINT_GENERATION by `rallypoint derive`: no rendezvous happened.
OFFLINE_GENERATION = "offline"

#: The coordinator listens on every interface: on a host with several NICs a bind to the
#: address its name resolves to may pick one that peers cannot reach. gRPC reads "[::]" as
#: the wildcard and falls back to 0.0.0.0 where IPv6 is off.
JAX_BIND_HOST = "::"


def user_values(
    environ: Mapping[str, str], sets: Sequence[tuple[str, str]]
) -> dict[str, tuple[str, OverrideSource]]:
    """Return the contract variables the user set: environment first, then --set (last wins).

    Blank environment values count as unset; any other key of the environment is
    ignored, while a --set of a key outside the contract is an OverrideError.
    """
    found: dict[str, tuple[str, OverrideSource]] = {}
    for key in CONTRACT_KEYS:
        value = environ.get(key)
        if value is not None and value.strip():
            found[key] = (value, "environment")
    for key, value in sets:
        if key not in CONTRACT_KEYS:
            raise OverrideError(
                f"--set {overrides.show(key)}: not a variable rallypoint serves (nothing "
                f"outside the contract is served); use one of {', '.join(CONTRACT_KEYS)}"
            )
        found[key] = (value, "--set")
    return found


def check_values(user: Mapping[str, tuple[str, OverrideSource]]) -> None:
    """OverrideError for the first user value that is malformed on its own (no layout needed).

    `serve` calls it before anything listens: such a value could never be served.
    """
    for key, (value, source) in user.items():
        overrides.check_value(key, value, source)


class _Facts(NamedTuple):
    """The node count, node rank and processes per node served (nproc None: a word, as auto)."""

    nnodes: int
    node_rank: int
    nproc: int | None


def derive(spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions) -> Env:
    """Return the env for this node; doc None means offline (preferred ports, not reserved)."""
    _check_inputs(spec, doc, options)
    user = options.user
    derived, jax_port = _derived(spec, doc, options)
    check_values(user)
    served = {key for key in user if _framework_on(key, options.frameworks)}
    warnings = _unserved_warnings(user, served)
    mine = {key: value for key, value in user.items() if key in served}
    facts = _facts(spec, mine, options.nproc_per_node)
    values = _apply_user(derived, mine, facts, jax_port)
    overrides.check_consistency(mine, values, facts.nnodes, facts.node_rank, facts.nproc)
    ordered = tuple(
        (key, values[key])
        for key in CONTRACT_KEYS
        if key in values and _framework_on(key, options.frameworks)
    )
    return Env(
        values=ordered,
        overrides=_overridden(mine, derived),
        warnings=warnings,
        reserved=doc is not None,
    )


def _derived(
    spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions
) -> tuple[dict[str, str], int | None]:
    """What rallypoint itself would serve, before any user value, and the JAX coordinator port."""
    master_addr = options.master_ip or (doc.master_host if doc else spec.master)
    derived = _base_values(spec, doc, options, master_addr)
    jax_port: int | None = None
    if "jax" in options.frameworks:
        required = "JAX_COORDINATOR_ADDRESS" not in options.user
        jax_values, jax_port = _jax_values(spec, doc, options, master_addr, required=required)
        derived.update(jax_values)
    if "tf" in options.frameworks:
        tf_derived = _tf_config(spec, doc, options, required="TF_CONFIG" not in options.user)
        if tf_derived is not None:
            derived["TF_CONFIG"] = tf_derived
    return derived, jax_port


def _base_values(
    spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions, master_addr: str
) -> dict[str, str]:
    """The master, the node counts and ranks, the generation and the interfaces."""
    nproc = options.nproc_per_node
    master_port = _master_port(spec, doc, options)
    values: dict[str, str] = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "NNODES": str(spec.nnodes),
        "NODE_RANK": str(spec.rank),
        "PET_NNODES": str(spec.nnodes),
        "PET_NODE_RANK": str(spec.rank),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        "PET_NPROC_PER_NODE": str(nproc),
        "WORLD_SIZE": str(spec.nnodes * nproc),
        "RALLYPOINT_GENERATION": doc.generation if doc else OFFLINE_GENERATION,
    }
    if nproc == 1:
        values.update(RANK=str(spec.rank), WORLD_RANK=str(spec.rank))
        values.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    if options.ifname:
        values["GLOO_SOCKET_IFNAME"] = options.ifname
        if options.nccl_ifname:
            values["NCCL_SOCKET_IFNAME"] = options.ifname
    return values


def _jax_values(
    spec: ClusterSpec,
    doc: ClusterDoc | None,
    options: DeriveOptions,
    master_addr: str,
    *,
    required: bool,
) -> tuple[dict[str, str], int | None]:
    """JAX's variables and the coordinator port (None: the user's address is served)."""
    nproc = options.nproc_per_node
    jax_port = _jax_port(doc, options, required=required)
    values = {"JAX_NUM_PROCESSES": str(spec.nnodes * nproc)}
    if jax_port is not None:
        values["JAX_COORDINATOR_ADDRESS"] = tfconfig.format_address(master_addr, jax_port)
        if spec.is_master:
            values["JAX_COORDINATOR_BIND_ADDRESS"] = tfconfig.format_address(
                JAX_BIND_HOST, jax_port
            )
    if nproc == 1:
        values["JAX_PROCESS_ID"] = str(spec.rank)
    return values, jax_port


def _unserved_warnings(
    user: Mapping[str, tuple[str, OverrideSource]], served: set[str]
) -> tuple[str, ...]:
    """One warning per user value whose framework is not served, in contract order."""
    return tuple(
        f"{key} set in {overrides.where(user[key][1])} is not served: it belongs to "
        f"{FRAMEWORK_OF[key]}, which is not among the served frameworks"
        for key in sorted(set(user) - served, key=CONTRACT_KEYS.index)
    )


def _facts(
    spec: ClusterSpec, mine: Mapping[str, tuple[str, OverrideSource]], nproc_default: int
) -> _Facts:
    """The user's node count, node rank and processes per node, else the spec's and option's."""
    nproc = overrides.nproc(mine, nproc_default)
    nnodes_text = overrides.agree(mine, ("NNODES", "PET_NNODES"), numeric=True)
    nnodes = int(nnodes_text) if nnodes_text is not None else spec.nnodes
    one_proc_ranks = ("RANK", "WORLD_RANK", "JAX_PROCESS_ID")
    rank_keys = ("NODE_RANK", "PET_NODE_RANK") + (one_proc_ranks if nproc == 1 else ())
    rank_text = overrides.agree(mine, rank_keys, numeric=True)
    node_rank = int(rank_text) if rank_text is not None else spec.rank
    return _Facts(nnodes, node_rank, nproc)


def _apply_user(
    derived: Mapping[str, str],
    mine: Mapping[str, tuple[str, OverrideSource]],
    facts: _Facts,
    jax_port: int | None,
) -> dict[str, str]:
    """Every value follows the user's facts; a key the user set serves their own spelling."""
    values = dict(derived)
    addr_text = overrides.agree(mine, ("MASTER_ADDR", "PET_MASTER_ADDR"), numeric=False)
    port_text = overrides.agree(mine, ("MASTER_PORT", "PET_MASTER_PORT"), numeric=True)
    if addr_text is not None:
        values.update(MASTER_ADDR=addr_text, PET_MASTER_ADDR=addr_text)
        if jax_port is not None:
            values["JAX_COORDINATOR_ADDRESS"] = tfconfig.format_address(addr_text, jax_port)
    if port_text is not None:
        values.update(MASTER_PORT=str(int(port_text)), PET_MASTER_PORT=str(int(port_text)))
    nnodes, node_rank, nproc = facts
    values.update(NNODES=str(nnodes), PET_NNODES=str(nnodes))
    values.update(NODE_RANK=str(node_rank), PET_NODE_RANK=str(node_rank))
    for key in ("WORLD_SIZE", "JAX_NUM_PROCESSES", *overrides.PER_PROCESS_KEYS):
        values.pop(key, None)
    if nproc is not None:
        values.update(PET_NPROC_PER_NODE=str(nproc), WORLD_SIZE=str(nnodes * nproc))
        values["JAX_NUM_PROCESSES"] = str(nnodes * nproc)
    if nproc == 1:
        values.update(RANK=str(node_rank), WORLD_RANK=str(node_rank))
        values.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", JAX_PROCESS_ID=str(node_rank))
    values.update({key: value for key, (value, _source) in mine.items()})
    return values


def _overridden(
    mine: Mapping[str, tuple[str, OverrideSource]], derived: Mapping[str, str]
) -> tuple[Override, ...]:
    """Each served user value against what rallypoint would have served, in contract order."""
    return tuple(
        Override(key, value, derived.get(key), source)
        for key, (value, source) in sorted(
            mine.items(), key=lambda item: CONTRACT_KEYS.index(item[0])
        )
    )


def _check_inputs(spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions) -> None:
    unknown = set(options.frameworks) - FRAMEWORKS
    if unknown:
        raise ConfigError(
            f"unknown framework(s) {', '.join(sorted(unknown))}: use any of "
            f"{', '.join(sorted(FRAMEWORKS))}"
        )
    if options.nproc_per_node < 1:
        raise ConfigError(f"nproc-per-node {options.nproc_per_node} must be at least 1")
    if not spec.hosts:
        raise ConfigError(
            f"the {spec.provider} provider has no host list yet (nodes are discovered at run "
            "time); run `rallypoint serve` to learn it"
        )
    if spec.nnodes != len(spec.hosts) or not 0 <= spec.rank < spec.nnodes:
        raise ConfigError(
            f"cluster spec is inconsistent: {len(spec.hosts)} hosts, nnodes {spec.nnodes}, "
            f"rank {spec.rank}"
        )
    if doc is not None:
        ranks = sorted(member.rank for member in doc.members)
        if ranks != list(range(spec.nnodes)):
            raise ConfigError(
                f"cluster document {doc.generation!r} lists ranks {ranks[:8]} but the spec "
                f"has {spec.nnodes} nodes; every rank 0..{spec.nnodes - 1} must appear once"
            )
    for key in options.user:
        if key not in CONTRACT_KEYS:
            raise OverrideError(
                f"{overrides.show(key)} is not a contract variable and is never served"
            )


def _master_port(spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions) -> int:
    if doc is not None:
        return doc.master_port
    return master_ports(options.master_port, spec.preferred_port)[0]


def _jax_port(doc: ClusterDoc | None, options: DeriveOptions, *, required: bool) -> int | None:
    """The coordinator port: the master's held one, offline the preferred one.

    None when the master reported none and the user set JAX_COORDINATOR_ADDRESS (then the
    user's address is served); ConfigError when it is required and missing.
    """
    if doc is None:
        return options.jax_port or DEFAULT_JAX_PORT
    port = doc.members[0].jax_port
    if port is None and required:
        raise ConfigError(
            f"the master {doc.master_host} reported no JAX coordinator port; every sidecar "
            "must serve JAX (RALLYPOINT_FRAMEWORKS includes jax on every node)"
        )
    return port


def _tf_config(
    spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions, *, required: bool
) -> str | None:
    """The derived TF_CONFIG; when the user set one (not required), failures give None."""
    try:
        if doc is None:
            addresses = [tfconfig.format_address(host, options.tf_port) for host in spec.hosts]
        else:
            addresses = []
            for member in sorted(doc.members, key=lambda m: m.rank):
                if member.tf_port is None:
                    raise TFConfigError(
                        f"node rank {member.rank} ({member.host}) reported no TF worker port; "
                        "every sidecar must serve TF (RALLYPOINT_FRAMEWORKS includes tf)"
                    )
                addresses.append(tfconfig.format_address(member.host, member.tf_port))
        built = tfconfig.build(addresses, spec.rank, options.tf_layout)
        tfconfig.validate(built)
    except ConfigError:
        if required:
            raise
        return None
    return tfconfig.dumps(built)


def _framework_on(key: str, frameworks: frozenset[str]) -> bool:
    framework = FRAMEWORK_OF[key]
    return framework is None or framework in frameworks
