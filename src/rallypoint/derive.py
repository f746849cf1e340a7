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

import re
from collections.abc import Callable, Mapping, Sequence

from rallypoint import tfconfig
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

#: Set per process by torchrun (or the user's launcher) when a node runs several processes.
PER_PROCESS_KEYS = ("RANK", "WORLD_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "JAX_PROCESS_ID")

#: The coordinator listens on every interface: on a host with several NICs a bind to the
#: address its name resolves to may pick one that peers cannot reach. gRPC reads "[::]" as
#: the wildcard and falls back to 0.0.0.0 where IPv6 is off.
JAX_BIND_HOST = "::"

# torchrun's --nproc-per-node accepts these words besides a number.
_NPROC_WORDS = frozenset({"auto", "cpu", "gpu", "xpu"})
_INT = re.compile(r"[0-9]{1,9}")
_RANGE = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")
_GENERATION = re.compile(r"[!-~]{1,128}")  # printable ASCII, no blanks
_MAX_SHOWN = 80


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
                f"--set {_show(key)}: not a variable rallypoint serves (nothing outside the "
                f"contract is served); use one of {', '.join(CONTRACT_KEYS)}"
            )
        found[key] = (value, "--set")
    return found


def user_port(text: str) -> int | None:
    """The port a user's MASTER_PORT or PET_MASTER_PORT names; None when it is not a port."""
    return int(text) if _INT.fullmatch(text) and 1 <= int(text) <= 65535 else None


def check_values(user: Mapping[str, tuple[str, OverrideSource]]) -> None:
    """OverrideError for the first user value that is malformed on its own (no layout needed).

    `serve` calls it before anything listens: such a value could never be served.
    """
    for key, (value, source) in user.items():
        _check_value(key, value, source)


def derive(spec: ClusterSpec, doc: ClusterDoc | None, options: DeriveOptions) -> Env:
    """Return the env for this node; doc None means offline (preferred ports, not reserved)."""
    _check_inputs(spec, doc, options)
    nproc_default = options.nproc_per_node
    frameworks = options.frameworks
    user = dict(options.user)
    for key in user:
        if key not in CONTRACT_KEYS:
            raise OverrideError(f"{_show(key)} is not a contract variable and is never served")

    # 1. What rallypoint itself would serve, before any user value.
    master_addr = options.master_ip or (doc.master_host if doc else spec.master)
    master_port = _master_port(spec, doc, options)
    derived: dict[str, str] = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "NNODES": str(spec.nnodes),
        "NODE_RANK": str(spec.rank),
        "PET_NNODES": str(spec.nnodes),
        "PET_NODE_RANK": str(spec.rank),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        "PET_NPROC_PER_NODE": str(nproc_default),
        "WORLD_SIZE": str(spec.nnodes * nproc_default),
        "RALLYPOINT_GENERATION": doc.generation if doc else OFFLINE_GENERATION,
    }
    if nproc_default == 1:
        derived.update(RANK=str(spec.rank), WORLD_RANK=str(spec.rank))
        derived.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    if options.ifname:
        derived["GLOO_SOCKET_IFNAME"] = options.ifname
        if options.nccl_ifname:
            derived["NCCL_SOCKET_IFNAME"] = options.ifname
    jax_port: int | None = None
    if "jax" in frameworks:
        jax_port = _jax_port(doc, options, required="JAX_COORDINATOR_ADDRESS" not in user)
        derived.update(JAX_NUM_PROCESSES=str(spec.nnodes * nproc_default))
        if jax_port is not None:
            derived["JAX_COORDINATOR_ADDRESS"] = tfconfig.format_address(master_addr, jax_port)
            if spec.is_master:
                derived["JAX_COORDINATOR_BIND_ADDRESS"] = tfconfig.format_address(
                    JAX_BIND_HOST, jax_port
                )
        if nproc_default == 1:
            derived["JAX_PROCESS_ID"] = str(spec.rank)
    if "tf" in frameworks:
        tf_derived = _tf_config(spec, doc, options, required="TF_CONFIG" not in user)
        if tf_derived is not None:
            derived["TF_CONFIG"] = tf_derived

    # 2. Validate every user value on its own.
    for key, (value, source) in user.items():
        _check_value(key, value, source)

    # 3. Effective facts, user values first, then everything served follows them.
    warnings: list[str] = []
    served = {key for key in user if _framework_on(key, frameworks)}
    for key in sorted(set(user) - served, key=CONTRACT_KEYS.index):
        warnings.append(
            f"{key} set in {_where(user[key][1])} is not served: it belongs to "
            f"{FRAMEWORK_OF[key]}, which is not among the served frameworks"
        )
    mine = {key: value for key, value in user.items() if key in served}
    values = dict(derived)
    nproc = _nproc(mine, nproc_default)
    nnodes_text = _agree(mine, ("NNODES", "PET_NNODES"), numeric=True)
    nnodes = int(nnodes_text) if nnodes_text is not None else spec.nnodes
    one_proc_ranks = ("RANK", "WORLD_RANK", "JAX_PROCESS_ID")
    rank_keys = ("NODE_RANK", "PET_NODE_RANK") + (one_proc_ranks if nproc == 1 else ())
    rank_text = _agree(mine, rank_keys, numeric=True)
    node_rank = int(rank_text) if rank_text is not None else spec.rank
    addr_text = _agree(mine, ("MASTER_ADDR", "PET_MASTER_ADDR"), numeric=False)
    port_text = _agree(mine, ("MASTER_PORT", "PET_MASTER_PORT"), numeric=True)
    if addr_text is not None:
        values.update(MASTER_ADDR=addr_text, PET_MASTER_ADDR=addr_text)
        if jax_port is not None:
            values["JAX_COORDINATOR_ADDRESS"] = tfconfig.format_address(addr_text, jax_port)
    if port_text is not None:
        values.update(MASTER_PORT=str(int(port_text)), PET_MASTER_PORT=str(int(port_text)))
    values.update(NNODES=str(nnodes), PET_NNODES=str(nnodes))
    values.update(NODE_RANK=str(node_rank), PET_NODE_RANK=str(node_rank))
    for key in ("WORLD_SIZE", *PER_PROCESS_KEYS):
        values.pop(key, None)
    values.pop("JAX_NUM_PROCESSES", None)
    if nproc is not None:
        values.update(PET_NPROC_PER_NODE=str(nproc), WORLD_SIZE=str(nnodes * nproc))
        values["JAX_NUM_PROCESSES"] = str(nnodes * nproc)
    if nproc == 1:
        values.update(RANK=str(node_rank), WORLD_RANK=str(node_rank))
        values.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", JAX_PROCESS_ID=str(node_rank))
    # The user's own spelling of each value they set is what is served.
    for key, (value, _source) in mine.items():
        values[key] = value

    _check_consistency(mine, values, nnodes, node_rank, nproc)

    # 4. Only keys of the served frameworks, in contract order.
    overrides = tuple(
        Override(key, value, derived.get(key), source)
        for key, (value, source) in sorted(
            mine.items(), key=lambda item: CONTRACT_KEYS.index(item[0])
        )
    )
    ordered = tuple(
        (key, values[key])
        for key in CONTRACT_KEYS
        if key in values and _framework_on(key, frameworks)
    )
    return Env(
        values=ordered, overrides=overrides, warnings=tuple(warnings), reserved=doc is not None
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


def _nproc(mine: Mapping[str, tuple[str, OverrideSource]], default: int) -> int | None:
    """Processes per node: the user's PET_NPROC_PER_NODE, else the option; None when a word."""
    if "PET_NPROC_PER_NODE" not in mine:
        return default
    value = mine["PET_NPROC_PER_NODE"][0]
    return int(value) if _INT.fullmatch(value) else None


def _agree(
    mine: Mapping[str, tuple[str, OverrideSource]], keys: Sequence[str], *, numeric: bool
) -> str | None:
    """The user's value for one fact named by several keys; OverrideError when two disagree."""
    chosen: tuple[str, str, OverrideSource] | None = None
    for key in keys:
        if key not in mine:
            continue
        value, source = mine[key]
        if key == "PET_NNODES" and _RANGE.fullmatch(value):
            continue  # an elastic MIN:MAX range is checked against NNODES later
        if chosen is None:
            chosen = (key, value, source)
            continue
        same = int(value) == int(chosen[1]) if numeric else value == chosen[1]
        if not same:
            raise OverrideError(
                f"{key}={_show(value)} from {_where(source)} contradicts "
                f"{chosen[0]}={_show(chosen[1])} from {_where(chosen[2])}; both name the same "
                "value: set one of them, or both alike"
            )
    return None if chosen is None else chosen[1]


def _check_value(key: str, value: str, source: OverrideSource) -> None:
    """OverrideError when a user value is not well-formed for its key."""

    def bad(problem: str) -> OverrideError:
        return OverrideError(f"{key}={_show(value)} from {_where(source)} {problem}")

    if key in ("MASTER_PORT", "PET_MASTER_PORT"):
        if user_port(value) is None:
            raise bad("is not a port: use an integer from 1 to 65535")
    elif key in ("NNODES", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if not _INT.fullmatch(value) or int(value) < 1:
            raise bad("is not a count: use an integer of at least 1")
    elif key in ("NODE_RANK", "PET_NODE_RANK", "RANK", "WORLD_RANK", "LOCAL_RANK"):
        if not _INT.fullmatch(value):
            raise bad("is not a rank: use an integer of at least 0")
    elif key == "PET_NNODES":
        match = _RANGE.fullmatch(value)
        if match and 1 <= int(match[1]) <= int(match[2]):
            return
        if not _INT.fullmatch(value) or int(value) < 1:
            raise bad("is not a node count: use N >= 1 or an elastic range MIN:MAX")
    elif key == "PET_NPROC_PER_NODE":
        if value in _NPROC_WORDS:
            return
        if not _INT.fullmatch(value) or int(value) < 1:
            raise bad("is not a process count: use N >= 1 or one of auto, cpu, gpu, xpu")
    elif key in ("MASTER_ADDR", "PET_MASTER_ADDR"):
        if not tfconfig.is_valid_host(value):
            raise bad("is neither a host name (RFC 1123) nor an IP address (IPv6 without brackets)")
    elif key == "TF_CONFIG":
        try:
            tfconfig.validate(value)
        except TFConfigError as exc:
            raise bad(f"is not a valid TF_CONFIG: {exc}") from exc
    elif key in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS"):
        try:
            tfconfig.parse_address(value, f"{key} from {_where(source)}")
        except TFConfigError as exc:
            raise OverrideError(str(exc)) from exc
    elif key == "JAX_NUM_PROCESSES":
        if not _INT.fullmatch(value) or int(value) < 1:
            raise bad("is not a count: use an integer of at least 1")
    elif key == "JAX_PROCESS_ID":
        if not _INT.fullmatch(value):
            raise bad("is not a process id: use an integer of at least 0")
    elif key == "RALLYPOINT_GENERATION":
        if not _GENERATION.fullmatch(value):
            raise bad("is not a generation: use 1-128 printable ASCII characters, no blanks")
    elif key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        _check_ifnames(key, value, bad)


def _check_ifnames(key: str, value: str, bad: Callable[[str], OverrideError]) -> None:
    # NCCL takes an optional "^" (exclude) and "=" (exact match) prefix before a
    # comma list; gloo takes a plain comma list.
    names = value
    if key == "NCCL_SOCKET_IFNAME":
        names = names.removeprefix("^").removeprefix("=")
    for name in names.split(","):
        if (
            not 1 <= len(name) <= 15
            or name in (".", "..")
            or any(char in name for char in "/:")
            or any(char.isspace() or not char.isprintable() for char in name)
        ):
            raise bad(
                "is not a list of interface names (1-15 characters each, no blanks, '/' or ':')"
            )


def _check_consistency(
    mine: Mapping[str, tuple[str, OverrideSource]],
    values: Mapping[str, str],
    nnodes: int,
    node_rank: int,
    nproc: int | None,
) -> None:
    """OverrideError when user values contradict each other or the node layout."""

    def culprit(*keys: str) -> str:
        for key in keys:
            if key in mine:
                value, source = mine[key]
                return f"{key}={_show(value)} from {_where(source)}"
        return f"{keys[0]}={values.get(keys[0], '?')}"

    if node_rank >= nnodes:
        at_fault = culprit("NODE_RANK", "PET_NODE_RANK", "RANK", "WORLD_RANK", "NNODES")
        raise OverrideError(
            f"{at_fault} puts node rank {node_rank} outside {nnodes} nodes; "
            f"ranks run 0..{nnodes - 1}"
        )
    pet_nnodes = mine.get("PET_NNODES", ("", "environment"))[0]
    elastic = _RANGE.fullmatch(pet_nnodes)
    if elastic and not int(elastic[1]) <= nnodes <= int(elastic[2]):
        raise OverrideError(
            f"{culprit('PET_NNODES')} does not include NNODES={nnodes}; widen the range"
        )
    per_process = [key for key in PER_PROCESS_KEYS if key in mine]
    if nproc != 1 and per_process:
        count = "several" if nproc is None else str(nproc)
        launcher = "your launcher" if per_process[0] == "JAX_PROCESS_ID" else "torchrun"
        raise OverrideError(
            f"{culprit(*per_process)} is set per process by {launcher} when a node runs "
            f"{count} processes; unset it, or run one process per node"
        )
    for key in ("WORLD_SIZE", "JAX_NUM_PROCESSES"):
        if key in mine:
            _check_world(key, mine, nnodes, nproc, culprit)
    if nproc == 1:
        if "LOCAL_WORLD_SIZE" in mine and int(mine["LOCAL_WORLD_SIZE"][0]) != 1:
            raise OverrideError(
                f"{culprit('LOCAL_WORLD_SIZE')} contradicts one process per node; set it to 1"
            )
        if "LOCAL_RANK" in mine and int(mine["LOCAL_RANK"][0]) != 0:
            raise OverrideError(
                f"{culprit('LOCAL_RANK')} is out of range for one process per node; set it to 0"
            )


def _check_world(
    key: str,
    mine: Mapping[str, tuple[str, OverrideSource]],
    nnodes: int,
    nproc: int | None,
    culprit: Callable[..., str],
) -> None:
    """OverrideError when a user's process count (WORLD_SIZE, JAX_NUM_PROCESSES) is off."""
    world = int(mine[key][0])
    if nproc is not None and world != nnodes * nproc:
        raise OverrideError(
            f"{culprit(key)} contradicts NNODES {nnodes} x nproc-per-node "
            f"{nproc} = {nnodes * nproc}; {key} counts processes, not nodes"
        )
    if nproc is None and world % nnodes:
        raise OverrideError(
            f"{culprit(key)} is not a multiple of NNODES {nnodes}; "
            f"{key} counts processes across all nodes"
        )


def _where(source: OverrideSource) -> str:
    return "the environment" if source == "environment" else "--set"


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
