"""Build and validate TF_CONFIG by TensorFlow's own rules, naming the JSON path at fault.

The rules follow TensorFlow's readers of TF_CONFIG:

* ``tensorflow/python/distribute/cluster_resolver/tfconfig_cluster_resolver.py``
  reads ``cluster`` (job name -> task addresses) and ``task`` (``type``, ``index``);
* ``tensorflow/python/distribute/multi_worker_util.py`` ``_validate_cluster_spec``
  allows only the jobs chief, worker, ps and evaluator, at most one chief and one
  evaluator, requires the task type in the cluster unless it is the evaluator, and
  requires ``task_id < len(cluster[task_type])``.

rallypoint is stricter where TensorFlow fails late or silently: a negative index
(Python indexing wraps it to another task), a bool index (``int(True)`` is 1),
unbracketed IPv6 hosts, malformed ports, repeated addresses and repeated keys are
all rejected before anything is served.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence

from rallypoint.core import names
from rallypoint.errors import ConfigError, TFConfigError

#: Job names TensorFlow's distribution strategies understand (multi_worker_util).
JOBS = ("chief", "worker", "ps", "evaluator")

# Top-level keys TFConfigClusterResolver reads as strings besides cluster and task.
_STRING_KEYS = ("rpc_layer", "environment", "session_master")

_DIGITS = re.compile(r"[0-9]{1,5}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_SHOWN = 80


def format_address(host: str, port: int) -> str:
    """Return ``host:port`` with an IPv6 host in brackets, as gRPC and TensorFlow expect."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def build(addresses: Sequence[str], rank: int, layout: str) -> dict[str, object]:
    """Return the TF_CONFIG for node ``rank`` of ``addresses`` (node-rank order) in ``layout``.

    Layouts: ``workers`` (every node a worker, index = node rank); ``chief`` (rank 0
    is the chief, the others workers with index rank-1); ``ps:N`` (rank 0 is the
    chief, the coordinator TensorFlow's ParameterServerStrategy needs, the last N
    nodes are parameter servers, the rest workers); ``evaluator`` (the last node
    is the evaluator, kept out of the cluster, the others workers).
    """
    nnodes = len(addresses)
    if nnodes < 1:
        raise ConfigError("TF_CONFIG needs at least one node address; the cluster is empty")
    if not 0 <= rank < nnodes:
        raise ConfigError(f"node rank {rank} is out of range for {nnodes} nodes")
    kind, nps = parse_layout(layout)
    nodes = list(addresses)
    cluster: dict[str, list[str]]
    if kind == "workers":
        cluster, task = {"worker": nodes}, ("worker", rank)
    elif kind == "chief":
        cluster = {"chief": nodes[:1]}
        if nnodes > 1:
            cluster["worker"] = nodes[1:]
        task = ("chief", 0) if rank == 0 else ("worker", rank - 1)
    elif kind == "evaluator":
        if nnodes < 2:
            raise ConfigError(
                f"TF layout 'evaluator' needs at least 2 nodes (workers plus the evaluator), "
                f"got {nnodes}; use layout 'workers'"
            )
        cluster = {"worker": nodes[:-1]}
        task = ("evaluator", 0) if rank == nnodes - 1 else ("worker", rank)
    else:
        if nnodes < nps + 2:
            raise ConfigError(
                f"TF layout 'ps:{nps}' needs at least {nps + 2} nodes (a chief, a worker and "
                f"{nps} parameter servers), got {nnodes}; lower N or add nodes"
            )
        first_ps = nnodes - nps
        cluster = {"chief": nodes[:1], "worker": nodes[1:first_ps], "ps": nodes[first_ps:]}
        if rank == 0:
            task = ("chief", 0)
        elif rank < first_ps:
            task = ("worker", rank - 1)
        else:
            task = ("ps", rank - first_ps)
    return {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}


def parse_layout(layout: str) -> tuple[str, int]:
    """Return (kind, parameter-server count) for a layout string; ConfigError when unknown."""
    if layout in ("workers", "chief", "evaluator"):
        return layout, 0
    kind, sep, count = layout.partition(":")
    if kind == "ps" and sep and re.fullmatch(r"[1-9][0-9]{0,3}", count):
        return "ps", int(count)
    raise ConfigError(
        f"TF layout {_show(layout)} is unknown: use one of workers, chief, evaluator, "
        "or ps:N with N >= 1 parameter servers"
    )


def dumps(tf_config: Mapping[str, object]) -> str:
    """Serialize a TF_CONFIG compactly, keys in the order given (cluster, then task)."""
    return json.dumps(tf_config, separators=(",", ":"))


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def validate(tf_config: str | Mapping[str, object]) -> dict[str, object]:
    """Return TF_CONFIG as a dict if TensorFlow would accept it; TFConfigError otherwise."""
    if isinstance(tf_config, str):
        text = tf_config
    else:
        try:
            text = json.dumps(tf_config)
        except (TypeError, ValueError, RecursionError) as exc:
            raise TFConfigError(f"TF_CONFIG is not JSON-serializable ({exc})") from exc
    try:
        parsed: object = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise TFConfigError(
            f"TF_CONFIG: key {_show(exc.key)} appears twice in one object; keep one"
        ) from exc
    except RecursionError as exc:
        raise TFConfigError("TF_CONFIG is nested too deeply to be a TF_CONFIG") from exc
    except ValueError as exc:
        raise TFConfigError(
            f"TF_CONFIG is not valid JSON ({exc}); write a JSON object with cluster and task"
        ) from exc
    if not isinstance(parsed, dict):
        raise TFConfigError(
            f"TF_CONFIG must be a JSON object with cluster and task, got {_kind(parsed)}"
        )
    for key in _STRING_KEYS:
        if key in parsed and not isinstance(parsed[key], str):
            raise TFConfigError(f"TF_CONFIG.{key} must be a string, got {_kind(parsed[key])}")
    cluster = _validate_cluster(parsed.get("cluster"), "cluster" in parsed)
    _validate_task(parsed.get("task"), "task" in parsed, cluster)
    return parsed


def _validate_cluster(value: object, present: bool) -> dict[str, list[str]]:
    if not present:
        raise TFConfigError('TF_CONFIG.cluster is missing: add {"worker": ["host:port", ...]}')
    if not isinstance(value, dict):
        raise TFConfigError(
            f"TF_CONFIG.cluster must be an object of job name -> address list, got {_kind(value)}"
        )
    seen: dict[tuple[str, int], str] = {}
    cluster: dict[str, list[str]] = {}
    for job, tasks in value.items():
        path = _path("TF_CONFIG.cluster", job)
        if job not in JOBS:
            raise TFConfigError(
                f"{path}: job {_show(job)} is not one of chief, worker, ps, evaluator; rename it"
            )
        if not isinstance(tasks, list):
            raise TFConfigError(
                f'{path} must be a list of "host:port" addresses, got {_kind(tasks)}'
            )
        if not tasks:
            raise TFConfigError(f"{path} is empty: list at least one address or drop the job")
        if job in ("chief", "evaluator") and len(tasks) > 1:
            # multi_worker_util: "There must be at most one 'chief'/'evaluator' job."
            raise TFConfigError(
                f"{path} lists {len(tasks)} addresses; TensorFlow allows at most one {job}"
            )
        for index, address in enumerate(tasks):
            where = f"{path}[{index}]"
            key = _parse_address(address, where)
            if key in seen:
                raise TFConfigError(
                    f"{where}: address {_show(address)} repeats {seen[key]}; "
                    "every task needs its own host:port"
                )
            seen[key] = where
        cluster[job] = tasks
    return cluster


def _validate_task(value: object, present: bool, cluster: dict[str, list[str]]) -> None:
    if not present:
        raise TFConfigError('TF_CONFIG.task is missing: add {"type": "worker", "index": N}')
    if not isinstance(value, dict):
        raise TFConfigError(
            f'TF_CONFIG.task must be an object {{"type", "index"}}, got {_kind(value)}'
        )
    if "type" not in value:
        raise TFConfigError(
            "TF_CONFIG.task.type is missing: add one of chief, worker, ps, evaluator"
        )
    task_type = value["type"]
    if not isinstance(task_type, str) or task_type not in JOBS:
        raise TFConfigError(
            f"TF_CONFIG.task.type {_show(task_type)} is not one of chief, worker, ps, evaluator"
        )
    if task_type not in cluster and task_type != "evaluator":
        # multi_worker_util: "`task_type` %r not found in cluster_spec." (the
        # evaluator alone may stay outside the cluster).
        raise TFConfigError(
            f"TF_CONFIG.task.type {task_type!r} has no job in TF_CONFIG.cluster; "
            f"add TF_CONFIG.cluster.{task_type} or change the task type"
        )
    if "index" not in value:
        raise TFConfigError("TF_CONFIG.task.index is missing: add the task's integer index")
    index = value["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise TFConfigError(
            f"TF_CONFIG.task.index must be an integer, got {_kind(index)} {_show(index)}"
        )
    size = len(cluster.get(task_type, [])) or 1  # an evaluator outside the cluster is index 0
    if not 0 <= index < size:
        raise TFConfigError(
            f"TF_CONFIG.task.index {index} is out of range for {task_type} "
            f"(0..{size - 1}); use an index within the job's address list"
        )


def parse_address(address: object, where: str) -> tuple[str, int]:
    """Return (normalized host, port) for a "host:port" address, TFConfigError otherwise.

    The host is a host name, an IPv4 address or a bracketed IPv6 address (no zone id), as
    gRPC, TensorFlow and JAX's coordinator read it; ``where`` names it in the error.
    """
    return _parse_address(address, where)


def _parse_address(address: object, where: str) -> tuple[str, int]:
    """Return (normalized host, port) for a "host:port" address, TFConfigError otherwise."""
    if not isinstance(address, str):
        raise TFConfigError(f'{where} must be a "host:port" string, got {_kind(address)}')
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise TFConfigError(
            f"{where}: {_show(address)} is not host:port; write it as host:port "
            "(an IPv6 host as [addr]:port)"
        )
    if not _DIGITS.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise TFConfigError(f"{where}: port {_show(port_text)} in {_show(address)} is not 1..65535")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ip6 = ipaddress.IPv6Address(inner)
            if "%" in inner:
                raise ValueError(inner)
        except ValueError:
            raise TFConfigError(f"{where}: {_show(host)} is not a bracketed IPv6 address") from None
        return ip6.compressed.lower(), int(port_text)
    problem = names.host_problem(host, ip=True)
    if ":" in host and problem is not None:
        raise TFConfigError(
            f"{where}: {_show(address)} is not host:port (no scheme, one colon); write it as "
            "host:port, an IPv6 host as [addr]:port"
        )
    if ":" in host:
        raise TFConfigError(
            f"{where}: IPv6 host in {_show(address)} must be in brackets, e.g. [{host}]:{port_text}"
        )
    if problem is not None:
        raise TFConfigError(
            f"{where}: host {_show(host)} is neither a valid host name (RFC 1123) nor an IP address"
        )
    return host.lower(), int(port_text)


def _path(base: str, key: str) -> str:
    return f"{base}.{key}" if _IDENT.fullmatch(key) else f"{base}[{json.dumps(key)}]"


def _show(value: object) -> str:
    """A short, one-line rendering of a value for an error message."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
