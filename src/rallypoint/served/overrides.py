"""User values of contract variables: each checked on its own, then all checked together."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from rallypoint.core import names
from rallypoint.errors import OverrideError, TFConfigError
from rallypoint.model import OverrideSource
from rallypoint.served import tfconfig

#: Set per process by torchrun (or the user's launcher) when a node runs several processes.
PER_PROCESS_KEYS = ("RANK", "WORLD_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "JAX_PROCESS_ID")

# torchrun's --nproc-per-node accepts these words besides a number.
_NPROC_WORDS = frozenset({"auto", "cpu", "gpu", "xpu"})
_INT = re.compile(r"[0-9]{1,9}")
_RANGE = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")
_GENERATION = re.compile(r"[!-~]{1,128}")  # printable ASCII, no blanks
_MAX_SHOWN = 80


def user_port(text: str) -> int | None:
    """The port a user's MASTER_PORT or PET_MASTER_PORT names; None when it is not a port."""
    return int(text) if _INT.fullmatch(text) and 1 <= int(text) <= 65535 else None


def nproc(mine: Mapping[str, tuple[str, OverrideSource]], default: int) -> int | None:
    """Processes per node: the user's PET_NPROC_PER_NODE, else the option; None when a word."""
    if "PET_NPROC_PER_NODE" not in mine:
        return default
    value = mine["PET_NPROC_PER_NODE"][0]
    return int(value) if _INT.fullmatch(value) else None


def agree(
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
                f"{key}={show(value)} from {where(source)} contradicts "
                f"{chosen[0]}={show(chosen[1])} from {where(chosen[2])}; both name the same "
                "value: set one of them, or both alike"
            )
    return None if chosen is None else chosen[1]


def check_value(key: str, value: str, source: OverrideSource) -> None:
    """OverrideError when a user value is not well-formed for its key."""

    def bad(problem: str) -> OverrideError:
        return OverrideError(f"{key}={show(value)} from {where(source)} {problem}")

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
        if names.host_problem(value, ip=True) is not None:
            raise bad("is neither a host name (RFC 1123) nor an IP address (IPv6 without brackets)")
    elif key == "TF_CONFIG":
        try:
            tfconfig.validate(value)
        except TFConfigError as exc:
            raise bad(f"is not a valid TF_CONFIG: {exc}") from exc
    elif key in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS"):
        try:
            tfconfig.parse_address(value, f"{key} from {where(source)}")
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


def check_consistency(
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
                return f"{key}={show(value)} from {where(source)}"
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


def where(source: OverrideSource) -> str:
    """Where a user value came from, for messages."""
    return "the environment" if source == "environment" else "--set"


def show(value: str) -> str:
    """A value quoted for a message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
